"""The house's layout holds (issue 42; docs/design.md, "Layout"): the pure model imports
no pulumi, no import circles, no arrow from a lower layer to a higher one, no long file.

Read from the sources (`ast` over `git ls-files`), every import counted: at the top of
a module, inside a function, under `if TYPE_CHECKING`.
"""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from model.archive import REPO_ROOT

# Lowest first; a module may import its own layer and those below it.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"tpu_training", "node_agent"}),
    frozenset({"cloud"}),
    frozenset({"model"}),
    frozenset({"components"}),
    frozenset({"policy"}),
    frozenset({"ops"}),
    # The entry points: the program, the functions' sources, benchmarks, scripts, tests.
    frozenset({"__main__", "functions", "bench", "scripts", "tests", "training_tests"}),
)
PURE = ("model", "cloud")  # import no pulumi, directly or through our modules
PULUMI = {"pulumi", "pulumi_gcp"}
MAX_LINES = 800


def _module_name(path: str) -> str:
    """`ops/plan/offline.py` -> `ops.plan.offline`; the training package is importable
    from training/ (`tpu_training.*`); its tests there are `training_tests.*` here, apart
    from the infra tests."""
    parts = list(Path(path).with_suffix("").parts)
    if parts[0] == "training":
        parts = ["training_tests", *parts[2:]] if parts[1] == "tests" else parts[1:]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@cache
def _sources() -> dict[str, Path]:
    """Module name -> file, for every tracked Python file (the repo's CI helper under
    .github/ aside: it is no module of the stack)."""
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO_ROOT, check=True,
                            capture_output=True, text=True).stdout.split()
    return {_module_name(p): REPO_ROOT / p for p in listed if not p.startswith(".github/")}


def _imported(module: str, tree: ast.AST) -> Iterator[str]:
    """Every module name `tree` imports, absolute, anywhere in it."""
    package = module if _sources()[module].name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


@cache
def _graph() -> dict[str, frozenset[str]]:
    """Our module -> the names it imports: our modules, and other top-level packages."""
    ours = _sources()
    graph = {}
    for module, path in ours.items():
        targets = set()
        for name in _imported(module, ast.parse(path.read_text(), str(path))):
            if name in ours:
                targets.add(name)
            elif name.split(".")[0] not in _top_levels():
                targets.add(name.split(".")[0])  # a third-party or standard module
        graph[module] = frozenset(targets - {module})
    return graph


@cache
def _top_levels() -> frozenset[str]:
    return frozenset(m.split(".")[0] for m in _sources())


def _reach(start: str) -> dict[str, str]:
    """Every name `start` imports, directly or through our modules: name -> the module
    that imports it (a path back to `start`)."""
    graph, seen, todo = _graph(), {start: ""}, [start]
    while todo:
        module = todo.pop()
        for target in graph.get(module, ()):
            if target not in seen:
                seen[target] = module
                todo.append(target)
    return seen


def _chain(seen: dict[str, str], end: str) -> str:
    chain = [end]
    while seen[chain[-1]]:
        chain.append(seen[chain[-1]])
    return " <- ".join(chain)


def _layer(module: str) -> int:
    top = module.split(".")[0]
    return next(i for i, layer in enumerate(LAYERS) if top in layer)


def test_every_top_level_package_has_a_layer() -> None:
    assert {top for top in _top_levels()} <= set().union(*LAYERS)


@pytest.mark.parametrize("package", PURE)
def test_the_pure_layers_import_no_pulumi(package: str) -> None:
    offenders = []
    for module in _sources():
        if module.split(".")[0] != package:
            continue
        seen = _reach(module)
        offenders += [_chain(seen, name) for name in PULUMI if name in seen]
    assert offenders == []




def _circles() -> set[frozenset[str]]:
    """Groups of our modules each reachable from every other (strongly connected)."""
    ours = _sources()
    reach = {module: set(_reach(module)) & set(ours) for module in ours}
    return {frozenset(m for m in reach[module] if module in reach[m])
            for module in ours if any(module in reach[t] for t in _graph()[module] if t in ours)}


def test_no_import_circle() -> None:
    assert _circles() == set()


def test_no_import_from_a_lower_layer_to_a_higher_one() -> None:
    upward = [f"{module} imports {target}"
              for module, targets in sorted(_graph().items())
              for target in sorted(targets)
              if target in _sources() and _layer(target) > _layer(module)]
    assert upward == []


# Inside ops/, lowest first (xpk's layout: parser/, commands/ the thin verbs, the core).
OPS_LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"ops", "ops.terminal", "ops.local"}),  # the fakes
    frozenset({"ops.plan", "ops.tpu"}),  # the core
    # The core over the core: the rehearsal (boots a node), its report, the controller.
    frozenset({"ops.rehearse", "ops.report", "ops.controller"}),
    frozenset({"ops.parser", "ops.commands"}),  # the typer app; the verbs
    frozenset({"ops.cli"}),
)


def _ops_layer(module: str) -> int:
    piece = ".".join(module.split(".")[:2])
    return next(i for i, layer in enumerate(OPS_LAYERS) if piece in layer)


def test_every_piece_of_ops_has_a_layer() -> None:
    for module in _sources():
        if module.split(".")[0] == "ops":
            _ops_layer(module)


def test_no_import_from_a_lower_piece_of_ops_to_a_higher_one() -> None:
    """No arrow from ops/tpu up to ops/local's rehearsal, nor from the core to a verb."""
    upward = [f"{module} imports {target}"
              for module, targets in sorted(_graph().items()) if module.startswith("ops")
              for target in sorted(targets)
              if target.startswith("ops") and target in _sources()
              and _ops_layer(target) > _ops_layer(module)]
    assert upward == []


def _long_files() -> list[str]:
    return sorted(f"{path.relative_to(REPO_ROOT)} ({lines} lines)"
                  for module, path in _sources().items()
                  if module.split(".")[0] not in ("tests", "training_tests")
                  and (lines := len(path.read_text().splitlines())) > MAX_LINES)


def test_no_source_file_is_over_800_lines() -> None:
    assert _long_files() == []

