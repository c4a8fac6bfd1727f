"""`goodputRecording: true`: the job's phases as ml-goodput-measurement events, and the
library's goodput of a real run against the job's own (issue 46).

The fake Cloud Logging sink is the library's own injection point, `cloud_logger` (its
tests' MockCloudLogger does the same: ml_goodput_measurement/tests/goodput_test.py).
"""

from __future__ import annotations

import io
import sys

import pytest
from fake_cloud_logging import FakeCloudLogging
from ml_goodput_measurement.src import goodput as library
from ml_goodput_measurement.src.goodput_utils import BadputType

from tpu_training import goodput_recording, train
from tpu_training.config import JobConfig
from tpu_training.goodput import Goodput
from tpu_training.stopping import StopFlag

# The library's goodput and the job's own (productive over every accounted second of
# its runs) agree within this many percentage points on a run like a rehearsal's. Where
# they differ, and why (training/README.md, "Goodput in Google's metrics"): the library
# counts a process's first execution past its first step as productive at the next
# execution's step time, the job counts it all as start-up; the library's elapsed time
# also holds the gaps between runs and ends at the job's end record.
AGREEMENT_POINTS = 3.0


class StopAt:
    """The job's stdout: sets the stop flag (as SIGTERM would) once a step line reaches
    `step`, as the agent stops a job on a preemption notice."""

    def __init__(self, stop: StopFlag, step: int):
        self.stop, self.step, self.out = stop, step, io.StringIO()

    def write(self, text: str) -> int:
        if text.startswith("tpu_training step=") and \
                int(text.split()[1].removeprefix("step=")) >= self.step:
            self.stop.signal = 15
        return self.out.write(text)

    def flush(self) -> None:
        pass


def recorded_run(config: JobConfig, sink: FakeCloudLogging, strategy, *, stop_at=None
                 ) -> tuple[dict[str, float], dict[str, float]]:
    """One process run of the job in this process, recording into `sink`: its totals at
    the job's end record (the complete line; at its end if it stopped) and at its end."""
    goodput = Goodput()
    notes: list[str] = []
    assert goodput_recording.start_recording(config, goodput, cloud_logger=sink,
                                             note=notes.append)
    assert notes == ["goodput recording on: job_name=ckpt log=goodput_ckpt"]
    at_job_end: dict[str, float] = {}
    observer, record_end = goodput.observer, goodput.observer.finished

    def finished() -> None:
        at_job_end.update(goodput.totals())
        record_end()

    observer.finished = finished
    stop = StopFlag()
    out = StopAt(stop, stop_at) if stop_at else io.StringIO()
    train.run(config, strategy=strategy, stop=stop, out=out, goodput=goodput)
    return at_job_end or goodput.totals(), goodput.totals()


def test_a_stopped_and_resumed_run_agrees_with_the_library_within_the_tolerance(
        strategy, job, tmp_path):
    config = JobConfig.from_dict(job(trainSteps=200, goodputRecording=True))
    sink = FakeCloudLogging()
    first, _ = recorded_run(config, sink, strategy, stop_at=80)
    second, second_whole = recorded_run(config, sink, strategy)
    ours = {category: first[category] + second[category] for category in first}
    own_percent = 100.0 * ours["productive"] / sum(ours.values())
    # The second run's wind-down after the complete line: the job's accounting counts
    # it (start-up), the library's elapsed time ends at the job's end record.
    wind_down = sum(second_whole.values()) - sum(second.values())
    whole_percent = 100.0 * ours["productive"] / (sum(ours.values()) + wind_down)

    calculator = library.GoodputCalculator("ckpt", "goodput_ckpt", cloud_logger=sink,
                                           cache_dir=str(tmp_path / "cache"))
    percent, _, last_step = calculator.get_job_goodput()
    details = calculator.get_job_goodput_details()

    print(f"goodput: library {percent:.2f}% own {own_percent:.2f}% (to the process's "
          f"end: {whole_percent:.2f}%, wind-down {wind_down:.1f} s) own seconds {ours}")
    assert abs(percent - own_percent) <= AGREEMENT_POINTS
    wind_down_points = 100.0 * wind_down / (sum(ours.values()) + wind_down)
    assert abs(percent - whole_percent) <= AGREEMENT_POINTS + wind_down_points
    assert last_step == 200
    assert details["disruption_count"] == 1  # the stop at step 80, resumed
    unproductive = details["badput_time"]
    assert unproductive[BadputType.TRAINING_PREP] > 0  # model, checkpoint manager, restore
    assert unproductive[BadputType.DATA_LOADING_SYNC] > 0  # records checked, pipeline made
    assert unproductive[BadputType.PROGRAM_STARTUP] > 0  # the first executions' compilation
    saves = unproductive[BadputType.CUSTOM_BADPUT_EVENTS]["CHECKPOINT_SAVE"]
    assert 0 < saves <= ours["checkpoint_save"] + 0.01
    assert unproductive[BadputType.WASTED_PROGRESS_FROM_DISRUPTION] == 0  # saved on stop


def small_job(**settings: object) -> JobConfig:
    return JobConfig.from_dict({"model": "mnist_cnn", "trainData": "x", "globalBatchSize": 1,
                                "trainSteps": 1, "stepsPerExecution": 1, **settings},
                               resolved=False)


class Wall:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def step_times(sink: FakeCloudLogging) -> dict[int, float]:
    return {entry["step_count"]: entry["step_start_time"] - 1_000_000.0
            for entry in sink.entries if "step_count" in entry}


def test_the_first_execution_is_compilation_and_later_steps_are_evenly_spaced():
    sink, wall = FakeCloudLogging(), Wall()
    recorder = library.GoodputRecorder("j", "goodput_j", logging_enabled=True, cloud_logger=sink)
    recording = goodput_recording.LibraryRecording(recorder, wall=wall)
    wall.now += 10
    recording.execution(0, 4, 10)  # 0..10 s: compilation and 4 steps
    assert step_times(sink) == {}  # held until a later execution times a step
    wall.now += 2
    recording.execution(4, 4, 2)  # 10..12 s: 0.5 s a step
    recording.trained(8)
    assert step_times(sink) == {0: 0.0, 1: 8.5, 2: 9.0, 3: 9.5, 4: 10.0, 5: 10.5, 6: 11.0,
                                7: 11.5, 8: 12.0}


def test_a_kill_after_the_last_save_is_wasted_progress_to_the_library(tmp_path):
    """A timeline through the library: killed at 8 s while at step 6, its last save at
    step 4; the rerun records step 4 again."""
    sink, wall = FakeCloudLogging(), Wall()
    recorder = library.GoodputRecorder("j", "goodput_j", logging_enabled=True, cloud_logger=sink)
    run = goodput_recording.LibraryRecording(recorder, wall=wall)
    run.job_started(0)  # 0 s
    wall.now += 1
    run.block("tpu_init", None, 1)  # 0..1
    for first_step, seconds in ((0, 3), (2, 2), (4, 2)):  # 1..4 (1 s compiling), 4..6, 6..8
        wall.now += seconds
        run.execution(first_step, 2, seconds)
    wall.now += 1
    rerun = goodput_recording.LibraryRecording(recorder, wall=wall)
    rerun.job_started(0)  # 9 s
    for first_step in (4, 6):  # 9..11, 11..13
        wall.now += 2
        rerun.execution(first_step, 2, 2)
    rerun.trained(8)
    rerun.finished()  # 13 s

    calculator = library.GoodputCalculator("j", "goodput_j", cloud_logger=sink,
                                           cache_dir=str(tmp_path))
    percent, _, last_step = calculator.get_job_goodput()
    badput = calculator.get_job_goodput_details()["badput_time"]
    # Productive: steps 0 to 3 (4 s, step 0's 2 s less its 1 s of compilation) and the
    # rerun's 4 to 7 (4 s), of 13 s.
    assert percent == pytest.approx(100 * 8 / 13)
    assert last_step == 8
    assert badput[BadputType.TPU_INITIALIZATION] == pytest.approx(1.0)
    assert badput[BadputType.PROGRAM_STARTUP] == pytest.approx(1.0)
    # Step 4 (6..7 s) was lost; from step 5's start (7 s) to the rerun's (9 s), recovery.
    assert badput[BadputType.WASTED_PROGRESS_FROM_DISRUPTION] == pytest.approx(1.0)
    assert badput[BadputType.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION] == pytest.approx(2.0)


def test_without_the_library_one_line_and_no_recording(monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_goodput_measurement.src", None)
    config = small_job(goodputRecording=True)
    goodput, notes = Goodput(), []
    assert not goodput_recording.start_recording(config, goodput, note=notes.append)
    assert goodput.observer is None
    assert len(notes) == 1
    assert notes[0].startswith("goodput recording off: ml-goodput-measurement is not "
                               "importable (ModuleNotFoundError")


def test_without_cloud_logging_credentials_one_line_and_no_recording(monkeypatch, tmp_path):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "absent.json"))
    config = small_job(goodputRecording=True)
    goodput, notes = Goodput(), []
    assert not goodput_recording.start_recording(config, goodput, note=notes.append)
    assert goodput.observer is None
    assert notes == [notes[0]] and notes[0].startswith(
        "goodput recording off: no Cloud Logging client (DefaultCredentialsError")


def test_a_recorder_that_fails_turns_recording_off_with_one_line():
    class Failing:
        def record_step_start_time(self, step, start_time):
            raise PermissionError("logging.logEntries.create denied")

    notes: list[str] = []
    recording = goodput_recording.LibraryRecording(Failing(), note=notes.append)
    recording.trained(3)
    recording.trained(4)
    assert notes == ["goodput recording off: record_step_start_time failed (PermissionError: "
                     "logging.logEntries.create denied)"]


def test_recording_is_off_unless_the_job_asks():
    config = small_job()
    goodput, notes = Goodput(), []
    assert not goodput_recording.start_recording(config, goodput, cloud_logger=object(),
                                                 note=notes.append)
    assert goodput.observer is None and notes == []
    assert "goodputRecording" not in config.to_dict()  # release content unchanged


def test_the_job_name_is_the_checkpoint_directory_s_last_part():
    config = JobConfig(model="mnist_cnn", trainData="x", globalBatchSize=1, trainSteps=1,
                       checkpointDir="gs://b/ckpt/node-a/")
    assert goodput_recording.job_name(config) == "node-a"
