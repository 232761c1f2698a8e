"""Local training text: the Python standard library's own source files.

Every Python installation ships it, so the corpus is the same on every machine with
the same Python minor version, and no download is needed.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Iterator
from pathlib import Path

# Held-out prompts of the corpus's kind (Python code the models never trained on verbatim),
# on which the local drafter is accepted: the e2e acceptance checks take the first six
# (tests/prompts.py), the engine profile tool all of them (loadtest.engine_profile).
HELD_OUT_PROMPTS = (
    'def load_settings(filename):\n    """Read the settings file and return a dict."""\n',
    "class Cache(object):\n    def __init__(self, size):\n        self.size = size\n",
    "import re\nimport os\n\n\ndef find_files(pattern, root):\n",
    "    if not isinstance(value, str):\n        raise TypeError(",
    "# The following functions handle the conversion of\n# values between the two formats.\n\n",
    "def parse_args(argv=None):\n    parser = argparse.ArgumentParser(",
    "    for key, value in sorted(items.items()):\n",
    "class Node:\n    def __init__(self, value, children=None):\n",
)


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
