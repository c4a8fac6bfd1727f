"""`tpuctl`: one CLI. Parsing in ops/parser/, each verb in ops/commands/ (thin), the
logic they call in ops/plan/, ops/tpu/ and ops/rehearse/."""

from __future__ import annotations

from ops.commands import plan, reconcile, rehearse, report, tpu
from ops.parser.app import new_app
from ops.terminal import PROG

app = new_app()
plan.register(app)
rehearse.register(app)
tpu.register(app)
report.register(app)
reconcile.register(app)


def main() -> None:
    # click takes the usage line's program name from argv[0] ("python -m ops.cli")
    # unless told (typer/_click/core.py, Command.main(prog_name=...)).
    app(prog_name=PROG)


if __name__ == "__main__":
    main()
