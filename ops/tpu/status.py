"""`tpuctl status` and `tpuctl wait`: the stack's nodes, their health and their jobs."""

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

from rich.cells import cell_len, set_cell_size
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text

from functions.budget_stop import spend
from model import catalog, meter
from model.archive import REPO_ROOT
from model.meter import price_table
from model.naming import label_value
from node_agent.common import parse_utc
from node_agent.contract import UNFINISHED_STATES
from ops.local import rehearsal_record as record
from ops.tpu import logs as agent_logs
from ops.tpu.api import (
    READABLE_STATES,
    STATUS_KEYS,
    NodeStatus,
    QueuedStatus,
    Read,
    TpuApi,
    Unread,
)
from ops.tpu.target import ExpectedNode, StackTarget

Until = Literal["ready", "running", "done"]
UNTIL_CHOICES: tuple[Until, ...] = ("ready", "running", "done")
# The agent's job states (docs/design.md, "The training package").
FINISHED = "succeeded"
# Jobs not finished: one definition with the agent's (node_agent/contract.py).
ACTIVE_JOB = set(UNFINISHED_STATES)
# States whose job has a phase under way (docs/design.md, "Deadlines").
PHASE_STATES = {"running", "hung"}
# `tpuctl rehearse --stack <s>` keeps each node's status objects here (ops/local/rehearse.py,
# keep_status): <node>/status-objects/worker-<n>/status.json, as under the node's prefix.
REHEARSAL_ROOT = REPO_ROOT / ".cache" / "rehearse"
REHEARSED = "REHEARSED"
STATE_STYLE = {"READY": "green", REHEARSED: "cyan", f"{REHEARSED} (stale)": "yellow",
               "CREATING": "yellow", "PREEMPTED": "red", "TERMINATED": "red"}


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
    """Where the stack's rehearsals are: a folder per node (ops/local/rehearsal_record.py)."""
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


@dataclass(frozen=True)
class Column:
    """A status column; `narrow`: shown by default, the rest with `--wide`; `filled`:
    shown only where some row has a value (a column only some stacks fill: lost $ for
    a node with goodput, agent for an agent that publishes its version and health, not
    a rehearsal's). A new column is one entry here and its cell in status_rows (seam S7)."""

    header: str
    narrow: bool = False
    filled: bool = False


# The narrow table (what a user needs first: which node, its state and health, how far
# its job is, and its message) fits 100 columns on a terminal: rich wraps a long message
# or health inside its cell there (off a terminal nothing wraps, ops/terminal.py);
# `--wide` shows every column.
COLUMNS = (Column("node", narrow=True), Column("zone"), Column("type"),
           Column("state", narrow=True), Column("health", narrow=True),
           Column("job", narrow=True),
           Column("step", narrow=True), Column("phase"), Column("goodput", narrow=True),
           Column("lost $", filled=True), Column("input wait"), Column("MFU"),
           Column("message", narrow=True), Column("updated"), Column("agent", filled=True))
# Up to this many rows a boxed rich Table; past it aligned plain columns, because rich
# measures and renders every cell on its own (2,000 rows took seconds, bench/status_scale.py).
BOXED_ROWS = 200
Row = tuple[tuple[str, ...], str]  # the cells (every column's) and the style of the state cell
GAP = "  "
# Never folded or cut: a name is copied from the table.
WHOLE = {"node", "zone", "type"}


def shown(wide: bool, rows: Sequence[Row] = ()) -> list[int]:
    """The columns to show: the narrow ones, or with `wide` every one; a `filled` column
    only where some row has a value in it."""
    return [i for i, column in enumerate(COLUMNS) if (wide or column.narrow)
            and (not column.filled or any(i < len(cells) and cells[i] for cells, _ in rows))]


def status_table(
    target: StackTarget,
    nodes: list[NodeStatus],
    queued: Sequence[QueuedStatus] = (),
    rehearsal: Path | None = None,
    unread: Sequence[Unread] = (),
    *,
    wide: bool = False,
) -> RenderableType:
    """One row per node; with `rehearsal`, the offline view of that rehearsal's state.
    Every cell is text as it is: a job's message `[line 3 ...]` is no markup. A node
    whose (project, zone) is `unread` gets no row: unread_table has one for its pair.
    The narrow columns, or with `wide` every one; a long value wraps inside its cell,
    never cut, and a name is never broken."""
    source = f"rehearsal, offline: {rehearsal}" if rehearsal else ", ".join(target.projects)
    title = f"stack {target.stack} ({source})"
    rows = status_rows(target, nodes, queued, "not rehearsed" if rehearsal else "ABSENT", unread)
    columns = shown(wide, rows)
    rows = [(tuple(cells[i] for i in columns), style) for cells, style in rows]
    headers = [COLUMNS[i].header for i in columns]
    advice = [line for node in nodes if (line := utilisation_advice(node))]
    advice += candidate_lines(target, queued, time.time())
    notes = Text("\n".join(advice), style="yellow") if advice else None
    if len(rows) > BOXED_ROWS:
        listing = plain_columns(title, headers, rows)
        return Group(listing, notes) if notes else listing
    table = Table()
    state = headers.index("state")
    for i, header in enumerate(headers):
        whole = header in WHOLE
        longest = max((len(cells[i]) for cells, _ in rows), default=0)
        table.add_column(header, overflow="fold", no_wrap=whole,
                         min_width=longest if whole else None)
    for cells, style in rows:
        table.add_row(*(Text(cell, style=style if i == state else "")
                        for i, cell in enumerate(cells)))
    # The title on a line of its own: as a Table title rich would wrap it to the table.
    return Group(Text(title), table, *([notes] if notes else []))


def status_rows(
    target: StackTarget, nodes: list[NodeStatus], queued: Sequence[QueuedStatus], missing: str,
    unread: Sequence[Unread] = (),
    now: float | None = None,
) -> list[Row]:
    """Every column's cells (in COLUMNS' order) for each node, then each absent one."""
    now = time.time() if now is None else now
    rows = []
    for node in nodes:
        job = node.job
        health = "; ".join((node.health, *node.symptoms)).strip("; ")
        cells = (node.node_id, node.zone, node.accelerator_type, node.state, health,
                 job.get("state", "-"), job.get("step", ""), job_phase(job, now),
                 goodput_percent(job), lost_usd_cell(node), *perf_cells(job),
                 job.get("message", ""), job.get("updated", ""), agent_cell(job))
        rows.append((cells, STATE_STYLE.get(node.state, "")))
    requests = {node_id: q.state for q in queued for node_id in q.node_ids}
    zones = {node.node_id: node.zone for node in target.nodes}
    for node_id in unseen(target, nodes, unread):
        state = f"QUEUED {requests[node_id]}" if node_id in requests else missing
        cells = (node_id, zones[node_id], "", state, "", "-", "", "", "", "", "", "", "", "")
        rows.append((cells, "red" if state == "ABSENT" else ""))
    return rows


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


def unread_table(target: StackTarget, unread: Sequence[Unread]) -> Table:
    """One row per (project, zone) the TPU API could not be read at, and why."""
    table = Table(title=f"could not read {len(unread)} of {len(target.places)} "
                        f"(project, zone) pairs; nodes there are not shown")
    for column in ("project", "zone", "error"):
        table.add_column(column)
    for item in unread:
        table.add_row(item.project, item.zone, Text(item.error, style="red"))
    return table


def plain_columns(title: str, headers: list[str], rows: list[Row]) -> PlainColumns:
    """The rows as left-aligned columns under a bold header, lines never wrapped."""
    widths = [max(len(header), *(len(cells[i]) for cells, _ in rows))
              for i, header in enumerate(headers)]
    state = headers.index("state")
    state_at = sum(widths[:state]) + state * len(GAP)

    def line(cells: Sequence[str]) -> str:
        return GAP.join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    lines = [(line(cells), state_at, state_at + len(cells[state]), style)
             for cells, style in rows]
    return PlainColumns(title, line(headers), lines)


@dataclass(frozen=True)
class PlainColumns:
    """Ready-made lines, each cut to the width with an ellipsis, never wrapped: rich's
    Text measures and wraps every line of a long text (2.4 s of 10,000 rows,
    bench/status_scale.py); these go out as they are."""

    title: str
    header: str
    lines: list[tuple[str, int, int, str]]  # text, where the styled state starts, ends, style

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width, newline = options.max_width, Segment.line()
        styles = {style: console.get_style(style) for *_, style in self.lines if style}
        yield from (Segment(_cut(self.title, width)), newline,
                    Segment(_cut(self.header, width), Style(bold=True)), newline)
        for text, start, end, style in self.lines:
            text = _cut(text, width)
            if style and start < len(text):
                yield Segment(text[:start])
                yield Segment(text[start:end], styles[style])
                yield Segment(text[end:])
            else:
                yield Segment(text)
            yield newline


def _cut(line: str, width: int) -> str:
    if len(line) <= width and (line.isascii() or cell_len(line) <= width):
        return line
    return set_cell_size(line, width - 1) + "…"


def job_phase(job: dict[str, str], now: float) -> str:
    """The phase of a running or hung job and the seconds since its last progress line
    (the agent's `phase` and `progressAt`), e.g. "execution 12s"; "" otherwise."""
    phase = job.get("phase", "")
    if job.get("state") not in PHASE_STATES or not phase:
        return ""
    at = parse_utc(job.get("progressAt", ""))
    return phase if at is None else f"{phase} {max(0.0, now - at):.0f}s"


def agent_cell(job: dict[str, str]) -> str:
    """The node agent's version and health (its `agent` status field, docs/design.md):
    `3f2a1b9c0d1e ok`, or what is wrong: loops stuck past their bound (systemd restarts
    such an agent), exceptions its loops caught, threads restarted, a new agent refused."""
    try:
        agent = json.loads(job.get("agent", ""))
    except ValueError:
        return ""
    if not isinstance(agent, dict) or not agent.get("version"):
        return ""
    problems = [f"stuck: {','.join(map(str, agent['stuck']))}"] if agent.get("stuck") else []
    problems += [f"{agent[key]} {what}" for key, what in (
        ("threadFaults", "faults"), ("threadRestarts", "restarts")) if agent.get(key)]
    if agent.get("refused"):
        problems.append(f"refused {agent['refused']}")
    return f"{agent['version']} {'; '.join(problems) or 'ok'}"


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


# ---- per-team summary ------------------------------------------------------------
CAPACITY_WORDS = {"onDemand": "on-demand", "spot": "spot", "reserved": "reserved"}
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


def summary_line(summary: TeamSummary) -> Text:
    """`team nlp: 3 nodes (READY 2, PREEMPTED 1); chips 40 of 64 (v4 on-demand 32/32,
    v5e spot 8/32); goodput 95.3% over 2 nodes`."""
    count = sum(summary.states.values())
    states = ", ".join(f"{state} {n}" for state, n in summary.states.items())
    parts = [f"{count} node{'s' if count != 1 else ''}" + (f" ({states})" if states else "")]
    if summary.absent:
        parts[0] += f", {summary.absent} absent"
    parts.append(_chips_text(summary))
    goodput = summary.goodput
    parts.append(f"goodput {goodput:.1f}% over {summary.reporting} node"
                 f"{'s' if summary.reporting != 1 else ''}" if goodput is not None
                 else "goodput -")
    if summary.unread:
        parts.append(f"{summary.unread} (project, zone) unread")
    style = "red" if summary.over_cap or summary.unread else ""
    return Text(f"team {summary.team}: " + "; ".join(parts), style=style)


def _chips_text(summary: TeamSummary) -> str:
    used = sum(summary.chips.values())
    if summary.cap is None:
        return f"chips {used} (no team cap in this stack)"
    uses = sorted(set(summary.chips) | set(summary.cap))
    detail = ", ".join(f"{family} {CAPACITY_WORDS.get(capacity, capacity)} "
                       f"{summary.chips.get((family, capacity), 0)}/"
                       f"{summary.cap.get((family, capacity), 0)}"
                       for family, capacity in uses)
    over = " OVER CAP" if summary.over_cap else ""
    return f"chips {used} of cap {sum(summary.cap.values())}{over}" + (
        f" ({detail})" if detail else "")


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


def lost_usd_cell(node: NodeStatus) -> str:
    """The status table's `lost $` cell, e.g. "$3.21"; "" without a figure."""
    usd = node_lost_usd(node)
    return "" if usd is None else f"${usd:,.2f}"


def lost_usd(nodes: Sequence[NodeStatus]) -> float | None:
    """node_lost_usd summed over the nodes that have one; None when none has."""
    figures = [usd for node in nodes if (usd := node_lost_usd(node)) is not None]
    return sum(figures) if figures else None


def spend_line(summary: meter.TeamSpend, lost: float | None, now: datetime) -> Text:
    """`team nlp spend: $1,234.56 this month by the meter; burn $45.00/h; budget $60,000
    runs out in 12.3 h (2026-12-05 10:00 UTC) at that rate; goodput lost $3.21`."""
    parts = [f"${summary.spent_usd:,.2f} this month by the meter (TPU list prices)",
             f"burn ${summary.burn_usd_per_hour:,.2f}/h"]
    left, runs_out = summary.hours_left, summary.runs_out(now)
    if summary.budget_usd is None:
        parts.append("no budget")
    elif left == 0:
        parts.append(f"budget ${summary.budget_usd:,.0f} spent")
    elif left is None or runs_out is None:
        parts.append(f"budget ${summary.budget_usd:,.0f}: nothing burning")
    else:
        parts.append(f"budget ${summary.budget_usd:,.0f} runs out in {left:,.1f} h "
                     f"({runs_out:%Y-%m-%d %H:%M} UTC) at that rate")
    if lost is not None:
        parts.append(f"goodput lost ${lost:,.2f}")
    if summary.unpriced:
        parts.append(f"unpriced: {', '.join(summary.unpriced)}")
    style = "red" if left == 0 else ""
    return Text(f"team {summary.team} spend: " + "; ".join(parts), style=style)


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
