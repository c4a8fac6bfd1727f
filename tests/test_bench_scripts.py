"""The benchmarks under bench/ still name what the repo's modules define.

No test runs a benchmark (they print figures, and take minutes), so a rename in the
agent or the components would break one silently: `bench/preemption_drill.py` once
called `node_agent.goodput.key_values` after it had moved to `job_lines`.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from types import ModuleType

import pytest

from model.archive import REPO_ROOT

# Importable here (no TF).
OWN_PACKAGES = ("cloud", "components", "model", "node_agent", "ops", "policy")


def own_modules(tree: ast.Module) -> dict[str, ModuleType]:
    """The names a script binds to modules of the repo's own packages."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(OWN_PACKAGES):
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                try:
                    bound[alias.asname or alias.name] = importlib.import_module(name)
                except ModuleNotFoundError:  # a function or class, not a module
                    continue
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(OWN_PACKAGES) and alias.asname:
                    bound[alias.asname] = importlib.import_module(alias.name)
    return bound


@pytest.mark.parametrize("script", sorted(REPO_ROOT.glob("bench/*.py")), ids=lambda p: p.name)
def test_every_module_attribute_a_benchmark_uses_exists(script: Path) -> None:
    tree = ast.parse(script.read_text())
    modules = own_modules(tree)
    missing = [f"{script.name}:{node.lineno} {node.value.id}.{node.attr}"
               for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
               and node.value.id in modules and not hasattr(modules[node.value.id], node.attr)]
    assert not missing
