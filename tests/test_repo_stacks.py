"""A scratch stack file in the root never fails the suite (issue 21)."""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

from model.archive import REPO_ROOT
from tests.repo_stacks import SHIPPED_STACKS, repo_stacks, tracked_stack_names


def test_the_shipped_list_is_what_git_tracks() -> None:
    if tracked_stack_names() is None:
        pytest.skip("not a git checkout")
    assert tracked_stack_names() == list(SHIPPED_STACKS)


def a_checkout(tmp_path: Path) -> Path:
    for name in ("Pulumi.dev.yaml", "Pulumi.prod.yaml"):
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "Pulumi.dev.yaml", "Pulumi.prod.yaml"], cwd=tmp_path,
                   check=True)
    return tmp_path


def test_an_untracked_stack_file_is_left_out_with_a_warning(tmp_path: Path) -> None:
    root = a_checkout(tmp_path)
    (root / "Pulumi.mine.yaml").write_text("config: {gcp:project: nope}\n")
    with pytest.warns(UserWarning, match=r"not tested: Pulumi\.mine\.yaml \(git does not"):
        assert repo_stacks(root) == ["dev", "prod"]


def test_outside_a_checkout_the_shipped_stacks_on_disk_are_used(tmp_path: Path) -> None:
    shutil.copy(REPO_ROOT / "Pulumi.dev.yaml", tmp_path / "Pulumi.dev.yaml")
    (tmp_path / "Pulumi.mine.yaml").write_text("config: {}\n")
    with pytest.warns(UserWarning, match="Pulumi.mine.yaml"):
        assert repo_stacks(tmp_path) == ["dev"]


def test_every_test_reads_the_repository_stacks_through_repo_stacks() -> None:
    """stack_names() lists every Pulumi.<stack>.yaml on disk, a user's scratch stack too
    (README, "Start your own stack"): one with its config still missing failed a test's
    setup when a test enumerated stacks with it (issue 20, a busy-machine pass)."""
    callers = []
    for path in sorted((REPO_ROOT / "tests").rglob("*.py")):
        if path.name == "repo_stacks.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            called = node.func if isinstance(node, ast.Call) else None
            name = getattr(called, "id", None) or getattr(called, "attr", None)
            if name == "stack_names":
                callers.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert callers == [], f"use tests.repo_stacks.repo_stacks() instead: {callers}"
