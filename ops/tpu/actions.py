"""`tpuctl recover` and `tpuctl janitor`: decide what to change, then (with --apply) do it.

Deciding is pure (a list of `Action`s from the nodes the API listed), so a dry run
makes no call that changes anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from components import capacity, catalog
from ops.tpu.api import NodeStatus, QueuedStatus, TpuApi
from ops.tpu.target import ExpectedNode

Verb = Literal["delete-node", "reset-queued", "stop-node", "report", "move-queued",
               "delete-queued"]
# A spot or preemptible TPU is never restarted: it stays PREEMPTED, holding quota,
# until deleted (docs/tpu-facts.md, "Spot TPUs"). TERMINATED nodes do not come back either.
LOST_STATES = {"PREEMPTED", "TERMINATED"}
# A queued resource whose node is gone waits SUSPENDED (or FAILED) until reset.
STALLED_QUEUED_STATES = {"SUSPENDED", "FAILED"}
FINISHED = "succeeded"
BUSY_JOB_STATES = {"installing", "running"}


@dataclass(frozen=True)
class Action:
    verb: Verb
    zone: str
    subject: str  # the node id, or the queued resource's name for reset-queued
    reason: str
    name: str  # the resource name the change is made on (it names the project)
    # move-queued: the candidate's placement it moves to (components/fallback_tpu.py).
    to: Mapping[str, Any] = field(default_factory=dict, compare=False)
    chips: int = 0  # delete-queued: the quota it frees

    @classmethod
    def on(cls, verb: Verb, node: NodeStatus, reason: str) -> Action:
        if verb == "reset-queued":
            return cls(verb, node.zone, node.queued_resource, reason, node.queued_resource)
        return cls(verb, node.zone, node.node_id, reason, node.name)


def recovery_plan(nodes: list[NodeStatus], queued: Sequence[QueuedStatus] = ()) -> list[Action]:
    """Lost nodes go, so the next `pulumi up --refresh` recreates them; the job resumes
    from its checkpoint. A queued node's request is reset instead: it re-queues and
    provisions the node again, as does a SUSPENDED or FAILED request whose node is gone."""
    actions = []
    for node in nodes:
        if node.state not in LOST_STATES:
            continue
        if node.queued_resource:
            actions.append(Action.on("reset-queued", node, f"{node.state}: re-queue the request"))
        else:
            reason = f"{node.state}: delete so `pulumi up` recreates it"
            actions.append(Action.on("delete-node", node, reason))
    present = {node.node_id for node in nodes}
    for request in queued:
        if request.state in STALLED_QUEUED_STATES and not present & set(request.node_ids):
            reason = f"queued resource {request.state}, node gone: re-queue the request"
            actions.append(Action("reset-queued", request.zone, request.name, reason,
                                  request.name))
    return actions


# A request waiting in the queue (a fallback node's, past its maxWait, moves on).
WAITING_QUEUED_STATES = {"WAITING_FOR_RESOURCES", "ACCEPTED", "CREATING"}


def fallback_recovery_plan(expected: Sequence[ExpectedNode], nodes: Sequence[NodeStatus],
                           queued: Sequence[QueuedStatus], now: datetime) -> list[Action]:
    """A node with fallback (issue 35): its request FAILED for capacity, quota, a
    reservation, or waiting longer than maxWait moves to the next candidate (after the
    last: the first, a new round); after a preemption (its node PREEMPTED or TERMINATED,
    its request SUSPENDED) it starts again from its first candidate. A permanent failure
    is reported, never moved: the next candidate would fail the same way."""
    actions: list[Action] = []
    node_state = {n.node_id: n.state for n in nodes}
    for node in expected:
        if not node.candidates:
            continue
        for request in (q for q in queued if node.node_id in q.node_ids):
            action = _fallback_action(node, request, node_state.get(node.node_id), now)
            if action is not None:
                actions.append(action)
    return actions


def _fallback_action(node: ExpectedNode, request: QueuedStatus, node_state: str | None,
                     now: datetime) -> Action | None:
    at = node.candidate_at(request.zone, request.accelerator_type)
    count = len(node.candidates)
    here = f"candidate {node.candidate_label(at)}"
    if node_state in LOST_STATES or request.state in ("SUSPENDED", "SUSPENDING"):
        why = f"{node_state or request.state} on {here}: start again from the first candidate"
        return _move(node, request, 0, why) if at else Action(
            "reset-queued", request.zone, request.name, why, request.name)
    if request.state == "FAILED":
        failure = capacity.classify(capacity.ApiError(request.error_code,
                                                      request.error_message), request.zone)
        if not failure.moves_on:
            return Action("report", request.zone, request.name,
                          f"FAILED on {here} ({failure.kind}: {failure.detail}): fix it, "
                          f"no other candidate is tried", request.name)
        return _move(node, request, (at + 1) % count,
                     f"FAILED on {here} ({failure.kind}: {failure.detail})")
    waited = (now - request.created).total_seconds() if request.created else 0.0
    if request.state in WAITING_QUEUED_STATES and waited > node.max_wait_seconds:
        return _move(node, request, (at + 1) % count,
                     f"{request.state} on {here} for {waited / 60:.0f} min, longer than "
                     f"maxWait ({node.max_wait_seconds / 60:.0f} min)")
    return None


def _move(node: ExpectedNode, request: QueuedStatus, to: int, reason: str) -> Action:
    return Action("move-queued", request.zone, request.name,
                  f"{reason}: move to candidate {node.candidate_label(to)}", request.name,
                  to=node.candidates[to])


# Requests that hold quota and will not provision: FAILED and SUSPENDED ones keep it
# until deleted (marin-community/marin #87), as does one past its validUntil.
STALE_QUEUED_STATES = {"FAILED", "SUSPENDED"}


def queued_janitor_plan(queued: Sequence[QueuedStatus], now: datetime) -> list[Action]:
    """The stack's queued resources that are FAILED, SUSPENDED or past validUntil: deleted,
    each with the chips of quota it frees."""
    actions = []
    for request in queued:
        expired = request.valid_until is not None and request.valid_until <= now
        if request.state not in STALE_QUEUED_STATES and not expired:
            continue
        why = request.state if request.state in STALE_QUEUED_STATES else \
            f"past validUntil {request.valid_until:%Y-%m-%d %H:%M} UTC ({request.state})"
        what = f"{request.chips} chips of {request.accelerator_type or 'TPU'}"
        actions.append(Action("delete-queued", request.zone, request.name,
                              f"{why}: frees {what}", request.name, chips=request.chips))
    return actions


def janitor_plan(nodes: list[NodeStatus], idle_minutes: float, now: datetime,
                 queued: Sequence[QueuedStatus] = ()) -> list[Action]:
    """READY nodes whose job finished, or with no job activity for `idle_minutes`; and
    the stale queued resources (queued_janitor_plan)."""
    actions = queued_janitor_plan(queued, now)
    for node in nodes:
        reason = _why_idle(node, idle_minutes, now) if node.state == "READY" else None
        if reason is None:
            continue
        if _multi_host(node):
            # Only single-host TPU VMs can be stopped and started; pod slices
            # cannot (docs/tpu-facts.md).
            actions.append(
                Action.on(
                    "report",
                    node,
                    f"{reason}; a pod slice cannot be stopped: "
                    "remove it from the stack or `pulumi destroy`",
                )
            )
        else:
            actions.append(Action.on("stop-node", node, reason))
    return actions


def _why_idle(node: NodeStatus, idle_minutes: float, now: datetime) -> str | None:
    state = node.job.get("state", "")
    if state == FINISHED:
        return "job succeeded"
    if state in BUSY_JOB_STATES:
        return None
    since = _parse_time(node.job.get("updated")) or node.created
    if since is None:
        return None
    idle = now - since
    if idle < timedelta(minutes=idle_minutes):
        return None
    return f"idle {idle.total_seconds() / 60:.0f} min (job {state or 'never reported'})"


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _multi_host(node: NodeStatus) -> bool:
    try:
        return catalog.parse_accelerator_type(node.accelerator_type).multi_host
    except catalog.CatalogError:
        return True  # unknown shape: never stop what we cannot classify


def apply_actions(
    api: TpuApi, actions: list[Action], on_done: Callable[[Action], None] = lambda _action: None
) -> None:
    """Carry out every action but `report`, in order."""
    for action in actions:
        if action.verb == "delete-node":
            api.delete_node(action.name)
        elif action.verb == "reset-queued":
            api.reset_queued_resource(action.name)
        elif action.verb == "stop-node":
            api.stop_node(action.name)
        elif action.verb == "delete-queued":
            api.delete_queued_resource(action.name)
        elif action.verb == "move-queued":
            api.move_queued_resource(action.name, dict(action.to))
        on_done(action)
