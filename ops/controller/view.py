"""`tpuctl status`'s lines on the controller (issue 43): its last run, its age and its
steps, read from `controller/last-run.json` in the stack's artifacts bucket; a warning
when it has not run for three intervals. Only for a stack whose controller is enabled."""

from __future__ import annotations

from datetime import datetime, timezone

from rich.console import Console
from rich.text import Text

from components.stack_config import StackFileError, settings_for
from model import function_accounts
from model.fleet import StackTarget
from model.settings.schema import SettingsError
from ops.controller.run import last_run_lines
from ops.controller.store import Store
from ops.tpu import logs as agent_logs


def controller_enabled(stack: str) -> bool:
    try:
        settings = settings_for(stack)
    except (SettingsError, StackFileError, OSError):  # status still shows the nodes
        return False
    return function_accounts.controller_enabled(settings)


def show_last_run(console: Console, target: StackTarget, now: datetime | None = None) -> None:
    if not controller_enabled(target.stack):
        return
    try:
        client = agent_logs.AgentLogs(target.project, auth=target.auth()).client
        record = Store(client, target.artifacts_bucket).last_run()
    except Exception as error:  # status still shows the nodes
        console.print(Text(f"controller: its last run in gs://{target.artifacts_bucket} "
                           f"could not be read ({type(error).__name__}: {error})"))
        return
    lines, _stale = last_run_lines(record, now or datetime.now(timezone.utc))
    for line in lines:
        console.print(Text(line, style="yellow" if line.startswith("warning") else ""))
