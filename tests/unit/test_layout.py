"""The layout the design card and the restructure promise, kept true: the
installed packages never reach into the source tree, the loadtest entries stay thin; on the
worker side, role code in its role package importing the shared engine code and never the
reverse; the proxy in wings layered with no arrow back up, one module per API; no import
cycle anywhere; and unit tests that mirror the source."""

import ast
import functools
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALLED = ["pdspec", "proxy", "prefill_worker", "decode_worker", "loadtest"]  # pyproject's packages


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
                targets.update(
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base for alias in node.names
                )
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
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and "." in node.value
            and " " not in node.value
        ):
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


def test_the_shared_engine_code_never_reaches_a_role_package():
    graph = import_graph()
    shared = [m for m in graph if in_package(m, SHARED_ENGINE)]
    assert len(shared) > 5
    assert {
        m: sorted(r for r in reachable(graph, m) if in_package(r, *ROLE_PACKAGES))
        for m in shared
        if any(in_package(r, *ROLE_PACKAGES) for r in reachable(graph, m))
    } == {}


def test_a_role_packages_engine_code_imports_only_its_own_package_and_the_shared_engine():
    graph = import_graph()
    for role in ROLE_PACKAGES:
        engine = [m for m in graph if in_package(m, f"{role}.engine")]
        assert engine, role
        allowed = (f"{role}.engine", SHARED_ENGINE, "pdspec.contract")
        wrong = {
            m: sorted(t for t in graph[m] if not in_package(t, *allowed, "pdspec", "pdspec.worker", role))
            for m in engine
        }
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


# --- The proxy's import layers (issue 40) ---------------------------------------------------
# The proxy is cut into wings, one concern each, layered so that no import arrow points back
# up: a module imports its own wing and the layers below, never a wing of its own layer nor
# one above. Every proxy module belongs to a wing (a new top-level module must say where it
# sits), no proxy module reaches pdspec.worker (the proxy runs without vLLM), and the proxy
# has no import cycle. The graph is the one above: lazy imports inside functions count.

PROXY_WINGS = {
    "app": ("proxy.app", "proxy.serve", "proxy.processes", "proxy.__main__"),  # the app factory and the entry points
    "edge": ("proxy.edge",),  # the client-facing HTTP edge (connections, passed-through endpoints)
    "flow": ("proxy.flow",),  # a request through P/D: prefill, hand-off, decode, relay
    "routing": ("proxy.routing",),  # policies, the route plan, the KV index
    "admission": ("proxy.admission",),  # queue, KV room, prefill rate
    "apis": ("proxy.apis",),  # one module per API: validation, legs, usage, stream
    "fleet": ("proxy.fleet",),  # pools, membership, health, pairing, worker info
    "upstream": ("proxy.upstream",),  # the client for the workers
    # The base every wing may use; it imports no wing.
    "base": (
        "proxy",
        "proxy.errors",
        "proxy.metrics",
        "proxy.tracing",
        "proxy.asgi",
        "proxy.auth",
        "proxy.logs",
        "proxy.loop_lag",
        "proxy.shared_metrics",
    ),
}
PROXY_LAYERS = (("app",), ("edge",), ("flow",), ("routing", "admission", "apis"), ("fleet",), ("upstream",), ("base",))


def wing_of(module: str) -> str | None:
    """The wing a proxy module belongs to (the longest prefix that names it; the bare
    `proxy` package only itself), None for one no wing names."""
    best = None
    for wing, prefixes in PROXY_WINGS.items():
        for prefix in prefixes:
            if (module == prefix or (prefix != "proxy" and module.startswith(prefix + "."))) and (
                best is None or len(prefix) > len(best[1])
            ):
                best = (wing, prefix)
    return best and best[0]


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every arrow of `graph` that breaks the proxy's layering, as `importer -> imported (why)`."""
    layer = {wing: i for i, wings in enumerate(PROXY_LAYERS) for wing in wings}
    wrong = []
    for module, targets in graph.items():
        if not in_package(module, "proxy"):
            continue
        source = wing_of(module)
        if source is None:
            wrong.append(f"{module} (in no wing)")
            continue
        for target in sorted(targets):
            if in_package(target, "pdspec.worker"):
                wrong.append(f"{module} -> {target} (the proxy imports no worker code)")
            if not in_package(target, "proxy"):
                continue
            wing = wing_of(target)
            if wing is None or wing == source:
                continue  # the first is reported as a module of its own
            if layer[wing] < layer[source]:
                wrong.append(f"{module} -> {target} (up: {source} is below {wing})")
            elif layer[wing] == layer[source]:
                wrong.append(f"{module} -> {target} (sideways: {source} and {wing} are peers)")
    return wrong


def cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    reach = {m: reachable(graph, m) for m in graph}
    return {tuple(sorted(m for m in reach[start] if start in reach[m])) for start in graph if start in reach[start]}


def test_every_proxy_module_sits_in_a_wing_and_imports_only_down():
    graph = import_graph()
    proxy = [m for m in graph if in_package(m, "proxy")]
    assert len(proxy) > 40 and {wing_of(m) for m in proxy} == set(PROXY_WINGS)
    assert layer_violations(graph) == []


def test_the_proxy_reaches_no_worker_code():
    # Not even through what it imports (pdspec.settings reads the roles' plain data). Left
    # out: `python -m proxy`, which is the pdspec CLI (`pdspec proxy`), whose other commands
    # start workers.
    graph = import_graph(named=False)
    reached = {t for m in graph if in_package(m, "proxy") and m != "proxy.__main__" for t in reachable(graph, m)}
    assert "pdspec.settings" in reached
    assert [m for m in reached if in_package(m, "pdspec.worker", "prefill_worker.engine", "decode_worker.engine")] == []


def test_no_import_cycle_anywhere():
    graph = import_graph()
    assert f"{SHARED_ENGINE}.features" in graph and "proxy.flow.disagg" in graph  # the walk saw them
    assert cycles(graph) == set()


# Each rule above fails on a graph that breaks it: the contract can say no.
PLANTED = {
    "an arrow up": ({"proxy.fleet.pool": {"proxy.routing.registry"}}, "up: fleet is below routing"),
    "an arrow up to the app": ({"proxy.flow.relay": {"proxy.flow", "proxy.app"}}, "up: flow is below app"),
    "a peer's import": ({"proxy.routing.kv_router": {"proxy.apis.api"}}, "sideways: routing and apis are peers"),
    "the base importing a wing": ({"proxy.metrics": {"proxy.upstream.client"}}, "up: base is below upstream"),
    "worker code": ({"proxy.fleet.worker_info": {"pdspec.worker.worker_info"}}, "imports no worker code"),
    "a module in no wing": ({"proxy.helpers": set()}, "in no wing"),
}


@pytest.mark.parametrize("graph, why", PLANTED.values(), ids=PLANTED.keys())
def test_the_layering_refuses_a_planted_violation(graph, why):
    (violation,) = layer_violations(graph)
    assert why in violation


def test_the_layering_lets_each_wing_import_itself_and_the_layers_below():
    allowed = {
        "proxy.app": {"proxy.edge.passthrough", "proxy.flow.disagg", "proxy.routing.registry", "proxy.metrics"},
        "proxy.flow.disagg": {
            "proxy.flow.relay",
            "proxy.routing.plan",
            "proxy.apis.api",
            "proxy.fleet.pool",
            "proxy.upstream.client",
            "proxy.errors",
            "pdspec.settings",
        },
        "proxy.routing.kv_router": {"proxy.routing.plan", "proxy.fleet.pool", "proxy.upstream.client"},
    }
    assert layer_violations(allowed) == []


def test_a_planted_cycle_is_found():
    assert cycles(
        {"proxy.flow.disagg": {"proxy.flow.relay"}, "proxy.flow.relay": {"proxy.flow.disagg"}, "proxy.errors": set()}
    ) == {("proxy.flow.disagg", "proxy.flow.relay")}


# Inside apis/: one module (or subpackage) per API, holding what differs (its validation,
# legs, usage, stream and `Api` entry), beside the modules the APIs share (the Api type,
# generic legs, validation and usage, named events, limits). An API's module imports the
# shared ones, never another API's; the only module that imports an API's is the registry
# that lists them (the rest of the proxy reaches an API through its `Api`).
API_REGISTRY = "proxy.apis.registry"


def api_modules() -> set[str]:
    """The proxy.apis modules that build an `Api` entry (a subpackage counts as one module)."""
    found = set()
    for path in python_files("proxy/apis"):
        tree = ast.parse(path.read_text())
        if any(
            isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and getattr(n.value.func, "id", None) == "Api"
            for n in tree.body
        ):
            found.add(".".join(module_name(path).split(".")[:3]))
    return found


def api_violations(graph: dict[str, set[str]], apis: set[str]) -> list[str]:
    """Every arrow of `graph` that reaches an API's module from outside it, but the registry's."""

    def api_of(module: str) -> str | None:
        return next((a for a in apis if in_package(module, a)), None)

    wrong = []
    for module, targets in graph.items():
        if not in_package(module, "proxy") or module == API_REGISTRY:
            continue
        importer = (
            ("another API" if api_of(module) else "a shared module")
            if in_package(module, "proxy.apis")
            else "the proxy outside apis"
        )
        wrong += [
            f"{module} -> {t} (an API's module, imported by {importer})"
            for t in sorted(targets)
            if api_of(t) and api_of(t) != api_of(module)
        ]
    return wrong


def test_each_api_is_one_module_that_only_the_registry_imports():
    apis = api_modules()
    assert apis == {f"proxy.apis.{name}" for name in ("completions", "chat", "responses", "messages")}
    assert api_violations(import_graph(), apis) == []
    assert apis <= import_graph()[API_REGISTRY]


API_PLANTED = {
    "another API's module": ({"proxy.apis.messages": {"proxy.apis.chat"}}, "imported by another API"),
    "a shared module": ({"proxy.apis.usage": {"proxy.apis.responses"}}, "imported by a shared module"),
    "the flow": ({"proxy.flow.relay": {"proxy.apis.responses"}}, "the proxy outside apis"),
}


@pytest.mark.parametrize("graph, why", API_PLANTED.values(), ids=API_PLANTED.keys())
def test_the_api_rule_refuses_a_planted_violation(graph, why):
    (violation,) = api_violations(graph, {"proxy.apis.chat", "proxy.apis.responses", "proxy.apis.messages"})
    assert why in violation


# Worker-side and proxy unit tests mirror the source: tests/unit/<folder>/test_<module>[_<aspect>].py
# for a module (or subpackage) of the folder's source package.
MIRRORS = {
    "worker": "pdspec/worker",
    "prefill_worker": "prefill_worker",
    "decode_worker": "decode_worker",
    "proxy": "proxy",
}


def test_unit_tests_are_named_after_a_module_of_the_source_they_mirror():
    checked, strays = 0, []
    for folder, source in MIRRORS.items():
        for test in sorted((REPO / "tests/unit" / folder).rglob("test_*.py")):
            package = REPO / source / test.parent.relative_to(REPO / "tests/unit" / folder)
            modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"} | {
                p.name for p in package.iterdir() if (p / "__init__.py").exists()
            }
            stem = test.stem.removeprefix("test_")
            checked += 1
            if not any(stem == m or stem.startswith(m + "_") for m in modules):
                strays.append(str(test.relative_to(REPO)))
    assert checked > 20 and strays == []
