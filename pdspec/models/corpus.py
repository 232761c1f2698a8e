"""Local training text: the Python standard library's own source files.

Every Python installation ships it, so the corpus is the same on every machine with
the same Python minor version, and no download is needed.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Iterator
from pathlib import Path


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(max_bytes: int) -> list[Path]:
    """Sorted stdlib `.py` files (tests and vendored code excluded) up to `max_bytes`."""
    root = stdlib_root()
    skip = ("test", "tests", "idlelib", "site-packages", "lib2to3", "tkinter", "turtledemo")
    chosen: list[Path] = []
    total = 0
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if any(part in skip for part in rel[:-1]):
            continue
        size = path.stat().st_size
        if size < 2_000 or size > 200_000:
            continue
        chosen.append(path)
        total += size
        if total >= max_bytes:
            break
    return chosen


def iter_corpus_text(max_bytes: int) -> Iterator[str]:
    for path in corpus_files(max_bytes):
        yield path.read_text(encoding="utf-8", errors="replace")
