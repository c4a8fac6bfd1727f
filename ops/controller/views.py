"""`tpuctl janitor` and `tpuctl recover` as views of the controller's plan (issue 43): each
computes the planner's plan (plan.py) for the stack from what it listed, and shows (or,
with --apply, makes) only the plan's steps of its kinds: the janitor the limits, recover
the placement and the recovery. A node another planner claims first (a budget hold, a
move in flight, a fallback move before a limit) is not theirs, so the laptop and the
cloud never act differently on one node.

Their inputs are the controller's but for what a laptop does not read: no moves in flight
and no budget holds (the controller's bucket), and the janitor's own idle rule
(`--idle-minutes`, a never-reported node idle from its create time: Inputs.unreported_idle).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from model.fleet import StackTarget
from model.manifest import Manifest
from ops.controller import plan as planner
from ops.tpu.actions import Action
from ops.tpu.api import NodeStatus, QueuedStatus, Unread

JANITOR_KINDS = frozenset({"limits"})
RECOVER_KINDS = frozenset({"placement", "recovery"})


def stack_steps(target: StackTarget, nodes: Sequence[NodeStatus],
                queued: Sequence[QueuedStatus], unread: Iterable[Unread], now: datetime,
                idle_minutes: float | None = None) -> list[planner.Step]:
    """The controller planner's plan for `target` from these lists; `idle_minutes`: the
    janitor's idle stops (its rule for silent agents too)."""
    actual = planner.Actual(nodes, queued, frozenset((u.project, u.zone) for u in unread))
    return planner.plan(planner.Inputs([Manifest(target, idle_minutes)], actual, now,
                                       agents={}, unreported_idle=idle_minutes is not None))


def actions_of(steps: Sequence[planner.Step], kinds: frozenset[str]) -> list[Action]:
    """The plan's steps of `kinds`, as the Actions tpuctl shows and applies."""
    return [_action(step) for step in steps if step.kind in kinds]


def others(steps: Sequence[planner.Step], kinds: frozenset[str]) -> list[planner.Step]:
    """The plan's steps another view (or the controller) owns."""
    return [step for step in steps if step.kind not in kinds]


def _action(step: planner.Step) -> Action:
    # A node's subject is its id; a request's, its name (as ops/tpu/actions.py Action.on).
    subject = step.node if "/nodes/" in step.name else step.name
    return Action(step.verb, step.zone, subject, step.reason, step.name,  # type: ignore[arg-type]
                  to=step.to, chips=step.chips, holds=step.holds)
