"""The Kubernetes manifests as `kubectl kustomize` renders them, for the tests of deploy/k8s
(tests/unit/deploy/test_k8s_*.py) and of `pdspec plan --emit k8s`: a kustomization's
objects, an overlay's, and those of one kind by name."""

from __future__ import annotations

import shutil
import subprocess
from functools import cache
from pathlib import Path

import yaml

from tests.deploy_wiring import ROOT

K8S = ROOT / "deploy" / "k8s"


def kustomize(folder: Path) -> list[dict]:
    """The objects `kubectl kustomize folder` renders; fails naming kubectl when it is missing."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed to render kustomizations (kubectl kustomize)"
    out = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True)
    assert out.returncode == 0, f"kubectl kustomize {folder} failed:\n{out.stderr}"
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@cache
def render(overlay: str) -> list[dict]:
    """deploy/k8s/overlays/`overlay` rendered (once per session)."""
    return kustomize(K8S / "overlays" / overlay)


def objects(overlay: str, kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in render(overlay) if o["kind"] == kind}
