"""`tpuctl`: one CLI. Parsing in ops/parser/, each verb in ops/commands/ (thin), the
logic they call in ops/plan/, ops/tpu/ and ops/rehearse/."""

from __future__ import annotations

import warnings

# google-api-core warns on every import about Python 3.11's end of life (2027): silenced
# before the verbs import it.
warnings.filterwarnings("ignore", message="You are using a Python version",
                        category=FutureWarning)

from ops.commands import plan, reconcile, rehearse, report, tpu  # noqa: E402
from ops.parser.app import new_app  # noqa: E402
from ops.terminal import PROG  # noqa: E402

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
