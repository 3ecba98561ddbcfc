"""The layout keeps its promises: pure cores import no I/O, no module imports another
that imports it back (directly or around a circle), and no module outgrows one idea.

Purity is decided by folder, so a new module is checked the day it is added:
- a *pure package* holds only pure modules;
- a *shell package* may do any I/O;
- a *mixed package* names its shell modules, and every other module in it must be pure.
A module is pure when it imports no I/O framework, no clock and no logging, and no rsgw
module that is not pure itself. The gRPC connection core is *sans-IO*: its HPACK
decoder uses hpack's Huffman table, so it may import hpack, and nothing else that a pure
module may not. h2 is no longer imported at all (rsgw's HTTP/2 is its own).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import rsgw

SRC = Path(rsgw.__file__).parent

PURE_PACKAGES = {"scheduling"}
SHELL_PACKAGES = {"gateway"}
#: In mixed packages ("" is the top level): the modules that do I/O.
SHELL_MODULES = {
    "": {
        "__init__",
        "__main__",
        "_cli",
        "_logging",
        "_admin",
        "_net",
        "_exposition",
        "_hot_series",
        "_process",
        "_tls",
        "_peer",
        "_shm_access",
        "_call",
    },
    "grpc": {
        "__init__",
        "_transport",
        "_server",
        "_serving",
        "_handling",
        "_client",
        "_channel_connection",
        "_typed",
        "_metering",
        "_streams",
        "_standard",
        "_intake",
    },
    "worker": {
        "_control",
        "_device",
        "_memory",
        "_metrics",
        "_requests",
        "_service",
        "_shm",
        "_stateful",
        "_worker",
    },
    "node": {"_supervisor", "_children", "_probe", "_gpus"},
    "ctl": {"__init__", "_main"},
    # Coordination's records are pure; its etcd client is its shell.
    "coordination": {"_etcd"},
    # The REST front door's routes, HTTP/1.1 framing, JSON and tensor codec are pure;
    # the door, its HTTP listener and what it does with a connection are its shell.
    "rest": {"_door", "_listener", "_connections"},
    # The simulator's devices and figures are pure; its scenarios (files, seeded random
    # arrivals), offered load (built on the capacity search), capacity search (seeded
    # random), engine (the gateway's settings parser and admission rule), traces (files,
    # log timestamps) and command line are its shell.
    "simulate": {"_cli", "_scenario", "_offered", "_capacity", "_engine", "_trace", "_day"},
}
SANS_IO = {
    "grpc/_connection.py",
    "grpc/_server_connection.py",
    "grpc/_client_connection.py",
    "grpc/_flow.py",
    "grpc/_h2.py",
    "grpc/_hpack.py",
}
#: Generated code, not ours to shape.
IGNORED_PACKAGES = {"_proto"}

FORBIDDEN = {
    "trio",
    "h2",
    "hpack",
    "hypercorn",
    "httpx",
    "socket",
    "subprocess",
    "logging",
    "prometheus_client",
    "time",
    "random",
}
SANS_IO_ALLOWED = {"hpack"}


def package_of(path: Path) -> str:
    relative = path.relative_to(SRC)
    return relative.parts[0] if len(relative.parts) > 1 else ""


def all_modules() -> Iterator[Path]:
    for path in sorted(SRC.rglob("*.py")):
        if package_of(path) not in IGNORED_PACKAGES:
            yield path


def is_pure(path: Path) -> bool:
    if str(path.relative_to(SRC)) in SANS_IO:
        return False
    package = package_of(path)
    if package in PURE_PACKAGES:
        return True
    if package in SHELL_PACKAGES:
        return False
    return path.stem not in SHELL_MODULES.get(package, set())


def imports(path: Path) -> set[str]:
    """Every absolute module name `path` imports, TYPE_CHECKING blocks and functions included."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def module_file(name: str) -> Path:
    """The source file of an `rsgw.…` module name."""
    path = SRC.joinpath(*name.split(".")[1:])
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


PURE = [str(p.relative_to(SRC)) for p in all_modules() if is_pure(p)]


def test_the_layout_has_pure_cores() -> None:
    # A guard against a rule that checks nothing (a renamed folder, say).
    assert len(PURE) >= 30
    assert {package_of(SRC / m) for m in PURE} >= {"", "scheduling", "grpc", "worker", "node"}


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_no_io(module: str) -> None:
    roots = {name.split(".")[0] for name in imports(SRC / module)}
    assert not roots & FORBIDDEN, roots & FORBIDDEN


@pytest.mark.parametrize("module", sorted(SANS_IO))
def test_sans_io_core_imports_no_io(module: str) -> None:
    roots = {name.split(".")[0] for name in imports(SRC / module)}
    assert not roots & (FORBIDDEN - SANS_IO_ALLOWED), roots & FORBIDDEN


@pytest.mark.parametrize("module", [*PURE, *sorted(SANS_IO)])
def test_cores_import_only_cores(module: str) -> None:
    # A pure module that imported a shell module would import its I/O along with it.
    # Package `__init__` files are let through: every `rsgw.…` import runs them anyway.
    allowed = {SRC / m for m in [*PURE, *SANS_IO]}
    for name in imports(SRC / module):
        if name.split(".")[0] == "rsgw" and not name.startswith("rsgw._proto"):
            path = module_file(name)
            assert path in allowed or path.name == "__init__.py", (module, name)


def test_declared_shells_exist() -> None:
    for package, stems in SHELL_MODULES.items():
        for stem in stems:
            assert (SRC / package / f"{stem}.py").is_file(), (package, stem)
    for module in SANS_IO:
        assert (SRC / module).is_file(), module


def unit_of(name: str) -> str | None:
    """The unit a module belongs to in the package graph: its subpackage, or itself."""
    parts = name.split(".")
    if parts[0] != "rsgw" or len(parts) < 2 or parts[1] in IGNORED_PACKAGES:
        return None
    if (SRC / parts[1]).is_dir():
        return parts[1]
    return parts[1] if parts[1] not in {"__init__", "__main__"} else None


def package_graph() -> dict[str, set[str]]:
    """Which unit imports which: subpackages are units, and so is each top-level module.

    The package face (`rsgw/__init__.py`, `__main__`) and the command line re-export
    and start everything, so they are left out: they sit above the graph.
    """
    graph: dict[str, set[str]] = {}
    for path in all_modules():
        name = "rsgw." + ".".join(path.relative_to(SRC).with_suffix("").parts)
        source = unit_of(name)
        if source is None or source == "_cli":
            continue
        targets = {unit_of(imported) for imported in imports(path)}
        graph.setdefault(source, set()).update(t for t in targets if t and t != source)
    return graph


def test_no_import_cycles_between_packages() -> None:
    graph = package_graph()
    visiting: list[str] = []
    done: set[str] = set()

    def visit(unit: str) -> None:
        if unit in done:
            return
        assert unit not in visiting, " -> ".join([*visiting[visiting.index(unit) :], unit])
        visiting.append(unit)
        for target in sorted(graph.get(unit, ())):
            visit(target)
        visiting.pop()
        done.add(unit)

    for unit in sorted(graph):
        visit(unit)
    assert {"gateway", "grpc", "scheduling", "node", "worker"} <= set(graph)


#: The size at which a module has stopped reading as one idea: the guidance is 500
#: lines (the project's style guide), and this test catches the drift before a module doubles.
MAX_MODULE_LINES = 600


TOOLS = SRC.parent.parent / "tools"


@pytest.mark.parametrize(
    "module",
    [
        *(f"src/rsgw/{p.relative_to(SRC)}" for p in all_modules()),
        *(f"tools/{p.relative_to(TOOLS)}" for p in sorted(TOOLS.rglob("*.py"))),
    ],
)
def test_module_stays_small(module: str) -> None:
    lines = len((SRC.parent.parent / module).read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, (
        f"{module} has {lines} lines: split it along its concepts (the guidance is 500)"
    )


def module_graph() -> dict[str, set[str]]:
    """Which rsgw module imports which (TYPE_CHECKING and function-level imports too).

    Package `__init__` files are left out: importing `rsgw.x.y` runs `rsgw.x` anyway,
    and they re-export rather than define.
    """
    names = {
        "rsgw." + ".".join(p.relative_to(SRC).with_suffix("").parts): p
        for p in all_modules()
        if p.name != "__init__.py"
    }
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.add(node.module)
                targets.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = {t for t in targets if t in names and t != name}
    return graph


def test_no_import_cycles_between_modules() -> None:
    # A type two modules share belongs in a module below both; a circle, even one made
    # only of annotation imports, means one module cannot be read without the other.
    graph = module_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while (top := stack.pop()) != module:
                component.append(top)
            if component:
                circles.append(sorted([module, *component]))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    assert not circles, circles
