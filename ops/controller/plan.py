"""The controller's pure planner: what to change, each change with its reason.

Inputs: the manifests (desired state, model/manifest.py), the actual state (the
TPU API's node and queued-resource lists, and the (project, zone) pairs that could not
be read), the holds (teams held by a budget stop), the moves in flight (store.py) and
the agents' last status. Output: one list of Steps. No I/O: `tpuctl reconcile` prints
this list, the controller applies it (apply.py), `tpuctl janitor`/`recover` show parts.

Precedence, one step per node at most (the first planner that claims a node or a
resource wins): budget holds, moves in flight, placement, limits, recovery.

- Budget: a held team's nodes are asked to save (the stop key, node_agent/contract.py
  STOP_REQUEST_KEY) and, once asked SAVE_GRACE_SECONDS ago, deleted; every run does
  this again for whatever is left, until the hold ends.
- Moves in flight: a move recorded by a run (intent, then delete, then create) is
  finished: so a run killed mid-move is completed by the next.
- Placement (a node with candidates): at most one request alive (extras deleted); a
  request FAILED for capacity, quota or a reservation, or waiting past maxWait, moves to
  the next candidate; after a preemption back to the first; a permanent error is reported
  (ops/tpu/actions.py fallback_recovery_plan: one decision shared with `tpuctl recover`).
- Limits: past maxRuntime plus grace, stopped for good, idle (only a node whose agent
  reported: no status is no evidence of idleness), FAILED and SUSPENDED requests, a
  request still waiting past validUntil; never an ACTIVE or PROVISIONING one for a clock
  (ops/tpu/actions.py janitor_plan).
- Recovery: a lost node with no candidates is deleted (or its request reset) so it comes
  back (ops/tpu/actions.py recovery_plan).

A pair that could not be read plans nothing for the nodes that may live there: a read
error never deletes anything.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from model.fleet import ExpectedNode
from model.manifest import Manifest
from model.naming import label_value
from node_agent.contract import STOP_REQUEST_KEY
from ops.tpu import actions
from ops.tpu.api import NodeStatus, QueuedStatus

# The budget stop's save grace: the longest stop notice the agent honours (120 s) plus
# 30 s of teardown (components/budget_stop.py SAVE_GRACE_SECONDS).
SAVE_GRACE_SECONDS = 150.0
# janitor_plan's idle bound when idleness is not this planner's question (no idle stop).
NEVER_IDLE_MINUTES = 10.0**8
# Steps that change nothing in the cloud: shown and audited, never applied to the API.
NO_CALL = frozenset({"report", "forget-move"})
_ASKED_RE = re.compile(r"\(asked (?P<at>[0-9T:.+-]+Z?)\)")
# How far along a request is: the one kept when a node has several alive.
_PROGRESS = {"ACTIVE": 0, "PROVISIONING": 1, "CREATING": 2, "WAITING_FOR_RESOURCES": 3,
             "ACCEPTED": 3}


@dataclass(frozen=True)
class Step:
    """One change, or one report, with its reason."""

    verb: str  # an actions.Verb, or save-node, finish-move, forget-move
    stack: str
    node: str  # the node id it concerns
    name: str  # the resource it acts on (names the project and zone)
    zone: str
    reason: str
    to: Mapping[str, Any] = field(default_factory=dict, compare=False)
    chips: int = 0
    holds: str = field(default="", compare=False)  # a deletion past maxRuntime: the node
    # Which planner made it (KINDS): `tpuctl janitor` and `recover` show some kinds only.
    kind: str = field(default="", compare=False)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"verb": self.verb, "stack": self.stack, "node": self.node,
                                "name": self.name, "zone": self.zone, "reason": self.reason}
        if self.to:
            body["to"] = {"zone": self.to.get("zone"),
                          "queuedResourceId": self.to.get("queued_resource_id")}
        return body


# The planners, in precedence; `tpuctl janitor` shows the limits steps, `tpuctl recover`
# the placement and recovery ones (ops/controller/views.py).
KINDS = ("budget", "move", "placement", "limits", "recovery")


@dataclass(frozen=True)
class Move:
    """A move in flight: recorded before its delete, forgotten once the new request is
    in the API (store.py keeps them; apply.py writes them)."""

    stack: str
    node: str
    old: str  # the request being deleted
    new: str  # the request being created
    props: Mapping[str, Any]  # what creates it (components/fallback_tpu.py enqueue)
    reason: str
    started: str

    def to_json(self) -> dict[str, Any]:
        return {"stack": self.stack, "node": self.node, "old": self.old, "new": self.new,
                "props": dict(self.props), "reason": self.reason, "started": self.started}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Move:
        return cls(body["stack"], body["node"], body["old"], body["new"], dict(body["props"]),
                   body.get("reason") or "", body.get("started") or "")


@dataclass(frozen=True)
class Actual:
    nodes: Sequence[NodeStatus]
    queued: Sequence[QueuedStatus]
    unread: frozenset[tuple[str, str]] = frozenset()  # (project, zone) pairs not read


@dataclass(frozen=True)
class Inputs:
    manifests: Sequence[Manifest]
    actual: Actual
    now: datetime
    held_teams: Mapping[str, str] = field(default_factory=dict)  # team -> why
    moves: Sequence[Move] = ()
    agents: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # node id -> status
    # `tpuctl janitor`: a node whose agent never reported is idle from its create time (its
    # agent may never have started); the controller never counts silence as idleness.
    unreported_idle: bool = False


def plan(inputs: Inputs) -> list[Step]:
    claimed = _Claims()
    for manifest in inputs.manifests:
        claimed.add(stack_plan(manifest, inputs))
    for manifest in inputs.manifests:
        claimed.add(_kind("budget", team_budget_steps(manifest, inputs)))
    return claimed.steps


def team_budget_steps(manifest: Manifest, inputs: Inputs) -> list[Step]:
    """A held budget team's nodes the manifests may not name (its team stack declares
    them): every node and request in its project carrying its `team` label and
    `managed-by` (as functions/budget_stop finds them), saved then deleted."""
    steps: list[Step] = []
    for team in manifest.budget_teams:
        why = inputs.held_teams.get(team.team)
        if why is None or any((team.project, z) in inputs.actual.unread for z in team.zones):
            continue
        nodes = [n for n in inputs.actual.nodes if n.project == team.project
                 and _labelled(n.labels, team.team)]
        steps += [s for s in (_budget_node_step(manifest.target.stack, n, why, inputs.now)
                              for n in nodes) if s is not None]
        with_node = {n.node_id for n in nodes}
        steps += [Step("delete-queued", manifest.target.stack, q.node_ids[0], q.name, q.zone,
                       f"budget hold ({why}): its request goes", chips=q.chips)
                  for q in inputs.actual.queued
                  if q.name.split("/")[1] == team.project and _labelled(q.labels, team.team)
                  and with_node.isdisjoint(q.node_ids)]
    return steps


def _labelled(labels: Mapping[str, str], team: str) -> bool:
    return labels.get("team") == label_value(team) and labels.get("managed-by") == "pulumi"


def stack_plan(manifest: Manifest, inputs: Inputs) -> list[Step]:
    target = manifest.target
    readable = [n for n in target.nodes if not _unread(n, inputs.actual.unread)]
    ids = {n.node_id for n in readable}
    nodes = [_with_agent(n, inputs.agents) for n in inputs.actual.nodes
             if n.node_id in ids and _ours(n, target.stack)]
    queued = [q for q in inputs.actual.queued if not ids.isdisjoint(q.node_ids)]
    by_node: dict[str, list[QueuedStatus]] = {}
    for request in queued:
        for node_id in request.node_ids:
            by_node.setdefault(node_id, []).append(request)
    moving = {n.node_id for n in readable if n.candidates}
    claimed = _Claims()
    claimed.add(_kind("budget", budget_steps(target.stack, readable, nodes, by_node, inputs)))
    claimed.add(_kind("move", move_steps(target.stack, ids, queued, inputs.moves)))
    claimed.add(_kind("placement", placement_steps(target.stack, readable, nodes, by_node,
                                                   inputs.now)))
    claimed.add(_kind("limits", limit_steps(target.stack, nodes, queued, inputs.now,
                                            manifest.idle_stop_minutes,
                                            inputs.unreported_idle)))
    claimed.add(_kind("recovery", _steps(target.stack, actions.recovery_plan(
        [n for n in nodes if n.node_id not in moving],
        [q for q in queued if moving.isdisjoint(q.node_ids)]), queued)))
    return claimed.steps


def _kind(kind: str, steps: Iterable[Step]) -> list[Step]:
    return [replace(step, kind=kind) for step in steps]


class _Claims:
    """Steps kept in precedence order: one per node and per resource."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self._nodes: set[str] = set()
        self._names: set[str] = set()

    def add(self, steps: Iterable[Step]) -> None:
        batch = [s for s in steps if s.node not in self._nodes and s.name not in self._names]
        self.steps += batch
        self._nodes |= {s.node for s in batch}
        self._names |= {s.name for s in batch}


# ---- budgets ----------------------------------------------------------------------


def budget_steps(stack: str, expected: Sequence[ExpectedNode], nodes: Sequence[NodeStatus],
                 by_node: Mapping[str, list[QueuedStatus]], inputs: Inputs) -> list[Step]:
    steps = []
    held = {n.node_id: inputs.held_teams[n.team] for n in expected
            if n.team in inputs.held_teams}
    live = {n.node_id: n for n in nodes}
    for node_id, why in held.items():
        node = live.get(node_id)
        requests = by_node.get(node_id, [])
        if node is not None:
            steps.append(_budget_node_step(stack, node, why, inputs.now))
        else:
            steps += [Step("delete-queued", stack, node_id, q.name, q.zone,
                           f"budget hold ({why}): its request goes", chips=q.chips)
                      for q in requests]
    return [s for s in steps if s is not None]


def _budget_node_step(stack: str, node: NodeStatus, why: str, now: datetime) -> Step | None:
    asked = _asked_at(node.metadata.get(STOP_REQUEST_KEY, ""))
    if node.state == "READY" and STOP_REQUEST_KEY not in node.metadata:
        return Step("save-node", stack, node.node_id, node.name, node.zone,
                    f"budget hold ({why}): asked to save (asked {now.isoformat()})")
    if asked is not None and now - asked < timedelta(seconds=SAVE_GRACE_SECONDS):
        return None  # asked: its agent is saving
    verb, name = (("delete-queued", node.queued_resource) if node.queued_resource
                  else ("delete-node", node.name))
    return Step(verb, stack, node.node_id, name, node.zone,
                f"budget hold ({why}): deleted after its save grace")


def _asked_at(value: str) -> datetime | None:
    match = _ASKED_RE.search(value)
    if match is None:
        return None
    try:
        return datetime.fromisoformat(match["at"].replace("Z", "+00:00"))
    except ValueError:
        return None


# ---- moves and placement ------------------------------------------------------------


def move_steps(stack: str, ids: set[str], queued: Sequence[QueuedStatus],
               moves: Sequence[Move]) -> list[Step]:
    names = {q.name for q in queued}
    steps = []
    for move in moves:
        if move.stack != stack or move.node not in ids:
            continue
        zone = move.props.get("zone", "")
        if move.old not in names and move.new in names:
            steps.append(Step("forget-move", stack, move.node, move.new, zone,
                              f"the move is done: {move.reason}"))
            continue
        phase = "delete the old request, then create" if move.old in names else "create"
        steps.append(Step("finish-move", stack, move.node, move.old, zone,
                          f"a move in flight ({phase}): {move.reason}", to=move.props))
    return steps


def placement_steps(stack: str, expected: Sequence[ExpectedNode], nodes: Sequence[NodeStatus],
                    by_node: Mapping[str, list[QueuedStatus]], now: datetime) -> list[Step]:
    steps = []
    live = {n.node_id: n for n in nodes}
    for node in expected:
        if not node.candidates:
            continue
        mine = by_node.get(node.node_id, [])
        if not mine:
            continue
        keep, extras = _one_alive(node, mine)
        steps += [Step("delete-queued", stack, node.node_id, q.name, q.zone,
                       f"a second request of {node.node_id} ({q.state}): at most one is "
                       f"alive, {keep.name.rsplit('/', 1)[-1]} is kept", chips=q.chips)
                  for q in extras]
        if extras:
            continue
        own = [live[node.node_id]] if node.node_id in live else []
        steps += _steps(stack, actions.fallback_recovery_plan([node], own, [keep], now), mine)
    return steps


def _one_alive(node: ExpectedNode, requests: list[QueuedStatus]
               ) -> tuple[QueuedStatus, list[QueuedStatus]]:
    ranked = sorted(requests, key=lambda q: (_PROGRESS.get(q.state, 9), node.candidate_of(q)))
    return ranked[0], ranked[1:]


# ---- limits ------------------------------------------------------------------------


def limit_steps(stack: str, nodes: Sequence[NodeStatus], queued: Sequence[QueuedStatus],
                now: datetime, idle_minutes: float | None,
                unreported_idle: bool = False) -> list[Step]:
    """janitor_plan's limits; its idle stops (a finished job is one) only when the
    manifest sets idleStopMinutes, and only for a node whose agent reported (unless
    `unreported_idle`: tpuctl janitor's rule)."""
    limits = [a for a in actions.janitor_plan(list(nodes), NEVER_IDLE_MINUTES, now, queued)
              if a.verb != "stop-node" or a.reason.startswith("stopped for good")]
    if idle_minutes is not None:
        # No status is no evidence of idleness (but for tpuctl janitor, as before).
        reported = [n for n in nodes if n.job or unreported_idle]
        limits += actions.janitor_plan(reported, idle_minutes, now)
    unique = {action.name: action for action in reversed(limits)}  # the first one wins
    return _steps(stack, [a for a in limits if unique[a.name] is a], queued)


# ---- shared ------------------------------------------------------------------------


def _steps(stack: str, planned: Iterable[actions.Action], queued: Sequence[QueuedStatus]
           ) -> list[Step]:
    """actions.Action (tpuctl's janitor and recover plans) as Steps, each naming its node."""
    nodes_of = {q.name: q.node_ids for q in queued}
    steps = []
    for action in planned:
        node = (nodes_of.get(action.name) or (action.subject,))[0]
        steps.append(Step(action.verb, stack, node, action.name, action.zone, action.reason,
                          to=action.to, chips=action.chips, holds=action.holds))
    return steps


def _unread(node: ExpectedNode, unread: frozenset[tuple[str, str]]) -> bool:
    return any((node.project, zone) in unread for zone in node.zones)


def _ours(node: NodeStatus, stack: str) -> bool:
    return node.labels.get("stack") == label_value(stack)


def _with_agent(node: NodeStatus, agents: Mapping[str, Mapping[str, str]]) -> NodeStatus:
    job = agents.get(node.node_id)
    return replace(node, job=dict(job)) if job and not node.job else node


def acting(steps: Sequence[Step]) -> list[Step]:
    """The steps that call the TPU API (not reports, not bookkeeping)."""
    return [s for s in steps if s.verb not in NO_CALL]
