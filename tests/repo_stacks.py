"""The repository's own stack files: the ones git tracks.

README's "Start your own stack" puts a `Pulumi.<name>.yaml` of the user's in the root; the
tests that check every stack of the repository read only the tracked ones, so a scratch
stack never fails the suite (issue 21). An untracked one gets a warning, nothing more.
"""

from __future__ import annotations

import subprocess
import warnings
from pathlib import Path

from components.stack_config import stack_names
from model.archive import REPO_ROOT

# Outside a git checkout (an unpacked archive): the stacks the repository ships.
# test_stack_files_are_the_tracked_ones keeps this equal to `git ls-files`.
SHIPPED_STACKS = ("dev", "platform", "prod", "team-vision")


def tracked_stack_names(root: Path = REPO_ROOT) -> list[str] | None:
    """Stack names of the Pulumi.<stack>.yaml files git tracks; None outside a checkout."""
    try:
        listed = subprocess.run(["git", "ls-files", "--", "Pulumi.*.yaml"], cwd=root,
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    names = [Path(line).name[len("Pulumi."):-len(".yaml")] for line in listed.splitlines()
             if "/" not in line]
    return sorted(names) or None


def repo_stacks(root: Path = REPO_ROOT) -> list[str]:
    """The repository's stacks present on disk; a warning names any other stack file."""
    tracked = tracked_stack_names(root) or list(SHIPPED_STACKS)
    present = stack_names(root)
    others = [name for name in present if name not in tracked]
    if others:
        warnings.warn(f"not tested: {', '.join(f'Pulumi.{n}.yaml' for n in others)} "
                      "(git does not track it; only the repository's stacks are tested)",
                      stacklevel=2)
    return [name for name in tracked if name in present]
