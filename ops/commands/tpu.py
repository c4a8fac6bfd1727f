"""tpuctl verbs for running capacity: preflight, status, wait, recover, janitor, logs.

The logic lives in small modules beside it (api.py, preflight.py, status.py,
actions.py, logs.py); this module only parses options and renders.
Exit codes: 0 fine, 1 the check or wait failed, 2 the command could not run (no
(project, zone) pair could be read, among other reasons), 3 a partial read: some
pairs could not be read, everything else is shown (and acted on), and one row per
unread pair names its project, zone and error. A failed check or wait stays 1.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import cast

import typer
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from components.stack_config import settings_for
from model.fleet import StackTarget, TargetError
from ops.controller import view as controller_view
from ops.controller import views as controller_views
from ops.controller.plan import Step
from ops.terminal import console as make_console
from ops.terminal import fail
from ops.tpu import actions as node_actions
from ops.tpu import logs as agent_logs
from ops.tpu import preflight, rehearsal_record, status_views
from ops.tpu import quota as tpu_quota
from ops.tpu import status as node_status
from ops.tpu.api import NoCredentialsError, NodeStatus, Read, TpuApi, TpuApiError, Unread
from ops.tpu.target import load_target

console = make_console()

# Every verb defaults to the dev stack, as `plan` and `rehearse` do: the sandbox is the
# cheap guess, every table names the stack it shows, and nothing changes without --apply.
StackOption = typer.Option("dev", "--stack", "-s", metavar="NAME",
                           help="Stack name (Pulumi.<stack>.yaml).")
ApplyOption = typer.Option(False, "--apply", help="Make the changes (default: dry run).")
TeamOption = typer.Option(None, "--team", "-t", metavar="TEAM",
                          help="Only this team's nodes (the zones of its project).")
PARTIAL_READ = 3  # exit code: some (project, zone) pairs could not be read
_DURATION = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>[smh]?)$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600}


def seconds(text: str, option: str) -> float:
    """'90', '90s', '30m', '2h' -> seconds; one clear error naming the option otherwise."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise typer.BadParameter(
            f"{text!r} is not a duration: seconds, or a number with s, m or h", param_hint=option
        )
    return float(match["n"]) * _UNIT_SECONDS[match["unit"]]


@contextmanager
def clear_errors() -> Iterator[None]:
    """Any error we can explain ends the command with one line and exit code 2."""
    try:
        yield
    except (TargetError, TpuApiError, agent_logs.LogsError) as error:
        fail(error)


def _api(target: StackTarget) -> TpuApi:
    return TpuApi(auth=target.auth())


def _load(stack: str, team: str | None) -> StackTarget:
    target = load_target(stack)
    return target if team is None else target.for_team(team)


def _readable(target: StackTarget, read: Read[NodeStatus]) -> None:
    """A read of no pair at all is no partial read: the command cannot run (exit 2)."""
    if read.unread and len(read.unread) == len(target.places):
        read.complete()


def _partial(target: StackTarget, unread: list[Unread]) -> None:
    """One row per unread (project, zone), then exit 3; nothing when every pair was read."""
    if unread:
        console.print(status_views.unread_table(target, unread))
        raise typer.Exit(PARTIAL_READ)


# ---- preflight -----------------------------------------------------------------


def preflight_cmd(
    stack: str = StackOption,
    team: str | None = TeamOption,
    offline: bool = typer.Option(False, "--offline", help="Check against the catalog only."),
    live: bool = typer.Option(False, "--live", help="Fail unless the zone's offers were checked "
                                                    "(no fallback to the catalog; CI uses it)."),
) -> None:
    """Can every node be created? Catalog, the zone's offers, and TPU quota."""
    if offline and live:
        raise typer.BadParameter("--live and --offline exclude each other", param_hint="--live")
    with clear_errors():
        target = _load(stack, team)
        if offline:
            report = preflight.preflight(target, None)
        else:
            report = tpu_quota.live_preflight(target, _api(target), settings_for(stack))
    table = Table(title=f"preflight: stack {stack} ({', '.join(target.projects)})")
    for column in ("subject", "check", "result", "detail"):
        table.add_column(column)
    colour = {"ok": "green", "fail": "red", "not checked": "yellow"}
    for check in report.checks:
        outcome = f"[{colour[check.outcome]}]{check.outcome}[/]"
        table.add_row(check.subject, check.what, outcome, Text(check.detail))
    console.print(table)
    if report.note:
        console.print(report.note, markup=False)
    if report.credentials_error:  # as every verb that needs the TPU API
        fail(f"{report.credentials_error}; the zone's offers were not checked "
             "(--offline checks the catalog only)")
    if not report.ok:
        raise typer.Exit(1)
    if live and not report.live:
        fail("--live: the zone's offers were not checked", code=1)
    if live and report.unread:
        fail(f"--live: the offers of {len(report.unread)} (project, zone) pairs were not "
             "checked", code=1)
    if report.unread:  # each is a row of the table above
        raise typer.Exit(PARTIAL_READ)


# ---- status / wait ---------------------------------------------------------------


def status_cmd(
    stack: str = StackOption,
    team: str | None = TeamOption,
    watch: bool = typer.Option(False, "--watch", "-w", help="Refresh until Ctrl-C."),
    interval: str = typer.Option("15s", "--interval", metavar="DURATION",
                                 help="Refresh period with --watch."),
    offline: bool = typer.Option(
        False, "--offline",
        help="Show the stack's last `tpuctl rehearse` here, no API calls (also the fallback "
             "without Google credentials)."),
    wide: bool = typer.Option(
        False, "--wide", help="Every column (zone, type, health, phase, input wait, MFU, "
                              "updated); by default the ones that fit 100 columns."),
) -> None:
    """One row per node: state, health, symptoms and the agent's job status; a summary
    line per team (nodes by state, chips against the team's cap, goodput)."""
    period = seconds(interval, "--interval")
    with clear_errors():
        target = _load(stack, team)
        if offline:
            console.print(_rehearsal_view(target, wide))
            return
        api = _api(target)
        if not watch:
            view, unread = _status_or_rehearsal(api, target, team, wide)
            console.print(view)
            controller_view.show_last_run(console, target)  # issue 43
            _partial(target, unread)
            return
        with Live(console=console, auto_refresh=False) as live:
            try:
                while True:
                    view, unread = _status_now(api, target, team, wide)
                    parts = [view, status_views.unread_table(target, unread)] if unread else [view]
                    live.update(Group(*parts), refresh=True)
                    time.sleep(period)
            except KeyboardInterrupt:
                return


def _status_now(api: TpuApi, target: StackTarget, team: str | None = None, wide: bool = False
                ) -> tuple[RenderableType, list[Unread]]:
    """The table and a line per team, from every pair that could be read; the pairs not.
    The queued resources are listed while the nodes are (the same per-project bound)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        queued_read = pool.submit(node_status.read_queued, api, target)
        read = node_status.read_stack(api, target)
        queued = queued_read.result()
    _readable(target, read)
    nodes = read.items if team is None else node_status.of_team(target, read.items, team)
    unread = sorted(set(read.unread) | set(queued.unread))
    table = status_views.status_table(target, nodes, queued.items, unread=unread, wide=wide)
    lines = [status_views.summary_line(s)
             for s in node_status.team_summaries(target, nodes, unread)]
    lines += status_views.dashboard_lines(target, wide)  # issue 46: the console links
    if team is not None:  # the team's money: spend by the meter, burn, its budget
        now = datetime.now(timezone.utc)
        lines.append(status_views.spend_line(node_status.spend_of(target, team, nodes, now),
                                            node_status.lost_usd(nodes), now))
    return Group(table, *lines), unread


def _status_or_rehearsal(api: TpuApi, target: StackTarget, team: str | None = None,
                         wide: bool = False) -> tuple[RenderableType, list[Unread]]:
    """Live status. Without credentials, the stack's last rehearsal if there is one,
    and still exit 2, as every verb that cannot reach the API (the rehearsal is no
    node's state): `--offline` shows it without the error."""
    try:
        return _status_now(api, target, team, wide)
    except NoCredentialsError as error:
        if not node_status.rehearsed(target):
            hint = (node_status.failed_rehearsal(target.stack) or f"`tpuctl rehearse --stack "
                    f"{target.stack}` first, then `tpuctl status --offline`")
            raise NoCredentialsError(f"{error} (or {hint})") from None
        console.print(_rehearsal_view(target, wide))
        fail(f"{error}; showed the last rehearsal (offline) instead: `tpuctl status --stack "
             f"{target.stack} --offline` shows it without this error")


def _rehearsal_view(target: StackTarget, wide: bool = False) -> RenderableType:
    nodes = node_status.rehearsed(target)
    path = node_status.rehearsal_dir(target.stack)
    if not nodes:
        raise TargetError(node_status.no_rehearsal(target.stack, path))
    return status_views.status_table(target, nodes, rehearsal=path, wide=wide)


def wait_cmd(
    stack: str = StackOption,
    team: str | None = TeamOption,
    until: str = typer.Option("ready", "--until", help="ready | running | done"),
    timeout: str = typer.Option("30m", "--timeout", metavar="DURATION",
                                help="Give up after this long (e.g. 45m)."),
    poll: str = typer.Option("15s", "--poll", metavar="DURATION", help="Time between checks."),
) -> None:
    """Wait until every node is READY, its job running, or its job done."""
    if until not in node_status.UNTIL_CHOICES:
        raise typer.BadParameter(
            f"{until!r}: use one of {', '.join(node_status.UNTIL_CHOICES)}", param_hint="--until"
        )
    limit, period = seconds(timeout, "--timeout"), seconds(poll, "--poll")
    with clear_errors():
        target = _load(stack, team)
        outcome = _wait_with_progress(
            _api(target), target, cast(node_status.Until, until), limit, period
        )
    console.print(status_views.status_table(target, outcome.nodes, outcome.queued,
                                           unread=outcome.unread))
    if outcome.unread:
        console.print(status_views.unread_table(target, outcome.unread))
    colour = "green" if outcome.reached else "red"
    console.print(Text(outcome.reason, style=colour))
    if not outcome.reached:
        raise typer.Exit(1)


def _wait_with_progress(
    api: TpuApi, target: StackTarget, until: node_status.Until, limit: float, period: float
) -> node_status.WaitOutcome:
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} nodes"),
        TimeElapsedColumn(),
    )
    if not console.is_terminal:  # a progress bar off a terminal is one blank line, no bar
        return node_status.wait_until(api, target, until, limit, period,
                                      on_candidates=_changed_lines(console))
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(f"waiting for {until}", total=max(len(target.nodes), 1))

        def show(nodes: list[NodeStatus], _elapsed: float) -> None:
            done = sum(node_status.node_reached(node, until) for node in nodes)
            progress.update(task, completed=done, total=max(len(target.nodes), len(nodes), 1))

        return node_status.wait_until(api, target, until, limit, period, on_poll=show,
                                      on_candidates=_changed_lines(progress.console))


def _changed_lines(out: Console) -> Callable[[list[str]], None]:
    """Prints each candidate line that differs from the last poll's (above the progress
    bar on a terminal): a log gets a line when a request moves, changes state or its
    wait passes another minute, not one per poll."""
    last: set[str] = set()

    def show(lines: list[str]) -> None:
        nonlocal last
        for line in lines:
            if line not in last:
                out.print(Text(line))
        last = set(lines)

    return show


# ---- recover / janitor ---------------------------------------------------------------


def recover_cmd(
    stack: str = StackOption, team: str | None = TeamOption, apply: bool = ApplyOption
) -> None:
    """Delete (or re-queue) PREEMPTED and TERMINATED nodes so `pulumi up --refresh`
    recreates them and training resumes from its checkpoint; move a fallback node's
    request on: the controller's placement and recovery steps for the stack."""
    with clear_errors():
        target = _load(stack, team)
        api = _api(target)
        read = api.read_nodes(target.places, target.stack)
        _readable(target, read)
        queued = node_status.read_queued(api, target)
        unread = sorted(set(read.unread) | set(queued.unread))
        # The controller's plan (ops/controller/views.py): an unread pair plans nothing.
        steps = controller_views.stack_steps(target, read.items, queued.items, unread,
                                             datetime.now(timezone.utc))
        actions = controller_views.actions_of(steps, controller_views.RECOVER_KINDS)
        _act(api, actions, apply, "nothing to recover: no PREEMPTED or TERMINATED nodes")
        _not_ours(controller_views.others(steps, controller_views.RECOVER_KINDS))
    if actions and apply:
        console.print(
            "next: `pulumi up --refresh` recreates the nodes; jobs resume from checkpoints"
        )
    _partial(target, unread)


def janitor_cmd(
    stack: str = StackOption,
    team: str | None = TeamOption,
    idle_minutes: float = typer.Option(
        60.0, "--idle-minutes", min=0, help="Idle longer than this."
    ),
    apply: bool = ApplyOption,
) -> None:
    """Stop single-host nodes whose job finished or that sit idle; report pod slices:
    the controller's limits steps for the stack."""
    with clear_errors():
        target = _load(stack, team)
        api = _api(target)
        read = node_status.read_stack(api, target)
        _readable(target, read)
        queued = node_status.read_queued(api, target)
        unread = sorted(set(read.unread) | set(queued.unread))
        steps = controller_views.stack_steps(target, read.items, queued.items, unread,
                                             datetime.now(timezone.utc), idle_minutes)
        actions = controller_views.actions_of(steps, controller_views.JANITOR_KINDS)
        _act(api, actions, apply, "nothing to clean up: every node is busy")
        if apply and any(a.holds for a in actions):
            storage = agent_logs.AgentLogs(target.project, auth=target.auth()).client
            for marker in node_actions.record_holds(storage, target, actions,
                                                    datetime.now(timezone.utc)):
                console.print(f"held: gs://{target.artifacts_bucket}/{marker} keeps the node "
                              f"out of `pulumi up` until its settings change")
        freed = sum(a.chips for a in actions if a.verb == "delete-queued")
        if freed:
            console.print(f"{'frees' if apply else 'would free'} {freed} chips of quota held "
                          f"by FAILED, SUSPENDED or expired queued resources")
        _not_ours(controller_views.others(steps, controller_views.JANITOR_KINDS))
    _partial(target, unread)


def _not_ours(steps: list[Step]) -> None:
    """The plan's other steps: one line saying which verb shows them."""
    if steps:
        verbs = ", ".join(sorted({s.verb for s in steps}))
        console.print(f"the controller's plan has {len(steps)} other step(s) ({verbs}): "
                      f"`tpuctl reconcile --stack` shows the whole plan")


def _act(api: TpuApi, actions: list[node_actions.Action], apply: bool, nothing: str) -> None:
    if not actions:
        console.print(nothing)
        return
    table = Table(title="changes" if apply else "dry run: would change")
    for column in ("action", "subject", "zone", "reason"):
        table.add_column(column)
    for action in actions:
        table.add_row(action.verb, action.subject, action.zone, Text(action.reason))
    console.print(table)
    if not apply:
        console.print("dry run: nothing changed; run again with --apply")
        return
    node_actions.apply_actions(
        api, actions, on_done=lambda a: console.print(f"done: {a.verb} {a.subject}")
    )


# ---- logs ---------------------------------------------------------------------


def logs_cmd(
    stack: str = StackOption,
    node: str | None = typer.Option(
        None, "--node", help="Logical name or node id (default: the first)."
    ),
    worker: int = typer.Option(0, "--worker", min=0, help="Worker number."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the job ends."),
    poll: str = typer.Option("5s", "--poll", metavar="DURATION",
                             help="Time between reads with --follow."),
    offline: bool = typer.Option(
        False, "--offline", help="The job.log the stack's last `tpuctl rehearse` left here, "
                                 "no API calls."),
) -> None:
    """The agent's job.log for one worker of one node, from GCS (or a rehearsal's)."""
    period = seconds(poll, "--poll")
    if offline:
        if follow:
            raise typer.BadParameter("a rehearsal's log is finished; --follow reads a live "
                                     "node's", param_hint="--follow")
        with clear_errors():
            _print_raw(_rehearsal_log(load_target(stack), node, worker))
        return
    with clear_errors():
        target = load_target(stack)
        read = _api(target).read_nodes(target.places, target.stack)
        _readable(target, read)
        chosen = _pick_node(read.items, target, node, read.unread)
        prefix = agent_logs.status_prefix(chosen)
        logs = agent_logs.AgentLogs(target.project, auth=target.auth())
        if follow:
            state = agent_logs.follow(logs, prefix, worker, _print_raw, poll=period)
            console.print(f"[bold]job {state}[/]")
            return
        text = logs.job_log(prefix, worker)
        if text is None:
            raise agent_logs.LogsError(f"no log yet at {prefix}worker-{worker}/job.log")
        _print_raw(text.decode(errors="replace"))


def _rehearsal_log(target: StackTarget, wanted: str | None, worker: int) -> str:
    """The job.log of `worker` of the rehearsed node `wanted` (logical name or node id;
    default: the first rehearsed)."""
    stack_dir = node_status.rehearsal_dir(target.stack)
    folders = {str(rehearsal_record.worker0_status(folder).get("node", "")): folder
               for folder in rehearsal_record.node_folders(stack_dir)}
    if not folders:
        raise TargetError(f"stack {target.stack} has no rehearsal here ({stack_dir} holds "
                          f"none): run `tpuctl rehearse --stack {target.stack}`")
    if wanted is None:
        folder = next(iter(folders.values()))
    else:
        node_id = {n.logical: n.node_id for n in target.nodes}.get(wanted, wanted)
        if node_id not in folders:
            raise TargetError(f"--node {wanted}: not rehearsed here (rehearsed: "
                              f"{', '.join(folders)}); `tpuctl rehearse --stack {target.stack} "
                              f"--node {wanted}` rehearses it")
        folder = folders[node_id]
    path = rehearsal_record.job_log(folder, worker)
    if not path.is_file():
        raise agent_logs.LogsError(f"the rehearsal left no job.log for worker {worker} "
                                   f"({path} is missing)")
    return path.read_text(errors="replace")


def _print_raw(text: str) -> None:
    console.out(text, end="", highlight=False)


def _pick_node(nodes: list[NodeStatus], target: StackTarget, wanted: str | None,
               unread: list[Unread] | None = None) -> NodeStatus:
    blind = "".join(f"; {u.project} {u.zone} could not be read: {u.error}"
                    for u in unread or [])
    if not nodes:
        raise TargetError(
            f"stack {target.stack} has no nodes in {', '.join(target.zones) or 'any zone'}"
            + blind
        )
    if wanted is None:
        return nodes[0]
    expected = {n.logical: n.node_id for n in target.nodes}
    node_id = expected.get(wanted, wanted)
    for node in nodes:
        if node.node_id == node_id:
            return node
    raise TargetError(
        f"--node {wanted}: not a node of stack {target.stack} "
        f"({', '.join(n.node_id for n in nodes)}){blind}"
    )


def register(app: typer.Typer) -> None:
    app.command("preflight")(preflight_cmd)
    app.command("status")(status_cmd)
    app.command("wait")(wait_cmd)
    app.command("recover")(recover_cmd)
    app.command("janitor")(janitor_cmd)
    app.command("logs")(logs_cmd)
