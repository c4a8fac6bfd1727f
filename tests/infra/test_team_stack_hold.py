"""A team stack leaves its nodes out while a budget stop holds its team, with a warning,
as the platform does (issue 43): the platform records the hold in the team's outputs
object whoever declares the team's nodes, and the team stack reads it there."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone

from components.stack_config import file_config
from ops.plan.mock_engine import GcpMocks, planned_stack_outputs, run_program
from tests.infra.stack_fixtures import as_cli
from tests.infra.test_budget_hold import MARKER
from tests.infra.test_budget_stop_plan import stack
from tests.test_teams import PLATFORM_REF

QUEUED_OR_VM = ("gcp:tpu/v2Vm:V2Vm", "pulumi-python:dynamic/tpu:QueuedTpu",
                "pulumi-python:dynamic/tpu:FallbackTpu")


def team_vision(hold: dict | None) -> object:
    outputs = copy.deepcopy(planned_stack_outputs(PLATFORM_REF))
    if hold is not None:
        outputs["teams"]["vision"]["budgetHold"] = hold
    return run_program(file_config("team-vision"), "team-vision",
                       mock=GcpMocks(stack_outputs={PLATFORM_REF: outputs}))


def tpus(run: object) -> list[str]:
    return sorted(r.name for kind in QUEUED_OR_VM for r in run.of_type(kind))  # type: ignore[attr-defined]


def test_a_held_team_stack_leaves_its_nodes_out_with_a_warning_until_the_hold_ends() -> None:
    until = datetime.now(timezone.utc) + timedelta(days=3)
    hold = {"interval": f"{until:%Y-%m}", "marker": MARKER,
            "until": f"{until:%Y-%m-%dT%H:%M:%SZ}", "nodes": []}
    free = team_vision(None)
    held = team_vision(hold)
    ended = team_vision({**hold, "until": "2020-01-01T00:00:00Z"})

    assert tpus(free) and tpus(held) == [] and tpus(ended) == tpus(free)
    warnings = [m for level, m in held.logs if level == "warning" and "is held" in m]
    assert len(warnings) == 1 and "team vision" in warnings[0] and MARKER in warnings[0]


def test_the_platform_records_the_hold_of_a_team_whose_nodes_live_in_its_team_stack() -> None:
    data = stack(budgetAction="stop")
    data["tpu-stack:teams"]["vision"]["nodes"] = []  # declared by the team stack
    artifacts = "acme-ml-test-test-artifacts"
    run = run_program(as_cli(data), "test",
                      mock=GcpMocks(bucket_objects={artifacts: [MARKER]}))

    assert run.outputs["teams"]["vision"]["budgetHold"]["marker"] == MARKER
