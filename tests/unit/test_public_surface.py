"""Each inner-layer module declares its public surface, and the rest of the code keeps to it.

core/ and policy/ are imported by every outer layer: a name used from outside must be in the
module's `__all__`, so what may change freely (everything else) is plain to see.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INNER = ("core", "policy")
OURS = ("core", "policy", "deployments", "autoscale", "cluster", "bench", "tests")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


INNER_MODULES = sorted(module_name(p) for top in INNER for p in (ROOT / top).rglob("*.py"))


def imports_of_inner_names() -> list[tuple[str, str, str]]:
    """(importing file, module, name) for every `from core... / policy... import name`."""
    found: list[tuple[str, str, str]] = []
    for top in OURS:
        for path in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.ImportFrom)
                    and node.module
                    and node.module.split(".")[0] in INNER
                ):
                    found.extend((str(path), node.module, a.name) for a in node.names)
    return found


def is_submodule(package: str, name: str) -> bool:
    try:
        return importlib.util.find_spec(f"{package}.{name}") is not None
    except ModuleNotFoundError:  # `package` is a module, not a package
        return False


@pytest.mark.parametrize("name", INNER_MODULES)
def test_every_inner_module_declares_a_surface_of_names_it_has(name: str) -> None:
    module = importlib.import_module(name)
    surface = getattr(module, "__all__", None)
    assert surface is not None, f"{name} has no __all__"
    assert len(set(surface)) == len(surface), f"{name}.__all__ lists a name twice"
    missing = [n for n in surface if not hasattr(module, n)]
    assert missing == [], f"{name}.__all__ names what it does not have"


def test_other_modules_import_only_declared_names() -> None:
    outside = []
    for path, module, name in imports_of_inner_names():
        if is_submodule(module, name):
            continue
        surface = getattr(importlib.import_module(module), "__all__", ())
        if name not in surface:
            outside.append(f"{path}: from {module} import {name}")
    assert outside == [], "\n".join(outside)
