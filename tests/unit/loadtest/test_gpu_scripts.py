"""The GPU machine's scripts (loadtest/gpu/) cannot run here, and a device call is too
dear to find a typo in: they must at least parse, and every file of this repository
they name must exist."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = sorted((ROOT / "loadtest" / "gpu").glob("*.sh"))
# A repository path a script names: deploy/... or loadtest/..., up to a space or quote.
REPO_PATH = re.compile(r"\b(?:deploy|loadtest)/[A-Za-z0-9_./-]*[A-Za-z0-9_]")


def test_there_are_gpu_scripts():
    assert len(SCRIPTS) >= 5


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_parses(script):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_paths_the_script_names_exist(script):
    named = set(REPO_PATH.findall(script.read_text()))
    # "deploy/profiles/dummy/qwen3-8b-$x.toml": a prefix completed at run time
    missing = [p for p in named if not (ROOT / p).exists() and not list(ROOT.glob(p + "*"))]
    assert not missing, missing
