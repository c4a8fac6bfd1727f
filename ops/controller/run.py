"""One controller run: lease, read, plan, apply, audit (ops/controller/__init__.py).

The actual state is read with lists only: per (project, zone) pair where a manifest's
node may live, one node list and one queued-resource list (every page), the pairs
concurrently (ops/tpu/api.py each_place). A pair that fails to list is recorded and
plans nothing (plan.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from model.budget_hold import budget_hold
from model.manifest import Manifest
from ops.controller import plan as planner
from ops.controller.agents import needs_status, read_agents
from ops.controller.apply import Applier, Outcome
from ops.controller.spend_lines import budget_lines  # issue 46
from ops.controller.store import Store, run_id
from ops.tpu.api import NodeStatus, QueuedStatus, TpuApi, parent

DEFAULT_INTERVAL_SECONDS = 300.0  # Cloud Scheduler every 5 minutes (components/controller.py)


@dataclass(frozen=True)
class ActualRead:
    actual: planner.Actual
    raw_queued: Mapping[str, Any]  # name -> tpu_v2.QueuedResource, as listed
    unread: Sequence[str] = ()  # one line per pair not read


@dataclass
class RunResult:
    record: dict[str, Any]
    steps: list[planner.Step] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def acted(self) -> bool:
        return bool(self.record.get("leased"))


def places(manifests: Iterable[Manifest]) -> set[tuple[str, str]]:
    """Every (project, zone) where a manifest's node or one of its candidates may live."""
    nodes = {(node.project, zone) for m in manifests for node in m.target.nodes
             for zone in node.zones}
    return nodes | {(t.project, zone) for m in manifests for t in m.budget_teams
                    for zone in t.zones}


def read_actual(api: TpuApi, manifests: Sequence[Manifest]) -> ActualRead:
    def listed(project: str, zone: str) -> tuple[list[NodeStatus], list[Any]]:
        where = parent(project, zone)
        nodes = [NodeStatus.from_node(n) for n in api.call("list_nodes", zone, parent=where)]
        return nodes, api.call("list_queued_resources", zone, parent=where)

    found, unread = api.each_place(places(manifests), listed)
    nodes = [n for pair_nodes, _ in found.values() for n in pair_nodes]
    raw = {q.name: q for _, pair_queued in found.values() for q in pair_queued}
    queued = [QueuedStatus.from_queued(q) for q in raw.values()]
    actual = planner.Actual(nodes, queued, frozenset((u.project, u.zone) for u in unread))
    return ActualRead(actual, raw, [f"{u.project}/{u.zone}: {u.error}" for u in unread])


def held_teams(marker_names: Sequence[str], manifests: Sequence[Manifest],
               now: datetime) -> dict[str, str]:
    """Teams a budget stop holds now (model/budget_hold.py), with the hold's words."""
    teams = {node.team for m in manifests for node in m.target.nodes if node.team}
    teams |= {t.team for m in manifests for t in m.budget_teams}
    held = {}
    for team in sorted(teams):
        hold = budget_hold(team, marker_names, now)
        if hold is not None:
            held[team] = f"budget stop in {hold.interval}, held until {hold.until:%Y-%m-%d}"
    return held


def run_once(store: Store, api: TpuApi, *, apply: bool = True,
             clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
             interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
             checkpoint: Callable[[str], None] = lambda _phase: None,
             agents: Mapping[str, Mapping[str, str]] | None = None,
             manifests: Sequence[Manifest] | None = None) -> RunResult:
    """One run. `apply=False` plans only (tpuctl reconcile's dry run): no lease, no
    change, no audit; a bucket it cannot read then plans without moves and holds, and
    says so. `manifests`: these stacks only (tpuctl reconcile --stack), not the bucket's."""
    started = clock()
    record: dict[str, Any] = {"run": run_id(started), "started": started.isoformat(),
                              "intervalSeconds": interval_seconds, "leased": False}
    lease = store.try_lease(record["run"], started, interval_seconds) if apply else None
    if apply and lease is None:
        record.update(finished=clock().isoformat(), note="another run holds this slot's lease")
        return RunResult(record)
    problems: list[str] = []
    if manifests is None:
        manifests, problems = store.manifests()
    read = read_actual(api, manifests)
    moves, markers = _bookkeeping(store, strict=apply, problems=problems)
    if agents is None and any(needs_status(m) for m in manifests):
        agents = read_agents(store.client, manifests, read.actual.nodes, problems)
    inputs = planner.Inputs(manifests, read.actual, started,
                            held_teams(markers, manifests, started), moves, agents or {})
    steps = planner.plan(inputs)
    record["budgets"] = budget_lines(manifests, read.actual, places(manifests), started)
    outcomes: list[Outcome] = []
    if lease is not None:
        expected = {(m.target.stack, n.node_id): n for m in manifests for n in m.target.nodes}
        applier = Applier(api, store, read.raw_queued, {n.name: n for n in read.actual.nodes},
                          list(moves), clock, expected, lambda: lease.left(clock()), checkpoint)
        outcomes = applier.apply(steps)
        store.release(lease)
    record.update(leased=lease is not None, stacks=[m.target.stack for m in manifests],
                  problems=problems, unread=list(read.unread), heldTeams=inputs.held_teams,
                  steps=[o.to_json() for o in outcomes] if lease else
                  [s.to_json() for s in steps], finished=clock().isoformat())
    if lease is not None:
        record["audit"] = store.write_audit(record)
    return RunResult(record, steps, outcomes)


def _bookkeeping(store: Store, strict: bool, problems: list[str]
                 ) -> tuple[list[planner.Move], list[str]]:
    """The moves in flight and the budget markers; a dry run that cannot read them
    plans without (and says so), a run that acts cannot."""
    try:
        return store.moves(), store.marker_names()
    except Exception as error:
        if strict:
            raise
        problems.append(f"gs://{store.bucket_name} not read ({type(error).__name__}: "
                        f"{error}): planned without moves in flight and budget holds")
        return [], []


def last_run_lines(record: Mapping[str, Any] | None, now: datetime) -> tuple[list[str], bool]:
    """`tpuctl status`'s lines on the controller's last run, and whether they warn: a
    controller not run for three intervals is a warning."""
    if record is None:
        return ["controller: no run recorded yet"], True
    finished = datetime.fromisoformat(str(record.get("finished") or record["started"]))
    age = (now - finished).total_seconds()
    interval = float(record.get("intervalSeconds") or DEFAULT_INTERVAL_SECONDS)
    steps = record.get("steps") or []
    done = sum(1 for s in steps if s.get("result") == "done")
    failed = sum(1 for s in steps if s.get("result") == "failed")
    lines = [f"controller: last run {record['run']}, {age / 60:.0f} min ago, {len(steps)} "
             f"step(s): {done} done, {failed} failed"]
    lines += [f"  {s['verb']} {s['node']} ({s.get('result', 'planned')}): {s['reason']}"
              for s in steps[:10]]
    # A team stack's manifest missing or refused, a logs bucket not listed (store.py).
    lines += [f"  problem: {problem}" for problem in (record.get("problems") or [])[:10]]
    stale = age > 3 * interval
    if stale:
        lines.append(f"warning: the controller has not run for {age / 60:.0f} min, more than "
                     f"three intervals ({3 * interval / 60:.0f} min): check its Cloud "
                     f"Scheduler job and function logs")
    return lines, stale
