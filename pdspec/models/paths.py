"""Where the local model pair lives inside a models folder (no heavy imports)."""

from pathlib import Path


def local_target_dir(models_dir: Path) -> Path:
    return Path(models_dir) / "target"


def local_drafter_dir(models_dir: Path) -> Path:
    return Path(models_dir) / "eagle3"
