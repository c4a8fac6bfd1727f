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
from ops.tpu.api import NodeStatus, QueuedStatus, TpuApi

Verb = Literal["delete-node", "reset-queued", "stop-node", "report"]
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


def janitor_plan(nodes: list[NodeStatus], idle_minutes: float, now: datetime) -> list[Action]:
    """READY nodes whose job finished, or with no job activity for `idle_minutes`."""
    actions = []
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
        on_done(action)
