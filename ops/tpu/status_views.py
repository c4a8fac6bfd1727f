"""`tpuctl status` and `tpuctl wait`, views: the tables and lines that show what
ops/tpu/status.py read and analysed."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rich.cells import cell_len, set_cell_size
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text

from model import meter
from model.fleet import ExpectedNode, StackTarget
from model.naming import Naming, dashboard_url
from node_agent.common import parse_utc
from ops.tpu.api import NodeStatus, QueuedStatus, Unread
from ops.tpu.status import (
    PHASE_STATES,
    REHEARSED,
    UTILISATION_FLOOR,
    TeamSummary,
    candidate_lines,
    node_lost_usd,
    perf_of,
    perf_share,
    unseen,
    utilisation_advice,
)

STATE_STYLE = {"READY": "green", REHEARSED: "cyan", f"{REHEARSED} (stale)": "yellow",
               "CREATING": "yellow", "PREEMPTED": "red", "TERMINATED": "red"}


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


def perf_cells(job: dict[str, str]) -> tuple[str, str]:
    """The input-wait and MFU cells: "62%", "8.1% LOW" under the floor, "na" off a TPU."""
    perf = perf_of(job)
    wait, mfu = perf_share(perf.get("inputWaitShare")), perf_share(perf.get("mfu"))
    wait_cell = "" if wait is None else f"{wait:.0%}"
    if mfu is None:
        return wait_cell, "na" if perf.get("mfu") == "na" else ""
    low = " LOW" if mfu < UTILISATION_FLOOR else ""
    return wait_cell, f"{mfu:.1%}{low}"


CAPACITY_WORDS = {"onDemand": "on-demand", "spot": "spot", "reserved": "reserved"}


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


def lost_usd_cell(node: NodeStatus) -> str:
    """The status table's `lost $` cell, e.g. "$3.21"; "" without a figure."""
    usd = node_lost_usd(node)
    return "" if usd is None else f"${usd:,.2f}"


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


def dashboard_of(target: StackTarget, node: ExpectedNode) -> tuple[str, str]:
    """(project, dashboard id) of the dashboard that charts `node` (components/
    monitoring.py): a node in a team's own project, that team's dashboard there; a node
    in the stack's project, the stack's (a platform's fleet, a standalone stack's own)."""
    naming = Naming(target.project, target.stack)
    if node.project and node.project != target.project:
        return node.project, naming.dashboard_id(node.team)
    return target.project, naming.dashboard_id()


def dashboard_lines(target: StackTarget, wide: bool = False) -> list[Text]:
    """`team nlp dashboard: <console link>` per team; with `wide`, one line per node,
    its link with the dashboard's node_id filter set to it."""
    lines: list[Text] = []
    for team in sorted({node.team for node in target.nodes}):
        nodes = [node for node in target.nodes if node.team == team]
        boards = sorted({dashboard_of(target, node) for node in nodes})
        lines += [Text(f"team {team} dashboard: {dashboard_url(*board)}") for board in boards]
        if wide:
            lines += [Text(f"  {node.node_id}: "
                           f"{dashboard_url(*dashboard_of(target, node), node.node_id)}")
                      for node in nodes]
    return lines

