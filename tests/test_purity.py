"""Pure cores import no I/O framework: checked by scanning their imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rsgw

SRC = Path(rsgw.__file__).parent
PURE = [
    "grpc/_framing.py",
    "grpc/_metadata.py",
    "grpc/_status.py",
    "worker/_batching.py",
    "worker/_catalogue.py",
    "worker/_tensors.py",
    "worker/_compute.py",
    "_errors.py",
]
FORBIDDEN = {"trio", "h2", "hypercorn", "httpx", "socket", "logging", "prometheus_client", "time"}


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_no_io(module: str) -> None:
    assert not imported_roots(SRC / module) & FORBIDDEN
