"""The layout keeps its promises: pure cores import no I/O, each package imports only
the packages below it, nothing imports in a circle, and no room outgrows one idea.

Purity is decided by folder, so a new module is checked the day it is added:
- a *pure package* holds only pure modules;
- a *sans-IO package* (rsgw's HTTP/2) may import hpack, for its Huffman table, and
  nothing else that a pure module may not;
- a *shell package* may do any I/O;
- a *mixed package* names its shell modules, and every other module in it must be pure.
A module is pure when it imports no I/O framework, no clock and no logging, and no rsgw
module that is not pure itself.

The layering is a table (`MAY_IMPORT`): which packages each package may import. A
package is a folder; the modules at the top of `src/rsgw` are each their own unit.
Every import counts, those under `if TYPE_CHECKING:` and inside functions too: an
annotation is a dependency a reader follows.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import rsgw

SRC = Path(rsgw.__file__).parent
TOOLS = SRC.parent.parent / "tools"

#: Generated code, not ours to shape.
IGNORED_PACKAGES = {"_proto"}
#: What every unit may import: the generated protobuf code and the version string.
EVERYONE_MAY_IMPORT = {"_proto", "_version"}

PURE_PACKAGES = {
    "config",
    "grpc.protocol",
    "scheduling",
    "scheduling.knobs",
    "scheduling.fleet",
    "scheduling.calls",
    "scheduling.placement",
    "worker.models",
}
SANS_IO_PACKAGES = {"http2"}
SHELL_PACKAGES = {
    "runtime",
    "grpc",
    "gateway",
    "gateway.fleet",
    "gateway.calls",
    "gateway.placement",
    "gateway.observe",
}
#: In mixed packages ("" is the top of src/rsgw): the modules that do I/O.
SHELL_MODULES = {
    "": {"__init__", "__main__", "_cli", "_flags"},
    # The call's context, the peer's identity and shared memory's checks touch the OS.
    "base": {"_call", "_peer", "_shm_access"},
    "worker": {
        "_control",
        "_metrics",
        "_requests",
        "_service",
        "_shm",
        "_stateful",
        "_tracing",
        "_worker",
    },
    "worker.device": {"_device", "_memory"},
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

_SCHEDULING = {"scheduling.knobs", "scheduling.fleet", "scheduling.calls", "scheduling.placement"}
_GATEWAY_BELOW = {"base", "runtime", "config", "grpc", "grpc.protocol", *_SCHEDULING}
#: Which packages each package may import (besides itself, its own `__init__`, and
#: `EVERYONE_MAY_IMPORT`). Read bottom-up: `base` and `http2` import nothing of rsgw;
#: the gateway's rooms import the fleet and what observes it, never each other's
#: upper rooms; the wiring at the top of `gateway/` imports them all.
MAY_IMPORT: dict[str, set[str]] = {
    "base": set(),
    "http2": set(),
    "runtime": {"base"},
    "grpc.protocol": {"base", "http2"},
    "grpc": {"base", "runtime", "http2", "grpc.protocol"},
    "scheduling": set(),
    "scheduling.knobs": {"base"},
    "scheduling.fleet": {"base"},
    "scheduling.calls": {"base", "scheduling.knobs"},
    "scheduling.placement": {"base", "scheduling.knobs", "scheduling.calls"},
    "config": {"base", "scheduling.knobs", "scheduling.fleet", "scheduling.calls"},
    "coordination": {"base", "runtime", "grpc", "scheduling.placement"},
    "rest": {"base", "runtime", "grpc.protocol"},
    "worker.models": {"base"},
    "worker.device": {"base", "worker.models"},
    "worker": {
        "base",
        "runtime",
        "grpc",
        "grpc.protocol",
        "scheduling.calls",
        "scheduling.fleet",
        "worker.device",
        "worker.models",
    },
    "node": {"base", "runtime", "config", "grpc", "worker.models"},
    "ctl": {"base", "runtime", "grpc", "scheduling.knobs"},
    "simulate": {"base", "runtime", "config", *_SCHEDULING, "worker.device", "worker.models"},
    "gateway.observe": {"base", "runtime", "grpc", "grpc.protocol", "coordination", *_SCHEDULING},
    "gateway.fleet": {*_GATEWAY_BELOW, "gateway.observe"},
    "gateway.calls": {*_GATEWAY_BELOW, "gateway.fleet", "gateway.observe"},
    "gateway.placement": {*_GATEWAY_BELOW, "coordination", "gateway.fleet", "gateway.observe"},
    "gateway": {
        *_GATEWAY_BELOW,
        "http2",
        "rest",
        "coordination",
        "gateway.fleet",
        "gateway.calls",
        "gateway.placement",
        "gateway.observe",
    },
    # The top of src/rsgw: the package face, the command line and what it parses.
    "_flags": {"base", "runtime"},
    "_cli": {
        "_flags",
        "base",
        "runtime",
        "config",
        "ctl",
        "gateway",
        "node",
        "simulate",
        "worker",
        "worker.device",
        "worker.models",
    },
    "__main__": {"_cli"},
    "": {"base", "config", "gateway", "node"},
}

#: The sizes at which a part has stopped reading as one idea (the style guide's).
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 100
MAX_PACKAGE_MODULES = 15
#: The top of src/rsgw: the package face, `python -m rsgw`, the version, the command line.
MAX_ROOT_MODULES = 8


def package_of(path: Path) -> str:
    """The dotted package of a source file, relative to rsgw ("" for the top)."""
    return ".".join(path.relative_to(SRC).parent.parts)


def all_modules() -> Iterator[Path]:
    for path in sorted(SRC.rglob("*.py")):
        if path.relative_to(SRC).parts[0] not in IGNORED_PACKAGES:
            yield path


def packages() -> list[str]:
    return sorted({package_of(path) for path in all_modules()})


def is_pure(path: Path) -> bool:
    package = package_of(path)
    if package in SANS_IO_PACKAGES or package in SHELL_PACKAGES:
        return False
    if package in PURE_PACKAGES:
        return True
    return path.stem not in SHELL_MODULES.get(package, set())


def imports(path: Path) -> set[str]:
    """Every absolute module name `path` imports, TYPE_CHECKING blocks and functions included.

    `from rsgw.x import _y` counts as importing `rsgw.x._y` when that is a module.
    """
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            for alias in node.names:
                if module_file(f"{node.module}.{alias.name}").is_file():
                    names.add(f"{node.module}.{alias.name}")
    return names


def module_file(name: str) -> Path:
    """The source file of an `rsgw.…` module name."""
    path = SRC.joinpath(*name.split(".")[1:])
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def unit_of(name: str) -> str | None:
    """The unit of an `rsgw.…` module in the package graph: its package, or, at the top
    of src/rsgw, the module itself; None for what is not rsgw's own."""
    parts = name.split(".")
    if parts[0] != "rsgw" or len(parts) == 1:
        return None if parts[0] != "rsgw" else ""
    if parts[1] in IGNORED_PACKAGES or parts[1] in EVERYONE_MAY_IMPORT:
        return None
    path = SRC.joinpath(*parts[1:])
    if path.is_dir():
        return ".".join(parts[1:])
    if len(parts) == 2:
        return "" if parts[1] == "__init__" else parts[1]
    return ".".join(parts[1:-1])


def own_unit(path: Path) -> str:
    package = package_of(path)
    if package or path.stem == "__init__":
        return package
    return path.stem


PURE = [str(p.relative_to(SRC)) for p in all_modules() if is_pure(p)]
SANS_IO = [str(p.relative_to(SRC)) for p in all_modules() if package_of(p) in SANS_IO_PACKAGES]


def test_the_layout_has_pure_cores() -> None:
    # A guard against a rule that checks nothing (a renamed folder, say).
    assert len(PURE) >= 60
    assert {package_of(SRC / m) for m in PURE} >= {
        "base",
        "config",
        "grpc.protocol",
        "scheduling.calls",
        "scheduling.placement",
        "worker.models",
        "node",
    }


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_no_io(module: str) -> None:
    roots = {name.split(".")[0] for name in imports(SRC / module)}
    assert not roots & FORBIDDEN, roots & FORBIDDEN


@pytest.mark.parametrize("module", SANS_IO)
def test_sans_io_core_imports_no_io(module: str) -> None:
    roots = {name.split(".")[0] for name in imports(SRC / module)}
    assert not roots & (FORBIDDEN - SANS_IO_ALLOWED), roots & FORBIDDEN


@pytest.mark.parametrize("module", [*PURE, *SANS_IO])
def test_cores_import_only_cores(module: str) -> None:
    # A pure module that imported a shell module would import its I/O along with it.
    # Package `__init__` files are let through: every `rsgw.…` import runs them anyway.
    allowed = {SRC / m for m in [*PURE, *SANS_IO]}
    for name in imports(SRC / module):
        if name.split(".")[0] == "rsgw" and not name.startswith("rsgw._proto"):
            path = module_file(name)
            assert path in allowed or path.name == "__init__.py", (module, name)


def test_declared_packages_and_shells_exist() -> None:
    kinds = [PURE_PACKAGES, SANS_IO_PACKAGES, SHELL_PACKAGES, set(SHELL_MODULES)]
    declared = set().union(*kinds)
    assert sum(len(kind) for kind in kinds) == len(declared), "a package has two kinds"
    assert declared <= set(packages()), declared - set(packages())
    for package, stems in SHELL_MODULES.items():
        for stem in stems:
            assert (SRC.joinpath(*package.split(".")) / f"{stem}.py").is_file(), (package, stem)


def test_every_package_has_a_place_in_the_layering() -> None:
    units = set(packages()) | {p.stem for p in SRC.glob("*.py") if p.stem != "__init__"}
    placed = set(MAY_IMPORT) | (EVERYONE_MAY_IMPORT - IGNORED_PACKAGES)
    assert units == placed, (units - placed, placed - units)


def test_the_layering_itself_has_no_circle() -> None:
    assert not circles({unit: set(targets) for unit, targets in MAY_IMPORT.items()})


def package_graph() -> dict[str, dict[str, set[str]]]:
    """unit -> imported unit -> the modules of the first that import the second."""
    graph: dict[str, dict[str, set[str]]] = {}
    for path in all_modules():
        source = own_unit(path)
        edges = graph.setdefault(source, {})
        for name in imports(path):
            target = unit_of(name)
            if target is not None and target != source:
                edges.setdefault(target, set()).add(str(path.relative_to(SRC)))
    return graph


@pytest.mark.parametrize("unit", sorted(MAY_IMPORT))
def test_package_imports_only_what_the_layering_allows(unit: str) -> None:
    allowed = MAY_IMPORT[unit]
    for target, modules in package_graph().get(unit, {}).items():
        assert target in allowed, f"{sorted(modules)} import {target or 'rsgw'}"


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            if component:
                found.append(sorted([node, *component]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles_between_packages() -> None:
    graph = {unit: set(edges) for unit, edges in package_graph().items()}
    assert not circles(graph)
    assert {"gateway", "gateway.calls", "grpc", "scheduling.calls", "node", "worker"} <= set(graph)


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
    return {
        name: {t for t in imports(path) if t in names and t != name} for name, path in names.items()
    }


def test_no_import_cycles_between_modules() -> None:
    # A type two modules share belongs in a module below both; a circle, even one made
    # only of annotation imports, means one module cannot be read without the other.
    assert not circles(module_graph())


@pytest.mark.parametrize("package", packages())
def test_package_stays_small(package: str) -> None:
    folder = SRC.joinpath(*package.split("."))
    modules = [p for p in folder.glob("*.py") if p.stem != "__init__"]
    if package:
        assert len(modules) <= MAX_PACKAGE_MODULES, (
            f"{package}/ has {len(modules)} modules: split it into rooms a reader can name"
        )
    else:
        assert len(modules) + 1 <= MAX_ROOT_MODULES, [p.name for p in modules]


@pytest.mark.parametrize(
    "module",
    [
        *(f"src/rsgw/{p.relative_to(SRC)}" for p in all_modules()),
        *(f"tools/{p.relative_to(TOOLS)}" for p in sorted(TOOLS.rglob("*.py"))),
    ],
)
def test_module_stays_small(module: str) -> None:
    lines = len((SRC.parent.parent / module).read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{module} has {lines} lines: split it along its concepts"


def long_functions(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            assert node.end_lineno is not None
            if node.end_lineno - start + 1 > MAX_FUNCTION_LINES:
                yield f"{node.name} ({node.end_lineno - start + 1} lines)"


@pytest.mark.parametrize("module", [str(p.relative_to(SRC)) for p in all_modules()])
def test_functions_stay_small(module: str) -> None:
    assert not list(long_functions(SRC / module)), "split it into named steps"


#: How a package map names its parts: `_module` (`__main__` too) and `subpackage/`.
MODULE_NAME = re.compile(r"`(_{1,2}[a-z][a-z0-9_]*)`")
SUBPACKAGE_NAME = re.compile(r"`(_?[a-z][a-z0-9_]*)/`")


@pytest.mark.parametrize("package", packages())
def test_package_map_names_every_module(package: str) -> None:
    """Each package's `__init__` docstring is its map: it names every module and
    subpackage it holds, and nothing that is not there (its sibling rooms aside)."""
    folder = SRC.joinpath(*package.split("."))
    docstring = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    modules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    subpackages = {p.parent.name for p in folder.glob("*/__init__.py")}
    # `__init__` is the map itself; a room may name its sibling rooms (`fleet/`).
    named_modules = set(MODULE_NAME.findall(docstring)) - {"__init__"}
    named_subpackages = set(SUBPACKAGE_NAME.findall(docstring))
    siblings = {p.parent.name for p in folder.parent.glob("*/__init__.py")} if package else set()
    assert named_modules == modules, (
        f"unnamed: {sorted(modules - named_modules)}, absent: {sorted(named_modules - modules)}"
    )
    assert subpackages <= named_subpackages, sorted(subpackages - named_subpackages)
    assert named_subpackages <= subpackages | siblings, sorted(named_subpackages - subpackages)
