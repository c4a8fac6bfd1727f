"""`goodputRecording: true` also starts the library's GoodputMonitor (issue 46), so the
job's goodput reaches Cloud Monitoring as `compute.googleapis.com/workload/*` on resource
`compute.googleapis.com/Workload` (what model/monitoring.py's goodput tiles and alert
read). The library's own classes run, its uploader processes too, against fakes: its
calculator reads a fake Cloud Logging sink (its `cloud_logger` injection point), and its
GCPMetrics sends through a fake Monitoring client that writes each time series to a
file (the uploaders are processes of their own). No network."""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path
from typing import ClassVar

import pytest
from fake_cloud_logging import FakeCloudLogging
from ml_goodput_measurement.src import goodput as library
from ml_goodput_measurement.src import monitoring as library_monitoring

from tpu_training import goodput_recording
from tpu_training.config import JobConfig

PROJECT, ZONE = "acme-ml-dev", "us-central1-b"
START = datetime.datetime(2026, 12, 6, 8, tzinfo=datetime.timezone.utc)
STEPS = 10


class Sink(FakeCloudLogging):
    """Cloud Logging for one log, in memory (as the recording tests' fake)."""

    entries: ClassVar[list[dict]] = []  # one log for every instance, the forked ones too

    def __init__(self) -> None:  # keeps the class's one log
        pass


class Calculator(library.GoodputCalculator):
    """The library's calculator, reading the sink (in the uploader processes too: they
    are forked with this module's state)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs, cloud_logger=Sink())


class Client:
    """Cloud Monitoring's MetricServiceClient.create_time_series, into a file."""

    path: Path

    def create_time_series(self, name: str, time_series: list) -> None:
        with self.path.open("a") as out:
            for series in time_series:
                value = series.points[0].value
                out.write(json.dumps({
                    "name": name, "type": series.metric.type,
                    "labels": dict(series.metric.labels), "resource": series.resource.type,
                    "resource_labels": dict(series.resource.labels),
                    "value": value.double_value or value.int64_value}) + "\n")


class Metrics(library_monitoring.GCPMetrics):
    """The library's GCPMetrics with the fake client (no credentials needed)."""

    def __init__(self, project_id: str):
        self.project_id, self.project_name = project_id, f"projects/{project_id}"
        self.client = Client()


def recorded_job() -> None:
    """A job's events as the recorder writes them: ten 1-second steps, then its end."""
    Sink.entries = []
    recorder = library.GoodputRecorder("ckpt", "goodput_ckpt", logging_enabled=True,
                                       cloud_logger=Sink())
    recorder.record_job_start_time(START)
    for step in range(STEPS):
        recorder.record_step_start_time(step, START + datetime.timedelta(seconds=1 + step))
    recorder.record_job_end_time(START + datetime.timedelta(seconds=1 + STEPS))


def job(tmp_path: Path, **extra) -> JobConfig:
    return JobConfig(model="mnist_cnn", trainData="x", globalBatchSize=1, trainSteps=STEPS,
                     checkpointDir=str(tmp_path / "ckpt"), tensorboardDir=str(tmp_path / "tb"),
                     **extra)


def options(**changes) -> library_monitoring.GCPOptions:
    return library_monitoring.GCPOptions(**{"project_id": PROJECT, "location": ZONE,
                                            "acc_type": "v5litepod-8", **changes})


@pytest.fixture
def uploaded(monkeypatch, tmp_path) -> Path:
    Client.path = tmp_path / "series.jsonl"
    monkeypatch.setattr(library_monitoring, "GoodputCalculator", Calculator)
    monkeypatch.setattr(library_monitoring, "GCPMetrics", Metrics)
    recorded_job()
    return Client.path


def test_the_monitor_uploads_the_job_s_goodput_to_cloud_monitoring(uploaded, tmp_path):
    notes: list[str] = []
    monitor = goodput_recording.start_monitoring(job(tmp_path, goodputRecording=True),
                                                 gcp_options=options(), note=notes.append)
    assert monitor is not None
    assert notes == [f"goodput monitoring on: job_name=ckpt, Cloud Monitoring project "
                     f"{PROJECT}, every {goodput_recording.UPLOAD_INTERVAL_SECONDS} s"]
    goodput_recording.stop_monitoring(monitor, note=notes.append)  # the final upload
    assert len(notes) == 1
    series = [json.loads(line) for line in uploaded.read_text().splitlines()]
    assert {s["name"] for s in series} == {f"projects/{PROJECT}"}
    assert {s["resource"] for s in series} == {"compute.googleapis.com/Workload"}
    assert {(s["resource_labels"]["workload_id"], s["resource_labels"]["location"])
            for s in series} == {("ckpt", ZONE)}
    types = {s["type"].rsplit("/", 1)[-1] for s in series}
    assert {"goodput_time", "badput_time", "total_elapsed_time"} <= types
    productive = [s["value"] for s in series if s["type"].endswith("/goodput_time")]
    assert productive and max(productive) == pytest.approx(STEPS - 1, abs=1.5)
    assert (tmp_path / "tb" / "goodput").is_dir()  # and TensorBoard's summaries


def test_a_stopped_job_skips_the_final_upload(uploaded, tmp_path):
    monitor = goodput_recording.start_monitoring(job(tmp_path, goodputRecording=True),
                                                 gcp_options=options(), note=lambda _: None)
    goodput_recording.stop_monitoring(monitor, final=False)
    assert not uploaded.exists()  # the uploaders' first period had not come


def test_off_unless_the_job_asks(uploaded, tmp_path):
    notes: list[str] = []
    assert goodput_recording.start_monitoring(job(tmp_path), gcp_options=options(),
                                              note=notes.append) is None
    assert notes == []
    goodput_recording.stop_monitoring(None)  # nothing to stop


def test_without_the_library_one_line_and_no_monitor(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ml_goodput_measurement.src", None)
    notes: list[str] = []
    assert goodput_recording.start_monitoring(job(tmp_path, goodputRecording=True),
                                              note=notes.append) is None
    assert len(notes) == 1 and notes[0].startswith(
        "goodput monitoring off: ml-goodput-measurement is not importable (ModuleNotFoundError")


def test_without_credentials_one_line_and_no_monitor(monkeypatch, tmp_path):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "absent.json"))
    notes: list[str] = []
    assert goodput_recording.start_monitoring(job(tmp_path, goodputRecording=True),
                                              gcp_options=options(), note=notes.append) is None
    assert len(notes) == 1 and notes[0].startswith(
        "goodput monitoring off: DefaultCredentialsError")


def test_without_a_project_one_line_and_no_monitor(uploaded, monkeypatch, tmp_path):
    # The library asks the metadata server, which answers nothing off a VM.
    monkeypatch.setattr(library_monitoring.goodput_utils, "get_gcp_project_id", lambda: None)
    notes: list[str] = []
    assert goodput_recording.start_monitoring(job(tmp_path, goodputRecording=True),
                                              gcp_options=options(project_id=None),
                                              note=notes.append) is None
    assert notes == ["goodput monitoring off: no project or zone (the metadata server's) "
                     "to upload to Cloud Monitoring"]
