"""`tpuctl recover` and `tpuctl janitor`: decide what to change, then (with --apply) do it.

Deciding is pure (a list of `Action`s from the nodes the API listed), so a dry run
makes no call that changes anything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from components import catalog
from node_agent.contract import MAX_RUNTIME_KEY
from ops.tpu.api import NodeStatus, QueuedStatus, TpuApi

Verb = Literal["delete-node", "delete-queued", "reset-queued", "stop-node", "report"]
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


@dataclass(frozen=True)
class Action:
    verb: Verb
    zone: str
    subject: str  # the node id, or the queued resource's name for reset-queued
    reason: str
    name: str  # the resource name the change is made on (it names the project)

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


def janitor_plan(nodes: list[NodeStatus], idle_minutes: float, now: datetime,
                 grace_minutes: float = MAX_RUNTIME_GRACE_MINUTES) -> list[Action]:
    """READY nodes whose job finished, or with no job activity for `idle_minutes`; and
    nodes past their run-time limit or stopped for good (limits_plan)."""
    actions = limits_plan(nodes, now, grace_minutes)
    handled = {action.name for action in actions}
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
        actions.append(Action.on(verb, node, reason))
    return actions


def _past_max_runtime(node: NodeStatus, now: datetime, grace_minutes: float) -> str | None:
    text = node.metadata.get(MAX_RUNTIME_KEY, "")
    if not text.isdigit() or node.created is None:
        return None
    age = now - node.created
    if age < timedelta(seconds=int(text), minutes=grace_minutes):
        return None
    return (f"past maxRuntime: up {age.total_seconds() / 3600:.1f} h, maxRuntime "
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
        elif action.verb == "delete-queued":
            api.delete_queued_resource(action.name)
        elif action.verb == "stop-node":
            api.stop_node(action.name)
        on_done(action)
