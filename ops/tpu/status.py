"""`tpuctl status` and `tpuctl wait`: the stack's nodes, their health and their jobs."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Span, Text

from components import catalog
from components.archive import REPO_ROOT
from ops.local import rehearsal_record as record
from ops.tpu import logs as agent_logs
from ops.tpu.api import READABLE_STATES, STATUS_KEYS, NodeStatus, QueuedStatus, TpuApi
from ops.tpu.target import StackTarget

Until = Literal["ready", "running", "done"]
UNTIL_CHOICES: tuple[Until, ...] = ("ready", "running", "done")
# The agent's job states (docs/design.md, "The training package").
FINISHED = "succeeded"
ACTIVE_JOB = {"installing", "running", "retrying", "waiting-for-data"}
# `tpuctl rehearse --stack <s>` keeps each node's status objects here (ops/local/rehearse.py,
# keep_status): <node>/status-objects/worker-<n>/status.json, as under the node's prefix.
REHEARSAL_ROOT = REPO_ROOT / ".cache" / "rehearse"
REHEARSED = "REHEARSED"
STATE_STYLE = {"READY": "green", REHEARSED: "cyan", f"{REHEARSED} (stale)": "yellow",
               "CREATING": "yellow", "PREEMPTED": "red", "TERMINATED": "red"}


def collect(
    api: TpuApi, target: StackTarget, logs: agent_logs.AgentLogs | None = None
) -> list[NodeStatus]:
    """Every node of the stack (one list per zone) with its agent's job status.

    The status comes from one listing of the logs bucket (the agents' status.json
    metadata) where it is there, else from the node's guest attributes: one call per
    node, so only for the nodes the listing lacks (an older agent, no storage access).
    """
    nodes = api.stack_nodes(target.places, target.stack)
    readable = [n for n in nodes if n.state in READABLE_STATES]
    logs = logs or agent_logs.AgentLogs(target.project, auth=target.auth())
    listed = agent_logs.published_jobs(logs, readable) if readable else {}
    asked = api.with_job_status([n for n in readable if (n.zone, n.node_id) not in listed])
    jobs = listed | {(n.zone, n.node_id): n.job for n in asked}
    return [replace(n, job=jobs.get((n.zone, n.node_id), {})) for n in nodes]


def rehearsal_dir(stack: str, root: Path | None = None) -> Path:
    """Where the stack's rehearsals are: a folder per node (ops/local/rehearsal_record.py)."""
    return (root or REHEARSAL_ROOT) / stack


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


def collect_queued(api: TpuApi, target: StackTarget) -> list[QueuedStatus]:
    """The stack's queued resources; no call at all for a stack without queued nodes."""
    if not target.queued_node_ids:
        return []
    places = {(node.project, node.zone) for node in target.nodes if node.queued}
    return api.stack_queued(places, target.queued_node_ids)


def absent(target: StackTarget, nodes: list[NodeStatus]) -> list[str]:
    """Node ids the stack config names that the API does not have."""
    present = {node.node_id for node in nodes}
    return [node.node_id for node in target.nodes if node.node_id not in present]


COLUMNS = ("node", "zone", "type", "state", "health", "job", "step", "goodput", "input wait",
           "MFU", "message", "updated")
# Up to this many rows a boxed rich Table; past it aligned plain columns, because rich
# measures and renders every cell on its own (2,000 rows took seconds, bench/status_scale.py).
BOXED_ROWS = 200
Row = tuple[tuple[str, ...], str]  # the cells and the style of the state cell
GAP = "  "


def status_table(
    target: StackTarget,
    nodes: list[NodeStatus],
    queued: Sequence[QueuedStatus] = (),
    rehearsal: Path | None = None,
) -> RenderableType:
    """One row per node; with `rehearsal`, the offline view of that rehearsal's state.
    Every cell is text as it is: a job's message `[line 3 ...]` is no markup."""
    source = f"rehearsal, offline: {rehearsal}" if rehearsal else ", ".join(target.projects)
    title = f"stack {target.stack} ({source})"
    rows = status_rows(target, nodes, queued, "not rehearsed" if rehearsal else "ABSENT")
    advice = [line for node in nodes if (line := utilisation_advice(node))]
    notes = Text("\n".join(advice), style="yellow") if advice else None
    if len(rows) > BOXED_ROWS:
        listing = plain_columns(title, rows)
        return Group(listing, notes) if notes else listing
    table = Table(title=title)
    for column in COLUMNS:
        table.add_column(column)
    for cells, style in rows:
        table.add_row(*(Text(cell, style=style if i == 3 else "") for i, cell in enumerate(cells)))
    return Group(table, notes) if notes else table


def status_rows(
    target: StackTarget, nodes: list[NodeStatus], queued: Sequence[QueuedStatus], missing: str
) -> list[Row]:
    rows = []
    for node in nodes:
        job = node.job
        health = "; ".join((node.health, *node.symptoms)).strip("; ")
        cells = (node.node_id, node.zone, node.accelerator_type, node.state, health,
                 job.get("state", "-"), job.get("step", ""), goodput_percent(job),
                 *perf_cells(job), job.get("message", ""), job.get("updated", ""))
        rows.append((cells, STATE_STYLE.get(node.state, "")))
    requests = {node_id: q.state for q in queued for node_id in q.node_ids}
    zones = {node.node_id: node.zone for node in target.nodes}
    for node_id in absent(target, nodes):
        state = f"QUEUED {requests[node_id]}" if node_id in requests else missing
        cells = (node_id, zones[node_id], "", state, "", "-", "", "", "", "", "", "")
        rows.append((cells, "red" if state == "ABSENT" else ""))
    return rows


def plain_columns(title: str, rows: list[Row]) -> Text:
    """The rows as left-aligned columns under a bold header, lines never wrapped."""
    widths = [max(len(column), *(len(cells[i]) for cells, _ in rows))
              for i, column in enumerate(COLUMNS)]
    state_at = sum(widths[:3]) + 3 * len(GAP)

    def line(cells: tuple[str, ...]) -> str:
        return GAP.join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    lines = [title, line(COLUMNS)]
    spans = [Span(len(title) + 1, len(title) + 1 + len(lines[1]), "bold")]
    offset = len(title) + len(lines[1]) + 2
    for cells, style in rows:
        lines.append(line(cells))
        if style:
            spans.append(Span(offset + state_at, offset + state_at + len(cells[3]), style))
        offset += len(lines[-1]) + 1
    return Text("\n".join(lines), spans=spans, no_wrap=True, overflow="ellipsis")


def goodput_percent(job: dict[str, str]) -> str:
    """The agent's goodput percent (docs/design.md, "Goodput"), e.g. "96.5%"; "" if none."""
    try:
        percent = json.loads(job.get("goodput", "")).get("percent")
    except (ValueError, AttributeError):
        return ""
    return f"{percent:.1f}%" if isinstance(percent, (int, float)) else ""


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


def _share(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and 0 <= value < float("inf") \
        else None


def perf_cells(job: dict[str, str]) -> tuple[str, str]:
    """The input-wait and MFU cells: "62%", "8.1% LOW" under the floor, "na" off a TPU."""
    perf = perf_of(job)
    wait, mfu = _share(perf.get("inputWaitShare")), _share(perf.get("mfu"))
    wait_cell = "" if wait is None else f"{wait:.0%}"
    if mfu is None:
        return wait_cell, "na" if perf.get("mfu") == "na" else ""
    low = " LOW" if mfu < UTILISATION_FLOOR else ""
    return wait_cell, f"{mfu:.1%}{low}"


def utilisation_advice(node: NodeStatus) -> str | None:
    """What to do about a node whose model FLOPs utilisation is under the floor, or None.

    Input-bound (it waits for input half the time or more, or the time it does not wait
    would reach the floor): fix the pipeline. Otherwise the slice is larger than the job
    needs: the smallest offered slice of its generation on which the same work would reach
    the floor, with its price difference from the catalog.
    """
    perf = perf_of(node.job)
    mfu, wait = _share(perf.get("mfu")), _share(perf.get("inputWaitShare")) or 0.0
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
        f"queued resource {q.name} is {q.state}: `tpuctl recover --apply` re-queues it"
        for q in queued
        if q.state in QUEUED_DEAD_ENDS and not present & set(q.node_ids)
    ]
    return reasons


@dataclass(frozen=True)
class WaitOutcome:
    reached: bool
    nodes: list[NodeStatus]
    reason: str


def wait_until(
    api: TpuApi,
    target: StackTarget,
    until: Until,
    timeout: float,
    poll: float,
    on_poll: Callable[[list[NodeStatus], float], None] = lambda _nodes, _elapsed: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> WaitOutcome:
    start = clock()
    while True:
        nodes = collect(api, target)
        elapsed = clock() - start
        on_poll(nodes, elapsed)
        if reached(target, nodes, until):
            return WaitOutcome(True, nodes, f"{until} after {elapsed:.0f} s")
        problems = stuck(nodes, collect_queued(api, target))
        if problems:
            return WaitOutcome(False, nodes, "; ".join(problems))
        if elapsed >= timeout:
            return WaitOutcome(False, nodes, f"not {until} after {timeout:.0f} s")
        sleep(poll)
