"""The Kubernetes manifests as `kubectl kustomize` renders them, for the tests of deploy/k8s
(tests/unit/deploy/test_k8s_*.py): an overlay's objects, and those of one kind by name."""

from __future__ import annotations

import shutil
import subprocess
from functools import cache

import yaml

from tests.deploy_wiring import ROOT

K8S = ROOT / "deploy" / "k8s"


@cache
def render(overlay: str) -> list[dict]:
    """deploy/k8s/overlays/`overlay` rendered; fails naming kubectl when it is missing."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed to render the kustomize overlays (kubectl kustomize)"
    out = subprocess.run([kubectl, "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True)
    assert out.returncode == 0, f"kubectl kustomize {overlay} failed:\n{out.stderr}"
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def objects(overlay: str, kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in render(overlay) if o["kind"] == kind}
