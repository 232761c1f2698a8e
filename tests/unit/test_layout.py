"""The layout the design card and the restructure promise, kept true: small modules, the
installed packages never reach into the source tree, the loadtest entries stay thin; on the
worker side, role code in its role package importing the shared engine code and never the
reverse, no import cycle, and unit tests that mirror the source."""

import ast
import functools
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


def test_benchmark_results_are_not_packaged():
    # loadtest/results/ is the repo's record of measured runs (JSON, plots, logs), not code:
    # no folder in it is a Python package, and pyproject's package search excludes it.
    assert not list((REPO / "loadtest" / "results").rglob("__init__.py"))
    assert 'exclude = ["loadtest.results*"]' in (REPO / "pyproject.toml").read_text()


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


# --- The worker side's import graph -------------------------------------------------------
# Role packages hold what only that role runs inside vLLM and import the shared engine code
# (pdspec.worker.engine), never the reverse; a role.py is plain data with no imports (the
# settings read it, and the proxy imports the settings); no module cycle. The graph counts
# every import (a lazy one inside a function too: it runs in the same process) and the
# engine code a role.py names as text (`module:function` hooks, `module.Class` scheduler),
# which pdspec's plugin and launcher import.

ROLE_PACKAGES = ("prefill_worker", "decode_worker")
SHARED_ENGINE = "pdspec.worker.engine"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def import_graph(named: bool = True) -> dict[str, set[str]]:
    """{module: the installed modules it imports}, over the installed packages. `import a.b.c`
    also runs a/__init__ and a/b/__init__: the packages count as imported too. `named`: with
    the engine code each role.py names (imported by the plugin and vLLM, not by role.py)."""
    paths = {module_name(p): p for p in python_files(*INSTALLED)}

    def known(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
                targets.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base for alias in node.names)
        if named and name.endswith(".role") and name.split(".")[0] in ROLE_PACKAGES:
            targets.update(_named_engine_code(tree))
        graph[name] = set()
        for target in targets:
            while (found := known(target)) is not None:
                if found != name:
                    graph[name].add(found)
                target = found.rpartition(".")[0]
    return graph


def _named_engine_code(tree: ast.Module) -> set[str]:
    """The modules a role.py names in its strings: `module:function` and `module.Class`."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value and " " not in node.value:
            text = node.value
            names.add(text.partition(":")[0] if ":" in text else text.rpartition(".")[0])
    return names


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in graph[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def in_package(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_no_import_cycle_outside_the_proxy():
    # The proxy's one (disagg <-> relay) belongs to its own layering (issue 40, item 1):
    # a cycle made only of proxy modules is left to that contract.
    graph = import_graph()
    assert f"{SHARED_ENGINE}.features" in graph and "prefill_worker.engine.kv_only.install" in graph  # the walk saw them
    reach = {m: reachable(graph, m) for m in graph}
    cycles = {tuple(sorted(m for m in reach[start] if start in reach[m])) for start in graph if start in reach[start]}
    assert [c for c in cycles if not all(in_package(m, "proxy") for m in c)] == []


def test_the_shared_engine_code_never_reaches_a_role_package():
    graph = import_graph()
    shared = [m for m in graph if in_package(m, SHARED_ENGINE)]
    assert len(shared) > 5
    assert {m: sorted(r for r in reachable(graph, m) if in_package(r, *ROLE_PACKAGES)) for m in shared
            if any(in_package(r, *ROLE_PACKAGES) for r in reachable(graph, m))} == {}  # fmt: skip


def test_a_role_packages_engine_code_imports_only_its_own_package_and_the_shared_engine():
    graph = import_graph()
    for role in ROLE_PACKAGES:
        engine = [m for m in graph if in_package(m, f"{role}.engine")]
        assert engine, role
        allowed = (f"{role}.engine", SHARED_ENGINE, "pdspec.contract")
        wrong = {m: sorted(t for t in graph[m] if not in_package(t, *allowed, "pdspec", "pdspec.worker", role))
                 for m in engine}  # fmt: skip
        # (the bare package names are the parents every import of a submodule runs)
        assert {m: t for m, t in wrong.items() if t} == {}, role


def test_a_role_module_is_data_that_imports_nothing():
    for role in ROLE_PACKAGES:
        tree = ast.parse((REPO / role / "role.py").read_text())
        assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))], role
    # So the settings (which the proxy imports) reach no worker code through the roles.
    settings = reachable(import_graph(named=False), "pdspec.settings")
    assert {f"{role}.role" for role in ROLE_PACKAGES} <= settings
    assert not [m for m in settings if in_package(m, "pdspec.worker", *(f"{r}.engine" for r in ROLE_PACKAGES))]


# Worker-side unit tests mirror the source: tests/unit/<folder>/test_<module>[_<aspect>].py
# for a module (or subpackage) of the folder's source package.
MIRRORS = {"worker": "pdspec/worker", "prefill_worker": "prefill_worker", "decode_worker": "decode_worker"}


def test_worker_side_tests_are_named_after_a_module_of_the_source_they_mirror():
    checked, strays = 0, []
    for folder, source in MIRRORS.items():
        for test in sorted((REPO / "tests/unit" / folder).rglob("test_*.py")):
            package = REPO / source / test.parent.relative_to(REPO / "tests/unit" / folder)
            modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"} | {
                p.name for p in package.iterdir() if (p / "__init__.py").exists()}  # fmt: skip
            stem = test.stem.removeprefix("test_")
            checked += 1
            if not any(stem == m or stem.startswith(m + "_") for m in modules):
                strays.append(str(test.relative_to(REPO)))
    assert checked > 20 and strays == []
