"""The layout the design card and the restructure promise, kept true: small modules, the
installed packages never reach into the source tree, the loadtest entries stay thin."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INSTALLED = ["pdspec", "proxy", "prefill_worker", "decode_worker", "loadtest"]  # pyproject's packages
MAX_LINES = 550


def python_files(*roots: str) -> list[Path]:
    return sorted(p for root in roots for p in (REPO / root).rglob("*.py") if "results" not in p.parts)


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_source_file_is_over_the_limit():
    long = {str(p.relative_to(REPO)): n for p in python_files(*INSTALLED, "deploy")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}  # fmt: skip
    assert not long


def test_installed_packages_do_not_import_the_source_tree():
    # tests/ and deploy/ are not in the wheel: an import of them breaks an installed pdspec.
    offending = {
        str(p.relative_to(REPO)): sorted(m for m in imported_modules(p) if m.split(".")[0] in ("tests", "deploy"))
        for p in python_files(*INSTALLED)
    }
    assert not {k: v for k, v in offending.items() if v}
    assert not [p for p in python_files(*INSTALLED) if "parents[" in p.read_text()]


def test_loadtest_entries_are_thin():
    entries = [p for p in (REPO / "loadtest").glob("*.py") if p.name != "__init__.py"]
    assert entries, "the README's commands need their entry modules"
    for entry in entries:
        imports = imported_modules(entry) - {"sys"}
        assert len(imports) == 1, entry.name
        (target,) = imports
        assert target.startswith("loadtest.") and target.endswith("." + entry.stem), entry.name
        assert (REPO / (target.replace(".", "/") + ".py")).exists()
        assert len(entry.read_text().splitlines()) <= 10, entry.name
