"""The job's perf line and the runtime's own figures in the agent's status."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from node_agent import agent, job_lines, runtime_metrics, status
from node_agent.goodput import Goodput

PERF = "tpu_training perf step=400 examples_per_sec=812.500 input_wait_share=0.6210 mfu=0.0810"
# What `tpu-info --metric duty_cycle_percent --metric hbm_usage` prints on a v4-8 (two
# chips shown), as rich renders tpu_info/cli_helper.py's tables (box characters vary).
TPU_INFO = """\
TPU Duty Cycle
┏━━━━━━━━━┳━━━━━━━━━━━━━━━━┓
┃ Core ID ┃ Duty Cycle (%) ┃
┡━━━━━━━━━╇━━━━━━━━━━━━━━━━┩
│ 0       │ 38.00%         │
│ 1       │ 42.50%         │
└─────────┴────────────────┘
TPU HBM Usage
┏━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━┓
┃ Device ┃ HBM Usage (GiB)       ┃
┡━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━┩
│ 0      │ 12.50 GiB / 31.25 GiB │
│ 1      │ 10.00 GiB / 31.25 GiB │
└────────┴───────────────────────┘
"""


def test_the_perf_line_is_read_into_status_fields() -> None:
    run = job_lines.JobRun()
    assert run.read(PERF + "\n") == "perf"
    assert run.perf == {"step": 400, "examplesPerSec": 812.5, "inputWaitShare": 0.621,
                        "mfu": 0.081}
    run.read("tpu_training perf step=450 examples_per_sec=1.0 input_wait_share=0.1 mfu=na")
    assert run.perf["mfu"] == "na" and run.perf["step"] == 450
    # A torn or malformed line keeps the figures there are.
    assert run.read("tpu_training perf step=500 examples_per_sec=x") == "perf"
    assert run.perf["step"] == 450


def test_tpu_info_tables_give_duty_cycle_and_hbm() -> None:
    assert runtime_metrics.parse_tpu_info(TPU_INFO) == {
        "dutyCyclePercent": 40.25, "hbmUsedGiB": 22.5, "hbmTotalGiB": 62.5}
    unavailable = TPU_INFO.replace("38.00%", "N/A").replace("42.50%", "N/A")
    unavailable = unavailable.replace("12.50 GiB / 31.25 GiB", "N/A").replace(
        "10.00 GiB / 31.25 GiB", "N/A")
    assert runtime_metrics.parse_tpu_info(unavailable) == {}
    assert runtime_metrics.parse_tpu_info("") == {}


def fake_tpu_info(tmp_path: Path, text: str) -> Path:
    script = tmp_path / "tpu-info"
    script.write_text(f"#!/bin/sh\ncat <<'END'\n{text}END\necho \"$@\" > {tmp_path}/args\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_the_runtime_figures_come_from_tpu_info_when_the_vm_has_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(runtime_metrics.TPU_INFO_ENV, str(fake_tpu_info(tmp_path, TPU_INFO)))
    metrics = runtime_metrics.RuntimeMetrics()
    assert metrics.latest()["dutyCyclePercent"] == 40.25
    assert (tmp_path / "args").read_text().split() == [
        "--metric", "duty_cycle_percent", "--metric", "hbm_usage"]
    (tmp_path / "args").unlink()
    metrics.latest()  # within the minute: not asked again
    assert not (tmp_path / "args").exists()
    assert runtime_metrics.RuntimeMetrics(str(tmp_path / "absent")).latest() == {}


def test_the_agent_carries_the_latest_figures_in_status_json(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No periodic upload: its supervised loop ends at once (a body returning None would
    # run again at once, forever, and hold the GIL for every later test).
    monkeypatch.setattr(status.Status, "_upload_periodically", lambda self: False)
    monkeypatch.setattr(status, "STEP_PUBLISH_SECONDS", 0.0)
    metadata = SimpleNamespace(put_guest_attribute=lambda key, text: None)
    published = status.Status(metadata, storage=None, root=tmp_path, worker=0)
    os.environ.pop(runtime_metrics.TPU_INFO_ENV, None)
    fake = SimpleNamespace(status=published, goodput=Goodput("job"),
                           runtime_metrics=runtime_metrics.RuntimeMetrics(
                               str(fake_tpu_info(tmp_path, TPU_INFO))))
    run = job_lines.JobRun()
    agent.Agent._progress(fake, run, run.read(PERF))
    written = json.loads((tmp_path / "status" / "worker-0" / "status.json").read_text())
    assert written["perf"] == {"step": 400, "examplesPerSec": 812.5, "inputWaitShare": 0.621,
                               "mfu": 0.081, "dutyCyclePercent": 40.25, "hbmUsedGiB": 22.5,
                               "hbmTotalGiB": 62.5}
    assert json.loads(status.status_metadata(written)["perf"]) == written["perf"]
    published.close()
