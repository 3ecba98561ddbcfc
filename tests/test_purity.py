"""Pure cores import no I/O framework: checked by scanning their imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rsgw

SRC = Path(rsgw.__file__).parent
PURE = [
    # Shared: errors, value checks, configuration.
    "_errors.py",
    "_values.py",
    "_schema.py",
    "_config.py",  # reads gateway.yml and checks which file exists (open, os.path)
    "_node.py",  # reads the node file (open, os.path)
    "_supervision.py",
    # The gRPC layer's codecs.
    "grpc/_framing.py",
    "grpc/_metadata.py",
    "grpc/_status.py",
    # The operator CLI's parsing and rendering.
    "ctl/_args.py",
    "ctl/_commands.py",
    "ctl/_render.py",
    # The gateway's and the scheduler's cores.
    "gateway/_wire.py",
    "scheduling/_fill.py",
    "scheduling/_knobs.py",
    "scheduling/_meta.py",
    "scheduling/_outstanding.py",
    "scheduling/_packer.py",
    "scheduling/_reports.py",
    "scheduling/_placement.py",
    "scheduling/_policy.py",
    "scheduling/_routing.py",
    # The simulated worker's models.
    "worker/_batching.py",
    "worker/_catalogue.py",  # reads a catalogue file (open, importlib.resources)
    "worker/_compute.py",
    "worker/_costs.py",
    "worker/_fair.py",
    "worker/_specs.py",
    "worker/_tensors.py",
    "worker/_weights.py",
]
# Not listed, though they hold no Trio: `_exposition.py` (prometheus_client),
# `_net.py` (socket), `_logging.py` (logging).
FORBIDDEN = {"trio", "h2", "hypercorn", "httpx", "socket", "logging", "prometheus_client", "time"}


def imports(path: Path) -> set[str]:
    """Every absolute module name `path` imports, TYPE_CHECKING blocks included."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def imported_roots(path: Path) -> set[str]:
    return {name.split(".")[0] for name in imports(path)}


def module_file(name: str) -> Path:
    """The source file of an `rsgw.…` module name."""
    path = SRC.joinpath(*name.split(".")[1:])
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_no_io(module: str) -> None:
    assert not imported_roots(SRC / module) & FORBIDDEN


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_only_pure_rsgw_modules(module: str) -> None:
    # A pure module that imported a shell module would import its I/O along with it.
    # Package `__init__` files are let through: `rsgw/__init__.py` re-exports the
    # gateway shell, and every `rsgw.…` import runs it anyway; the rule is about what
    # the core itself depends on.
    pure = {SRC / m for m in PURE} | {SRC / "__init__.py"}
    for name in imports(SRC / module):
        if name.split(".")[0] == "rsgw":
            path = module_file(name)
            assert path in pure or path.name == "__init__.py", (module, name)


def test_every_listed_module_exists() -> None:
    for module in PURE:
        assert (SRC / module).is_file(), module
