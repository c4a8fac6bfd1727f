"""`tpuctl recover` and `tpuctl janitor`: decide what to change, then (with --apply) do it.

Deciding is pure (a list of `Action`s from the nodes the API listed), so a dry run
makes no call that changes anything.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from google.api_core import exceptions as gexc

from model import capacity, catalog
from model.budget_hold import janitor_marker
from model.fleet import ExpectedNode, StackTarget
from node_agent.contract import MAX_RUNTIME_KEY
from ops.tpu.api import NodeStatus, QueuedStatus, TpuApi

Verb = Literal["delete-node", "delete-queued", "reset-queued", "stop-node", "report",
               "move-queued"]
# A spot or preemptible TPU is never restarted: it stays PREEMPTED, holding quota,
# until deleted (docs/tpu-facts.md, "Spot TPUs"). TERMINATED nodes do not come back either.
LOST_STATES = {"PREEMPTED", "TERMINATED"}
# A queued resource whose node is gone waits SUSPENDED (or FAILED) until reset.
STALLED_QUEUED_STATES = {"SUSPENDED", "FAILED"}
FINISHED = "succeeded"
BUSY_JOB_STATES = {"installing", "running"}
# The agent's state once a run-time limit or a stop request stopped the job for good
# (node_agent/limits.py): the node waits to be deleted.
STOPPED_FOR_GOOD = "stopped"
# Past maxRuntime the agent stops the job with a save (at most its stop deadline,
# 120 s by default, node_agent/deadlines.py); the janitor deletes the node this much
# later, whether or not its agent is alive to have saved.
MAX_RUNTIME_GRACE_MINUTES = 10.0
PAST_MAX_RUNTIME = "past maxRuntime"


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
    # A deletion past maxRuntime: the node id it keeps out of the stack (record_holds).
    holds: str = field(default="", compare=False)

    @classmethod
    def on(cls, verb: Verb, node: NodeStatus, reason: str) -> Action:
        if verb in ("reset-queued", "delete-queued"):
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
    at = node.candidate_of(request)
    count = len(node.candidates)
    here = f"candidate {node.candidate_label(at)}"
    if node_state in LOST_STATES or request.state in ("SUSPENDED", "SUSPENDING"):
        why = f"{node_state or request.state} on {here}: start again from the first candidate"
        return _move(node, request, 0, why) if at else Action(
            "reset-queued", request.zone, request.name, why, request.name)
    if request.state == "FAILED":
        # One classifier for a FAILED request: no message is capacity, as for the
        # provider and the controller (issue 43, defect 5).
        failure = capacity.failed_request(request.error_code, request.error_message,
                                          request.zone)
        if not failure.moves_on and failure.kind != "unclassified":
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
    # The candidate's own request name (model/naming.py candidate_request).
    place = {**node.candidates[to], "queued_resource_id": node.request_id(to)}
    return Action("move-queued", request.zone, request.name,
                  f"{reason}: move to candidate {node.candidate_label(to)}", request.name,
                  to=place)


# Requests that hold quota and will not provision: FAILED and SUSPENDED ones keep it
# until deleted (marin-community/marin #87), as does one still waiting past its validUntil.
STALE_QUEUED_STATES = {"FAILED", "SUSPENDED"}
# validUntil bounds the wait only: "If the request cannot be fulfilled by this time the
# request will be failed" (google-cloud-tpu tpu_v2 QueuedResource.QueueingPolicy
# valid_until_duration). An ACTIVE or PROVISIONING request past it is a node at work,
# never deleted for the clock (issue 43, defect 4).
CLOCKED_QUEUED_STATES = {"ACCEPTED", "WAITING_FOR_RESOURCES"}


def queued_janitor_plan(queued: Sequence[QueuedStatus], now: datetime) -> list[Action]:
    """The stack's queued resources that are FAILED, SUSPENDED, or still waiting past
    validUntil: deleted, each with the chips of quota it frees."""
    actions = []
    for request in queued:
        expired = (request.state in CLOCKED_QUEUED_STATES and request.valid_until is not None
                   and request.valid_until <= now)
        if request.state not in STALE_QUEUED_STATES and not expired:
            continue
        why = request.state if request.state in STALE_QUEUED_STATES else \
            f"past validUntil {request.valid_until:%Y-%m-%d %H:%M} UTC ({request.state})"
        what = f"{request.chips} chips of {request.accelerator_type or 'TPU'}"
        actions.append(Action("delete-queued", request.zone, request.name,
                              f"{why}: frees {what}", request.name, chips=request.chips))
    return actions


def janitor_plan(nodes: list[NodeStatus], idle_minutes: float, now: datetime,
                 queued: Sequence[QueuedStatus] = (),
                 grace_minutes: float = MAX_RUNTIME_GRACE_MINUTES) -> list[Action]:
    """READY nodes whose job finished, or with no job activity for `idle_minutes`; nodes
    past their run-time limit or stopped for good (limits_plan); and the stale queued
    resources (queued_janitor_plan), each acted on once."""
    actions = limits_plan(nodes, now, grace_minutes)
    handled = {action.name for action in actions}
    actions += [action for action in queued_janitor_plan(queued, now)
                if action.name not in handled]
    handled |= {action.name for action in actions}
    for node in nodes:
        if node.name in handled or (node.queued_resource and node.queued_resource in handled):
            continue
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


def limits_plan(nodes: list[NodeStatus], now: datetime,
                grace_minutes: float = MAX_RUNTIME_GRACE_MINUTES) -> list[Action]:
    """Nodes past `maxRuntime` (metadata MAX_RUNTIME_KEY) plus the grace since their
    create time are deleted, whatever their agent says (it may be dead); a node whose
    agent stopped its job for good (an idleStop, a stop request) is deleted when it is
    a pod slice, stopped when a single host (docs/tpu-facts.md). A queued node goes
    with its queued resource, or the request would provision it again."""
    actions = []
    for node in nodes:
        reason = _past_max_runtime(node, now, grace_minutes)
        verb: Verb = "delete-node"
        if reason is None and node.job.get("state") == STOPPED_FOR_GOOD and \
                node.state == "READY":
            reason = f"stopped for good: {node.job.get('message') or 'by its agent'}"
            verb = "delete-node" if _multi_host(node) else "stop-node"
        if reason is None:
            continue
        if verb == "delete-node" and node.queued_resource:
            verb = "delete-queued"
        action = Action.on(verb, node, reason)
        past = verb != "stop-node" and reason.startswith(PAST_MAX_RUNTIME)
        actions.append(replace(action, holds=node.node_id) if past else action)
    return actions


def _past_max_runtime(node: NodeStatus, now: datetime, grace_minutes: float) -> str | None:
    text = node.metadata.get(MAX_RUNTIME_KEY, "")
    if not text.isdigit() or node.created is None:
        return None
    age = now - node.created
    if age < timedelta(seconds=int(text), minutes=grace_minutes):
        return None
    return (f"{PAST_MAX_RUNTIME}: up {age.total_seconds() / 3600:.1f} h, maxRuntime "
            f"{int(text) / 3600:g} h plus {grace_minutes:g} min grace")


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


def record_holds(storage_client: Any, target: StackTarget, done: Sequence[Action],
                 now: datetime) -> list[str]:
    """For every deletion past maxRuntime done, the marker that keeps the node out of
    the stack until its settings change (components/budget_hold.py janitor_marker): a
    create-only object (ifGenerationMatch=0) in the stack's artifacts bucket. The
    markers' names; a node the stack file does not name gets none."""
    bucket = storage_client.bucket(target.artifacts_bucket)
    names = []
    for action in done:
        node = target.expected(action.holds) if action.holds else None
        if node is None or not node.settings_digest:
            continue
        name = janitor_marker(node.node_id, node.settings_digest)
        record = {"node": node.node_id, "reason": action.reason, "deleted": now.isoformat()}
        # A second deletion of the same settings finds it there (412): recorded already.
        with contextlib.suppress(gexc.PreconditionFailed):
            bucket.blob(name).upload_from_string(json.dumps(record),
                                                 content_type="application/json",
                                                 if_generation_match=0)
        names.append(name)
    return names
