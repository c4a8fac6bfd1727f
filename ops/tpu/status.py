"""`tpuctl status` and `tpuctl wait`, reading: the stack's nodes, their health and their
jobs, read from the TPU API (or a rehearsal) and analysed; ops/tpu/status_views.py
renders them."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Literal

from model import catalog, meter, spend
from model.archive import REPO_ROOT
from model.fleet import ExpectedNode, StackTarget
from model.meter import price_table
from model.naming import label_value
from node_agent.contract import UNFINISHED_STATES
from ops.tpu import logs as agent_logs
from ops.tpu import rehearsal_record as record
from ops.tpu.api import (
    READABLE_STATES,
    STATUS_KEYS,
    NodeStatus,
    QueuedStatus,
    Read,
    TpuApi,
    Unread,
)

Until = Literal["ready", "running", "done"]
UNTIL_CHOICES: tuple[Until, ...] = ("ready", "running", "done")
# The agent's job states (docs/design.md, "The training package").
FINISHED = "succeeded"
# Jobs not finished: one definition with the agent's (node_agent/contract.py).
ACTIVE_JOB = set(UNFINISHED_STATES)
# States whose job has a phase under way (docs/design.md, "Deadlines").
PHASE_STATES = {"running", "hung"}
# `tpuctl rehearse --stack <s>` keeps each node's status objects here (ops/rehearse/rehearsal.py,
# keep_status): <node>/status-objects/worker-<n>/status.json, as under the node's prefix.
REHEARSAL_ROOT = REPO_ROOT / ".cache" / "rehearse"
REHEARSED = "REHEARSED"


def read_stack(
    api: TpuApi, target: StackTarget, logs: agent_logs.AgentLogs | None = None
) -> Read[NodeStatus]:
    """Every node of the stack with its job status, from the (project, zone) pairs that
    could be read (concurrently, api.read_nodes), and one Unread per pair that could not."""
    listing = api.read_nodes(target.places, target.stack)
    return Read(with_jobs(api, target, listing.items, logs), listing.unread)


def collect(
    api: TpuApi, target: StackTarget, logs: agent_logs.AgentLogs | None = None
) -> list[NodeStatus]:
    """read_stack, all or nothing: TpuApiError if a (project, zone) could not be read."""
    return with_jobs(api, target, api.stack_nodes(target.places, target.stack), logs)


def with_jobs(
    api: TpuApi, target: StackTarget, nodes: list[NodeStatus],
    logs: agent_logs.AgentLogs | None = None,
) -> list[NodeStatus]:
    """The nodes with their agent's job status.

    The status comes from one listing per logs bucket (the agents' status.json
    metadata; a team's bucket each, listed side by side) where it is there, else from
    the node's guest attributes: one call per node, so only for the nodes the listings
    lack (an older agent, no storage access).
    """
    readable = [n for n in nodes if n.state in READABLE_STATES]
    logs = logs or agent_logs.AgentLogs(target.project, auth=target.auth())
    listed = agent_logs.published_jobs(logs, readable) if readable else {}
    asked = api.with_job_status([n for n in readable if (n.zone, n.node_id) not in listed])
    jobs = listed | {(n.zone, n.node_id): n.job for n in asked}
    return [replace(n, job=jobs.get((n.zone, n.node_id), {})) for n in nodes]


def rehearsal_dir(stack: str, root: Path | None = None) -> Path:
    """Where the stack's rehearsals are: a folder per node (ops/tpu/rehearsal_record.py)."""
    return (root or REHEARSAL_ROOT) / stack


def failed_rehearsal(stack: str, folder: Path | None = None) -> str | None:
    """Why the stack's last rehearsal failed before a node booted, and what to do; None
    when it did not (advice to rehearse never comes without the reason it failed)."""
    failure = record.read_failure(folder or rehearsal_dir(stack))
    if not failure:
        return None
    return (f"the last `tpuctl rehearse --stack {stack}` failed before a node booted: "
            f"{failure}; fix that, then run it again")


def no_rehearsal(stack: str, folder: Path) -> str:
    return (failed_rehearsal(stack, folder) or f"stack {stack} has no rehearsal here "
            f"({folder} holds none): run `tpuctl rehearse --stack {stack}`")


def rehearsed(target: StackTarget, root: Path | None = None) -> list[NodeStatus]:
    """Offline: every node the stack's rehearsals booted, each with the status its agent
    left in the emulator; one whose stack file or training sources changed since shows
    `REHEARSED (stale)` and what changed. [] when the stack was never rehearsed here."""
    nodes = []
    for folder in record.node_folders(rehearsal_dir(target.stack, root)):
        fields = record.worker0_status(folder)
        node = target.expected(str(fields.get("node", "")))
        if node is None:
            continue
        job = {key: value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
               for key, value in fields.items() if key in STATUS_KEYS}
        changed = record.changed_since(folder, target.stack)
        state = f"{REHEARSED} (stale)" if changed else REHEARSED
        health = f"changed since: {', '.join(changed)}; rehearse again" if changed else ""
        nodes.append(NodeStatus(node.zone, node.node_id, state, health,
                                node.tpu.accelerator_type, node.runtime_version, node.spot, {},
                                {}, "", job=job, project=node.project))
    return sorted(nodes, key=lambda n: (n.zone, n.node_id))


def read_queued(api: TpuApi, target: StackTarget) -> Read[QueuedStatus]:
    """The stack's queued resources; no call at all for a stack without queued nodes."""
    if not target.queued_node_ids:
        return Read([])
    places = {(node.project, zone) for node in target.nodes if node.queued
              for zone in node.zones}
    return api.read_queued(places, target.queued_node_ids)


def collect_queued(api: TpuApi, target: StackTarget) -> list[QueuedStatus]:
    """read_queued, all or nothing."""
    return read_queued(api, target).complete()


def absent(target: StackTarget, nodes: list[NodeStatus]) -> list[str]:
    """Node ids the stack config names that the API does not have."""
    present = {node.node_id for node in nodes}
    return [node.node_id for node in target.nodes if node.node_id not in present]


def candidate_lines(target: StackTarget, queued: Sequence[QueuedStatus],
                    now: float) -> list[str]:
    """A line per node with fallback whose request the API listed: the candidate it is
    on (`2/4 us-east5-b spot`), the request's state and for how long, the last
    failure's class (model/capacity.py) and the time left before the next
    candidate (its maxWait; `tpuctl recover --apply` moves it)."""
    from model import capacity

    lines = []
    for node in target.nodes:
        request = next((q for q in queued if node.candidates and node.node_id in q.node_ids),
                       None)
        if request is None:
            continue
        at = node.candidate_at(request.zone, request.accelerator_type)
        waited = now - request.created.timestamp() if request.created else None
        since = f" for {waited / 60:.0f} min" if waited is not None else ""
        parts = [f"{node.logical}: candidate {node.candidate_label(at)}",
                 f"request {request.state}{since}"]
        if request.state == "FAILED":
            failure = capacity.classify(capacity.ApiError(request.error_code,
                                                          request.error_message), request.zone)
            parts.append(f"last failure: {failure.kind}")
        if request.state in ("WAITING_FOR_RESOURCES", "ACCEPTED") and waited is not None:
            left = node.max_wait_seconds - waited
            parts.append(f"next candidate in {left / 60:.0f} min" if left > 0 else
                         "past maxWait: `tpuctl recover --apply` moves it to the next candidate")
        lines.append("; ".join(parts))
    return lines


def unseen(target: StackTarget, nodes: list[NodeStatus], unread: Sequence[Unread]) -> list[str]:
    """Absent node ids, but for those in a (project, zone) that could not be read."""
    blind = {(u.project, u.zone) for u in unread}
    return [node_id for node_id in absent(target, nodes)
            if (n := target.expected(node_id)) is None or (n.project, n.zone) not in blind]


# The guide's rule of thumb: a TPU whose utilisation stays under about 30% should be
# swapped for a smaller one, or its code fixed (docs/tpu-facts.md, "How busy a TPU is").
UTILISATION_FLOOR = 0.30
# Waiting for input this share of the time or more, the pipeline is the first thing to fix.
INPUT_BOUND_SHARE = 0.5
INPUT_ADVICE = ("fix the input pipeline: interleave reads of many files in parallel, "
                "prefetch, more (and larger) shards, the data in the node's region ({region})")


def perf_of(job: dict[str, str]) -> dict[str, object]:
    """The agent's latest perf figures (docs/design.md, status `perf`); {} if none."""
    try:
        perf = json.loads(job.get("perf", ""))
    except ValueError:
        return {}
    return perf if isinstance(perf, dict) else {}


def perf_share(value: object) -> float | None:
    """A share of time in [0, inf) from the agent's perf figures, or None."""
    return float(value) if isinstance(value, (int, float)) and 0 <= value < float("inf") \
        else None


def utilisation_advice(node: NodeStatus) -> str | None:
    """What to do about a node whose model FLOPs utilisation is under the floor, or None.

    Input-bound (it waits for input half the time or more, or the time it does not wait
    would reach the floor): fix the pipeline. Otherwise the slice is larger than the job
    needs: the smallest offered slice of its generation on which the same work would reach
    the floor, with its price difference from the catalog.
    """
    perf = perf_of(node.job)
    mfu, wait = perf_share(perf.get("mfu")), perf_share(perf.get("inputWaitShare")) or 0.0
    if mfu is None or mfu >= UTILISATION_FLOOR:
        return None
    head = (f"{node.node_id}: its model FLOPs are {mfu:.1%} of the slice's peak (under "
            f"{UTILISATION_FLOOR:.0%}), and it waits for input {wait:.0%} of its time")
    busy = mfu / max(1e-9, 1 - wait)  # the utilisation while it is not waiting
    region = catalog.region_of(node.zone)
    if wait >= INPUT_BOUND_SHARE or busy >= UTILISATION_FLOOR:
        advice = f"input-bound: {INPUT_ADVICE.format(region=region)}"
        if busy < UTILISATION_FLOOR:
            advice += f"; then, still under {UTILISATION_FLOOR:.0%}: {smaller_slice(node, busy)}"
        return f"{head}: {advice}"
    return f"{head}: too large for the job: {smaller_slice(node, busy)}"


def smaller_slice(node: NodeStatus, busy: float) -> str:
    """The smallest slice of the node's generation on which its work would reach the
    floor, with how much less it costs an hour; or what to do when there is none."""
    try:
        tpu = catalog.parse_accelerator_type(node.accelerator_type)
    except catalog.CatalogError:
        return "a smaller slice (its type is not in the catalog)"
    gen, needed = tpu.generation, tpu.chips * busy / UTILISATION_FLOOR
    smaller = [catalog.Slice(gen, t) for t in catalog.default_topologies(gen)]
    fits = [s for s in smaller if needed <= s.chips < tpu.chips] or \
        [s for s in smaller if s.chips < tpu.chips][-1:]
    if not fits:
        return (f"{tpu.accelerator_type} is the smallest {gen.name} slice: make each step "
                f"bigger (a larger batch per core) or move to a cheaper generation")
    choice = min(fits, key=lambda s: s.chips)
    now, then = (catalog.usd_per_hour(s, spot=node.spot) for s in (tpu, choice))
    rate = "spot" if node.spot else "on-demand"
    saving = (f"${now - then:,.2f}/hour less at {rate} list prices" if now is not None
              and then is not None else f"no {gen.name} list price in the catalog")
    return (f"a smaller slice, e.g. {choice.accelerator_type} ({choice.chips} chips instead "
            f"of {tpu.chips}): {saving}; keep globalBatchSize a multiple of its "
            f"{choice.replicas} replicas and within its HBM")
# ---- per-team summary ------------------------------------------------------------
Use = tuple[str, str]  # (TPU family, capacity), as StackTarget.caps counts chips


@dataclass(frozen=True)
class TeamSummary:
    """One team's nodes as the API listed them, against its cap from the stack's settings."""

    team: str
    states: dict[str, int]  # node state -> nodes
    absent: int  # nodes the stack declares that the API does not have
    chips: dict[Use, int]  # in use: every node the API lists holds its chips
    cap: Mapping[Use, int] | None  # None: no cap in this stack (its own team)
    productive: float  # goodput seconds summed over the team's nodes
    accounted: float
    reporting: int  # nodes whose agent published goodput
    unread: int  # (project, zone) pairs of the team that could not be read

    @property
    def goodput(self) -> float | None:
        return 100.0 * self.productive / self.accounted if self.accounted else None

    @property
    def over_cap(self) -> list[Use]:
        cap = self.cap or {}
        return sorted(use for use, chips in self.chips.items()
                      if self.cap is not None and chips > cap.get(use, 0))


def team_of(target: StackTarget, node: NodeStatus) -> str:
    """The node's team: the stack config's, else its `team` label."""
    expected = target.expected(node.node_id)
    return expected.team if expected and expected.team else node.labels.get("team", "")


def team_summaries(
    target: StackTarget, nodes: Sequence[NodeStatus], unread: Sequence[Unread] = ()
) -> list[TeamSummary]:
    """One summary per team with nodes declared, listed or capped, by name."""
    listed: dict[str, list[NodeStatus]] = {}
    for node in nodes:
        listed.setdefault(team_of(target, node), []).append(node)
    declared: dict[str, list[ExpectedNode]] = {}
    for expected in target.nodes:
        declared.setdefault(expected.team, []).append(expected)
    teams = sorted((set(declared) | set(target.caps) | set(listed)) - {""})
    missing = set(unseen(target, list(nodes), unread))
    return [_summary(target, team, listed.get(team, []), declared.get(team, []), missing,
                     unread) for team in teams]


def _summary(target: StackTarget, team: str, nodes: list[NodeStatus],
             declared: list[ExpectedNode], missing: set[str],
             unread: Sequence[Unread]) -> TeamSummary:
    chips: Counter[Use] = Counter()
    productive = accounted = 0.0
    reporting = 0
    for node in nodes:
        use = _use(target, node)
        if use is not None:
            chips[use[0]] += use[1]
        seconds = _goodput_seconds(node.job)
        if seconds is not None:
            productive, accounted, reporting = (productive + seconds[0], accounted + seconds[1],
                                                reporting + 1)
    places = {(n.project, n.zone) for n in declared}
    return TeamSummary(
        team, dict(sorted(Counter(n.state for n in nodes).items())),
        sum(1 for n in declared if n.node_id in missing), dict(chips),
        target.caps.get(team), productive, accounted, reporting,
        sum(1 for u in unread if (u.project, u.zone) in places))


def _use(target: StackTarget, node: NodeStatus) -> tuple[Use, int] | None:
    """((family, capacity), chips) of a listed node; None for a type the catalog lacks."""
    tpu = _slice(node.accelerator_type)
    if tpu is None:
        return None
    expected = target.expected(node.node_id)
    capacity = expected.capacity if expected and expected.capacity else (
        "spot" if node.spot else "onDemand")
    return (tpu.generation.name, capacity), tpu.chips


@lru_cache(maxsize=64)
def _slice(accelerator_type: str) -> catalog.Slice | None:
    try:
        return catalog.parse_accelerator_type(accelerator_type)
    except catalog.CatalogError:
        return None


def _goodput_seconds(job: dict[str, str]) -> tuple[float, float] | None:
    """(productive, all accounted) seconds of the agent's goodput, or None."""
    try:
        goodput = json.loads(job.get("goodput", ""))
        productive, total = goodput["productive"], goodput["total"]
    except (ValueError, TypeError, KeyError):
        return None
    numbers = all(isinstance(x, (int, float)) and x >= 0 for x in (productive, total))
    return (float(productive), float(total)) if numbers and total > 0 else None


def spend_of(target: StackTarget, team: str, nodes: Sequence[NodeStatus],
             now: datetime) -> meter.TeamSpend:
    """The team's spend this budget month by the meter (model/meter.py)."""
    counted = [meter.metered(n.name, n.accelerator_type, n.spot, n.state, n.created)
               for n in nodes]
    return meter.team_spend(team, [m for m in counted if m is not None],
                            target.budgets.get(team), now)


def node_lost_usd(node: NodeStatus) -> float | None:
    """Goodput's lost time of `node` (every second not `productive`: idle, restarts, lost
    progress) priced at its list price; None without goodput or a price."""
    try:
        goodput = json.loads(node.job.get("goodput", ""))
    except ValueError:
        return None
    if not isinstance(goodput, dict):
        return None
    return meter.lost_usd(goodput, spend.hourly_usd(price_table(), node.accelerator_type,
                                                    node.spot))


def lost_usd(nodes: Sequence[NodeStatus]) -> float | None:
    """node_lost_usd summed over the nodes that have one; None when none has."""
    figures = [usd for node in nodes if (usd := node_lost_usd(node)) is not None]
    return sum(figures) if figures else None


def of_team(target: StackTarget, nodes: Sequence[NodeStatus], team: str) -> list[NodeStatus]:
    """The nodes of `team` (by the stack config, else by their `team` label)."""
    return [n for n in nodes if team_of(target, n) in (team, label_value(team))]


def node_reached(node: NodeStatus, until: Until) -> bool:
    if until == "done":
        return node.job.get("state") == FINISHED
    if node.state != "READY":
        return False
    return until == "ready" or node.job.get("state") in {"running", FINISHED}


def reached(target: StackTarget, nodes: list[NodeStatus], until: Until) -> bool:
    """Has every node of the stack got to `until`?"""
    if absent(target, nodes) or not nodes:
        return False
    return all(node_reached(node, until) for node in nodes)


# A queued request in these states provisions nothing more by itself
# (cloud.google.com/tpu/docs/queued-resources, request states).
QUEUED_DEAD_ENDS = {"FAILED", "SUSPENDED"}


def stuck(nodes: list[NodeStatus], queued: Sequence[QueuedStatus] = ()) -> list[str]:
    """Why waiting further is pointless: failed jobs, preempted or terminated nodes,
    queued requests that failed or were suspended before their node came."""
    reasons = [
        f"{n.node_id}: job failed: {n.job.get('message', '')}".rstrip(": ")
        for n in nodes
        if n.job.get("state") == "failed"
    ]
    reasons += [
        f"{n.node_id} is {n.state}" for n in nodes if n.state in {"PREEMPTED", "TERMINATED"}
    ]
    present = {n.node_id for n in nodes}
    reasons += [
        # The controller's plan (ops/controller/views.py): placement moves a fallback
        # node's request (recover), the limits delete another's (janitor).
        f"queued resource {q.name} is {q.state}: `tpuctl recover --apply` moves a fallback "
        f"node's request on, `tpuctl janitor --apply` deletes another's"
        for q in queued
        if q.state in QUEUED_DEAD_ENDS and not present & set(q.node_ids)
    ]
    return reasons


@dataclass(frozen=True)
class WaitOutcome:
    reached: bool
    nodes: list[NodeStatus]
    reason: str
    unread: tuple[Unread, ...] = ()
    queued: tuple[QueuedStatus, ...] = ()  # the last read of the stack's queued resources


def unread_reasons(unread: Sequence[Unread]) -> list[str]:
    """Pairs that cannot be read until someone acts (IAM, the stack's zones)."""
    return [f"{u.project} {u.zone} cannot be read: {u.error}" for u in unread if u.lasting]


def wait_until(
    api: TpuApi,
    target: StackTarget,
    until: Until,
    timeout: float,
    poll: float,
    on_poll: Callable[[list[NodeStatus], float], None] = lambda _nodes, _elapsed: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_candidates: Callable[[list[str]], None] = lambda _lines: None,
) -> WaitOutcome:
    """Poll until `until`, a problem, or `timeout`. `on_candidates` gets, at every poll
    that reads the queued resources, each fallback node's candidate line (candidate_lines:
    where its request is, for how long, the last failure, the time to the next one)."""
    start = clock()
    while True:
        read = read_stack(api, target)
        nodes, unread = read.items, read.unread
        elapsed = clock() - start
        on_poll(nodes, elapsed)
        if not unread and reached(target, nodes, until):
            return WaitOutcome(True, nodes, f"{until} after {elapsed:.0f} s")
        queued = read_queued(api, target)
        on_candidates(candidate_lines(target, queued.items, time.time()))
        unread = sorted(set(unread) | set(queued.unread))
        problems = unread_reasons(unread) + stuck(nodes, queued.items)
        if problems:
            return WaitOutcome(False, nodes, "; ".join(problems), tuple(unread),
                               tuple(queued.items))
        if elapsed >= timeout:
            more = f"; {len(unread)} (project, zone) unread" if unread else ""
            return WaitOutcome(False, nodes, f"not {until} after {timeout:.0f} s{more}",
                               tuple(unread), tuple(queued.items))
        sleep(poll)
