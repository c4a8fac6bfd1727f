"""`tpuctl status` and `tpuctl wait`: the stack's nodes, their health and their jobs."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from rich.console import RenderableType
from rich.table import Table
from rich.text import Span, Text

from components.archive import REPO_ROOT
from node_agent.common import parse_utc
from ops.tpu import logs as agent_logs
from ops.tpu.api import READABLE_STATES, STATUS_KEYS, NodeStatus, QueuedStatus, TpuApi
from ops.tpu.target import StackTarget

Until = Literal["ready", "running", "done"]
UNTIL_CHOICES: tuple[Until, ...] = ("ready", "running", "done")
# The agent's job states (docs/design.md, "The training package").
FINISHED = "succeeded"
ACTIVE_JOB = {"installing", "running", "retrying", "waiting-for-data", "hung"}
# States whose job has a phase under way (docs/design.md, "Deadlines").
PHASE_STATES = {"running", "hung"}
# `tpuctl rehearse --stack <s>` keeps the emulator's status objects here (ops/local/rehearse.py,
# keep_status): status-objects/worker-<n>/status.json, as under the node's status prefix.
REHEARSAL_ROOT = REPO_ROOT / ".cache" / "rehearse"
REHEARSED = "REHEARSED"
STATE_STYLE = {"READY": "green", REHEARSED: "cyan", "CREATING": "yellow", "PREEMPTED": "red",
               "TERMINATED": "red"}


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


def rehearsal_status(stack: str, root: Path | None = None) -> Path:
    return (root or REHEARSAL_ROOT) / stack / "status-objects" / agent_logs.WORKER0_STATUS


def rehearsed(target: StackTarget, root: Path | None = None) -> list[NodeStatus]:
    """Offline: the node the stack's last rehearsal booted, with the status its agent
    left in the emulator; [] when the stack was never rehearsed here."""
    path = rehearsal_status(target.stack, root)
    try:
        fields = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    node = target.expected(str(fields.get("node", "")))
    if node is None:
        return []
    job = {key: value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
           for key, value in fields.items() if key in STATUS_KEYS}
    return [NodeStatus(node.zone, node.node_id, REHEARSED, "", node.tpu.accelerator_type,
                       node.runtime_version, node.spot, {}, {}, "", job=job,
                       project=node.project)]


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


COLUMNS = ("node", "zone", "type", "state", "health", "job", "step", "phase", "goodput",
           "message", "updated")
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
    if len(rows) > BOXED_ROWS:
        return plain_columns(title, rows)
    table = Table(title=title)
    for column in COLUMNS:
        table.add_column(column)
    for cells, style in rows:
        table.add_row(*(Text(cell, style=style if i == 3 else "") for i, cell in enumerate(cells)))
    return table


def status_rows(
    target: StackTarget, nodes: list[NodeStatus], queued: Sequence[QueuedStatus], missing: str,
    now: float | None = None,
) -> list[Row]:
    now = time.time() if now is None else now
    rows = []
    for node in nodes:
        job = node.job
        health = "; ".join((node.health, *node.symptoms)).strip("; ")
        cells = (node.node_id, node.zone, node.accelerator_type, node.state, health,
                 job.get("state", "-"), job.get("step", ""), job_phase(job, now),
                 goodput_percent(job),
                 job.get("message", ""), job.get("updated", ""))
        rows.append((cells, STATE_STYLE.get(node.state, "")))
    requests = {node_id: q.state for q in queued for node_id in q.node_ids}
    zones = {node.node_id: node.zone for node in target.nodes}
    for node_id in absent(target, nodes):
        state = f"QUEUED {requests[node_id]}" if node_id in requests else missing
        cells = (node_id, zones[node_id], "", state, "", "-", "", "", "", "", "")
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


def job_phase(job: dict[str, str], now: float) -> str:
    """The phase of a running or hung job and the seconds since its last progress line
    (the agent's `phase` and `progressAt`), e.g. "execution 12s"; "" otherwise."""
    phase = job.get("phase", "")
    if job.get("state") not in PHASE_STATES or not phase:
        return ""
    at = parse_utc(job.get("progressAt", ""))
    return phase if at is None else f"{phase} {max(0.0, now - at):.0f}s"


def goodput_percent(job: dict[str, str]) -> str:
    """The agent's goodput percent (docs/design.md, "Goodput"), e.g. "96.5%"; "" if none."""
    try:
        percent = json.loads(job.get("goodput", "")).get("percent")
    except (ValueError, AttributeError):
        return ""
    return f"{percent:.1f}%" if isinstance(percent, (int, float)) else ""


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
