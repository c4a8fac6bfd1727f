"""`tpuctl report`: one self-contained HTML page of a rehearsal's step, loss, goodput and
spend over time, checked in headless Chromium (Debian's `chromium`, which .ci/run
installs): the charts drawn, no error in the page or on the console."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ops.cli import app
from ops.commands import report as report_command
from ops.report.history import NodeHistory, read_job_log
from ops.report.page import render
from ops.tpu import rehearsal_record
from ops.tpu import status as node_status
from tests.ops.tpu_world import expected_node, target

NODE = "dev-trainer"
# v5e: a generation with a list price (catalog.py), so the spend chart has a line.
DEV = target(expected_node(NODE, accelerator_type="v5litepod-4", spot=True))
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--enable-logging=stderr",
                  "--v=0", "--virtual-time-budget=5000")


def goodput_line(step: int, productive: float, startup: float, save: float) -> str:
    return (f"tpu_training goodput step={step} productive={productive:.3f} tpu_init=0.500 "
            f"program_startup={startup:.3f} checkpoint_save={save:.3f} "
            f"checkpoint_restore=0.100")


def job_run(first: int, last: int, *, stopped: bool) -> list[str]:
    """One process of the job, as its stdout reaches job.log: 5 steps an execution, 1 s
    each after 10 s of start-up, a save every 20 steps."""
    lines = ["tpu_training started stacks=SIGUSR1 tpu_init_seconds=300",
             "tpu_training tpu_ready replicas=1", f"tpu_training resumed_from={first}"]
    productive, save = 0.0, 0.0
    for step in range(first + 5, last + 1, 5):
        productive += 0 if step == first + 5 else 1.0
        lines += [f"tpu_training step={step} loss={2.0 / (1 + step / 10):.6f}",
                  goodput_line(step, productive, 10.0, save)]
        if step % 20 == 0:
            save += 0.25
            lines += [f"tpu_training saved step={step} seconds=0.300 bytes=1000 reason=steps "
                      f"blocked=0.010", goodput_line(step, productive, 10.0, save)]
    lines.append(f"tpu_training stopped_at={last}" if stopped else
                 f"tpu_training complete={last} export=/x")
    return [*lines, goodput_line(last, productive, 10.5, save)]


def rehearse_here(root: Path) -> Path:
    """What `tpuctl rehearse --stack dev` leaves for a node stopped at step 20 and resumed
    to 60: status objects, job.log, checkpoints and the record (rehearsal_record.py)."""
    folder = root / "dev" / "node-trainer"
    worker = folder / "status-objects" / "worker-0"
    worker.mkdir(parents=True)
    goodput = {"productive": 13.0, "program_startup": 21.0, "tpu_init": 1.0,
               "checkpoint_save": 0.75, "checkpoint_restore": 0.2, "waiting_for_data": 0.0,
               "lost_progress": 0.0, "infrastructure_recovery": 4.0, "total": 39.95,
               "percent": 32.5, "job": "j"}
    (worker / "status.json").write_text(json.dumps(
        {"node": NODE, "state": "succeeded", "step": "60", "worker": 0, "goodput": goodput}))
    lines = job_run(0, 20, stopped=True) + job_run(20, 60, stopped=False)
    (worker / "job.log").write_text("\n".join(lines) + "\n")
    checkpoints = folder / "gcs" / "acme-ml-dev-checkpoints" / "ckpt" / NODE
    checkpoints.mkdir(parents=True)
    for step in (40, 60):
        (checkpoints / f"ckpt-{step}.index").write_bytes(b"")
    rehearsal_record.write_record(folder, "dev", "node-trainer", "gs://p", "gs://r")
    return folder


@pytest.fixture
def report(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setattr(node_status, "REHEARSAL_ROOT", tmp_path / "rehearse")
    monkeypatch.setattr(report_command, "load_target", lambda stack: DEV)

    def run(*args: str):
        return CliRunner().invoke(app, ["report", "--stack", "dev", *args])

    return run


def test_the_job_clock_runs_on_across_a_restart_and_places_every_save():
    history = NodeHistory(NODE, "v5litepod-4", True, 1.5)
    read_job_log(job_run(0, 20, stopped=True) + job_run(20, 60, stopped=False), history)

    # First process: steps 5 to 20 at 10.6 to 13.6 s; it ends at 14.35 s; the second
    # process's 18.6 s follow.
    assert history.step.points[:4] == [(10.6, 5.0), (11.6, 10.0), (12.6, 15.0), (13.6, 20.0)]
    assert history.restarts == [pytest.approx(14.35)]
    assert history.step.points[4] == (pytest.approx(14.35 + 10.6), 25.0)
    assert [step for _, step in history.saves] == [20, 40, 60]
    assert history.loss.points[0] == (10.6, pytest.approx(2.0 / 1.5))
    # goodput so far: productive over the seconds so far, both processes together
    assert history.goodput.points[-1][1] == pytest.approx(100 * (3 + 7) / (14.35 + 18.6))
    assert history.spend.points[-1][1] == pytest.approx(1.5 * (14.35 + 18.6) / 3600)


def test_the_report_is_one_self_contained_page_with_every_plot(report, tmp_path: Path):
    rehearse_here(tmp_path / "rehearse")
    out = tmp_path / "out" / "dev.html"

    run = report("--out", str(out))

    assert run.exit_code == 0, run.output
    assert run.output.strip() == f"wrote {out}"
    page = out.read_text()
    assert "://" not in page  # nothing fetched: no URL at all, not even a namespace
    assert not re.search(r"<(link|img|iframe|object|embed)\b|\bsrc=", page)
    for series in ("step", "loss", "goodput", "spend"):
        (svg,) = re.findall(rf'<svg class="plot" data-series="{series}".*?</svg>', page)
        assert re.search(r'<path class="line" data-points="\d+" d="M[\d.]+,[\d.]+( L[\d.]+,'
                         r'[\d.]+)+"/>', svg), series
    assert page.count('<circle class="save"') == 3
    assert 'data-plots-expected="4"' in page
    assert "32.5%" in page and "40, 60" in page  # the agent's goodput, checkpoints kept


def test_without_a_rehearsal_one_line_says_what_to_run(report, tmp_path: Path):
    run = report()
    assert run.exit_code == 2
    assert run.stderr.strip() == (f"tpuctl: error: stack dev has no rehearsal here "
                                  f"({tmp_path / 'rehearse' / 'dev'} holds none): run "
                                  f"`tpuctl rehearse --stack dev`")


def test_headless_chromium_draws_every_plot_without_an_error(report, tmp_path: Path):
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is needed (.ci/run installs it: apt-get install chromium)"
    rehearse_here(tmp_path / "rehearse")
    out = tmp_path / "dev.html"
    assert report("--out", str(out)).exit_code == 0

    shown = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                            "--dump-dom", out.as_uri()],
                           capture_output=True, text=True, timeout=180, check=False)

    body = re.search(r"<body([^>]*)>", shown.stdout)
    assert body, (shown.returncode, shown.stderr[-2000:])
    attributes = dict(re.findall(r'([\w-]+)="([^"]*)"', body[1]))
    assert attributes["data-plots-expected"] == "4"
    assert attributes["data-plots-drawn"] == "4", shown.stdout[:500]  # laid out by the browser
    assert attributes["data-errors"] == "0"
    assert '<pre id="errors"></pre>' in shown.stdout
    console = [line for line in shown.stderr.splitlines()
               if "CONSOLE" in line or "Uncaught" in line]
    assert console == []


def test_a_node_without_a_job_log_or_a_price_says_so_in_each_chart():
    page = render("dev", "here", [NodeHistory(NODE, "v2-8", True, None)])
    assert page.count('<text class="empty"') == 4
    assert "no list price for v2-8" in page
    assert 'data-plots-expected="0"' in page
