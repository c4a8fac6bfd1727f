"""The order the infra suite's tests start in (docs/design.md, "Two Python environments,
on purpose": the test command).

The end-to-end tests wait tens of seconds each on real processes (an agent, a job, a
rehearsal, a venv being built); the rest take a second or less. Started first, the long
ones overlap the short ones, which fill the CPU they leave while they wait; started
last (pytest's order: they sit late in the alphabet), one worker finished them alone
while the others idled, for minutes. pytest-xdist's `worksteal` scheduling
(scripts/test.sh) then lets an idle worker take a busy one's queue.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# Files of tests that each run real processes for many seconds: the agent's end-to-end
# files (not its unit files), the rehearsals and the venv build.
LONG = {
    *(TESTS / "agent").glob("test_agent_*.py"),
    TESTS / "agent" / "test_rehearse.py",
    TESTS / "infra" / "test_requirements_env.py",
    TESTS / "ops" / "test_rehearse_bert.py",
} - {TESTS / "agent" / "test_agent_units.py", TESTS / "agent" / "test_agent_perf.py"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Long tests first, each group in pytest's own order (a stable sort)."""
    items.sort(key=lambda item: item.path not in LONG)
