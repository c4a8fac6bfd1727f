"""What each pytest of scripts/test.sh reports back to it: every skip (issue 47: skips
never pass silently) and how many tests ran (its "Test times" table).

scripts/test.sh loads this plugin into every pytest it runs (`-p tests.suite_report`).
With `TPU_STACK_SKIP_LOG` naming a file, every skip is appended to it; the script prints
them all and, on CI (`CI=true`), fails when one is not in ALLOWED_SKIPS below. A skip
stands in for a test that did not run: the feature it checks is unproven on that
machine. Each process writes (pytest-xdist's workers and their controller report the
same skip), so the check reads the lines as a set. With `TPU_STACK_TEST_COUNT` naming a
file, the main process (the controller under pytest-xdist) appends one line at the end:
how many tests ran (passed, failed or skipped; deselected ones are not).

Usage: python -m tests.suite_report LOG   (exit 1 when LOG holds a skip not allowed)
"""

from __future__ import annotations

import fnmatch
import os
import sys
from pathlib import Path

import pytest

LOG_ENV = "TPU_STACK_SKIP_LOG"
COUNT_ENV = "TPU_STACK_TEST_COUNT"

# The skips CI accepts: a test id pattern (fnmatch) and why it may skip there. Short on
# purpose; every entry is a feature CI does not prove.
ALLOWED_SKIPS: dict[str, str] = {}


def reason_of(report: pytest.CollectReport | pytest.TestReport) -> str:
    """The text of a skip's reason, without pytest's `Skipped: ` prefix."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ").replace("\t", " ").replace("\n", " ")


def record(report: pytest.CollectReport | pytest.TestReport) -> None:
    log = os.environ.get(LOG_ENV)
    if not log or not report.skipped or hasattr(report, "wasxfail"):
        return
    with open(log, "a", encoding="utf-8") as out:  # one short append per line
        out.write(f"{report.nodeid}\t{reason_of(report)}\n")


_ran: set[str] = set()  # the tests this process saw run (the controller: every worker's)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    record(report)
    if report.when == "call" or (report.when == "setup" and not report.passed):
        _ran.add(report.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    count_file = os.environ.get(COUNT_ENV)
    if count_file and not hasattr(session.config, "workerinput"):  # not an xdist worker
        with open(count_file, "a", encoding="utf-8") as out:
            out.write(f"{len(_ran)}\n")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    record(report)


def allowed_reason(test_id: str) -> str | None:
    """Why `test_id` may skip on CI, or None when it may not."""
    return next((why for pattern, why in ALLOWED_SKIPS.items()
                 if fnmatch.fnmatchcase(test_id, pattern)), None)


def skips_in(log: Path) -> list[tuple[str, str]]:
    """(test id, reason) of every skip the log holds, each once, sorted."""
    if not log.exists():
        return []
    lines = {line for line in log.read_text(encoding="utf-8").splitlines() if line}
    return sorted(tuple(line.split("\t", 1)) if "\t" in line else (line, "")
                  for line in lines)


def report_lines(skips: list[tuple[str, str]]) -> tuple[list[str], int]:
    """One line per skip, and how many are not on the allowed list."""
    lines, unlisted = [], 0
    for test_id, reason in skips:
        why = allowed_reason(test_id)
        if why is None:
            unlisted += 1
            lines.append(f"SKIPPED, not on the allowed list: {test_id} ({reason})")
        else:
            lines.append(f"skipped, allowed ({why}): {test_id} ({reason})")
    return lines, unlisted


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.suite_report LOG", file=sys.stderr)
        return 2
    lines, unlisted = report_lines(skips_in(Path(argv[0])))
    print(f"{len(lines)} skipped" + (f", {unlisted} not allowed (tests/suite_report.py, "
                                     "ALLOWED_SKIPS)" if unlisted else ""))
    for line in lines:
        print(f"  {line}")
    return 1 if unlisted else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
