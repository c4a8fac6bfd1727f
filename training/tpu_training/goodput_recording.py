"""The job's phases as ml-goodput-measurement events (`goodputRecording: true`).

Google's goodput library (PyPI ml-goodput-measurement, AI-Hypercomputer/
ml-goodput-measurement, pinned at LIBRARY_VERSION) reads a job's events from Cloud
Logging: `GoodputRecorder` writes them, `GoodputCalculator.get_job_goodput` and its
`GoodputMonitor` turn them into goodput and badput by type. MaxText records them on
process 0 only (`enable_goodput_recording`); here the job runs only on worker 0 (the
TPUStrategy client: node_agent/agent.py, "worker 0 runs the TensorFlow client"), so
every job process is the chief.

The mapping (ml_goodput_measurement/src/goodput.py, 0.2.3, what each badput type is
computed from):

- process start: `record_job_start_time` (backfilled): the job's elapsed time starts;
- `tpu_init`: `record_tpu_init_start/end_time`, TPU_INITIALIZATION;
- the model, optimizer and checkpoint manager, `checkpoint_restore`, and making the
  input pipeline's iterator: `record_training_preparation_start/end_time`,
  TRAINING_PREP (its docstring counts checkpoint loading in);
- listing the records, checking the first and reading the record index:
  `record_data_loading_start/end_time`, DATA_LOADING_SYNC (one span a process: the
  library counts the last before a (re)start as synchronous, later ones as
  asynchronous, overlapped with training);
- `checkpoint_save` (between executions, the final save, the export): the custom badput
  event `checkpoint_save` (it blocks training inside the loop), CUSTOM_BADPUT_EVENTS;
- every step of an execution: `record_step_start_time`, one per step (below):
  productive, the first step's excess over the mean step PROGRAM_STARTUP;
- a restart (the resumed step recorded again): WASTED_PROGRESS_FROM_DISRUPTION and
  INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION, computed by the library;
- the job complete: `record_job_end_time`, the job's elapsed time ends.

An execution runs its steps as one program on the device, so the host knows only when
it began and ended: its steps are recorded evenly spaced over it, after it ended. The
library counts only consecutive step numbers, so every step is recorded (one log entry
each). A process's first execution is mostly tracing and compilation, and the perf line's
device probe follows it (the job's accounting counts both as start-up): its first step
is recorded at its start and the others at the probe's end, spaced at the next
execution's step time (held until then), so the library counts both as PROGRAM_STARTUP.
After training ends (its last save, and the export, written) the step reached is
recorded as started: a restart records it again, which is how the library sees a
disruption.

`start_monitoring` then starts the library's `GoodputMonitor` on the same job and log:
its own processes read the events back every UPLOAD_INTERVAL_SECONDS and upload the job's
goodput, badput by type and step-time deviation to Cloud Monitoring
(`compute.googleapis.com/workload/*` on resource `compute.googleapis.com/Workload`,
`workload_id` = the job name: what model/monitoring.py's goodput tiles and alert read)
and to TensorBoard (`<tensorboardDir>/goodput`, else a local temporary directory); the
job stops them at its end, after a final upload (bounded by FINAL_FLUSH_SECONDS).

Optional at run time: without the library, or without Cloud Logging credentials, one
line on stderr and the job goes on; a write that fails later is the library's
background thread's to report (google-cloud-logging's BackgroundThreadTransport), and a
recorder call that raises turns recording off with one line, never failing the job.
"""

from __future__ import annotations

import datetime
import tempfile
import time
from collections.abc import Callable
from typing import Any

from tpu_training import output
from tpu_training.config import JobConfig
from tpu_training.goodput import Goodput

LIBRARY = "ml-goodput-measurement"
LIBRARY_VERSION = "0.2.3"
CHECKPOINT_SAVE_EVENT = "checkpoint_save"  # the custom badput type of a blocking save
# Shorter save blocks (a look at the checkpoint state after every execution) are not
# worth two log entries each.
MIN_SAVE_EVENT_SECONDS = 0.001
# The monitor's upload period: Cloud Monitoring's dashboards here align on 60 s
# (model/monitoring.py); the final upload at the job's end waits at most this long
# (GoodputMonitor final_flush_timeout_seconds), then the job exits anyway.
UPLOAD_INTERVAL_SECONDS = 60
FINAL_FLUSH_SECONDS = 10.0


def job_name(config: JobConfig) -> str:
    """The library's job name, the same across restarts: the checkpoint directory's last
    part (the node's id for a stack job, components/platform.py `ckpt/<node id>/`)."""
    parts = [part for part in (config.checkpointDir or "").rstrip("/").split("/") if part]
    return parts[-1] if parts else "tpu-stack-job"


def logger_name(name: str) -> str:
    """The Cloud Logging log the events go to, as MaxText names it (`goodput_<run name>`)."""
    return f"goodput_{name}"


def start_recording(config: JobConfig, goodput: Goodput, *, cloud_logger: Any = None,
                    note: Callable[[str], None] = output.tell) -> bool:
    """With `goodputRecording: true`, make the library's recorder and let it observe
    `goodput`. `cloud_logger`: the library's own injectable logger (tests' fake sink);
    None writes to Cloud Logging. Whether recording is on; never raises."""
    if not config.goodputRecording:
        return False
    try:
        from ml_goodput_measurement.src import goodput as library
    except Exception as error:  # ImportError, or a dependency of it that fails to load
        note(f"goodput recording off: {LIBRARY} is not importable ({_short(error)}); "
             f"install {LIBRARY}=={LIBRARY_VERSION} on the image (training/README.md)")
        return False
    name = job_name(config)
    try:
        recorder = library.GoodputRecorder(name, logger_name(name), logging_enabled=True,
                                           cloud_logger=cloud_logger)
    except Exception as error:  # no credentials, no project: the client cannot be made
        note(f"goodput recording off: no Cloud Logging client ({_short(error)})")
        return False
    goodput.observe(LibraryRecording(recorder, note=note))
    note(f"goodput recording on: job_name={name} log={logger_name(name)}")
    return True


def start_monitoring(config: JobConfig, *, gcp_options: Any = None,
                     note: Callable[[str], None] = output.tell) -> Any | None:
    """With `goodputRecording: true`, the library's GoodputMonitor uploading the job's
    goodput (ml_goodput_measurement/src/monitoring.py: GoodputMonitor(job_name,
    logger_name, tensorboard_dir, upload_interval, monitoring_enabled, ...,
    gcp_options), start_goodput_uploader, start_step_deviation_uploader). `gcp_options`:
    the library's GCPOptions (default: project and zone from the metadata server). None,
    with one line, when off or when no upload is possible (no library, no client: no
    credentials, no project); never raises. A write refused later (no
    monitoring.metricWriter) is the library's worker's to log."""
    if not config.goodputRecording:
        return None
    try:
        from ml_goodput_measurement.src import monitoring as library
    except Exception as error:
        note(f"goodput monitoring off: {LIBRARY} is not importable ({_short(error)})")
        return None
    name, options = job_name(config), gcp_options
    try:
        options = options or library.GCPOptions()
        monitor = library.GoodputMonitor(
            name, logger_name(name), config.tensorboardDir or tempfile.mkdtemp(
                prefix="goodput-"), UPLOAD_INTERVAL_SECONDS, monitoring_enabled=True,
            include_badput_breakdown=True, include_step_deviation=True, gcp_options=options,
            final_flush_timeout_seconds=FINAL_FLUSH_SECONDS)
        if not options.enable_gcp_goodput_metrics:  # the library found no project or zone
            note("goodput monitoring off: no project or zone (the metadata server's) to "
                 "upload to Cloud Monitoring")
            return None
        monitor.start_goodput_uploader()
        monitor.start_step_deviation_uploader()
    except Exception as error:  # no credentials: the Logging or Monitoring client
        note(f"goodput monitoring off: {_short(error)}")
        return None
    note(f"goodput monitoring on: job_name={name}, Cloud Monitoring project "
         f"{options.project_id}, every {UPLOAD_INTERVAL_SECONDS} s")
    return monitor


def stop_monitoring(monitor: Any | None, final: bool = True,
                    note: Callable[[str], None] = output.tell) -> None:
    """The monitor's processes' end, after a last upload if `final` (a stopped job skips
    it: its notice is for the save, and the next run uploads); never raises."""
    if monitor is None:
        return
    try:
        monitor.stop_goodput_uploader(skip_final_flush=not final)
        monitor.stop_step_deviation_uploader(skip_final_flush=not final)
    except Exception as error:
        note(f"goodput monitoring: stopping failed ({_short(error)})")


class LibraryRecording:
    """A `tpu_training.goodput.Observer` writing the job's phases as library events."""

    def __init__(self, recorder: Any, *, wall: Callable[[], float] = time.time,
                 note: Callable[[str], None] = output.tell):
        self._recorder, self._wall, self._note = recorder, wall, note
        self._held: tuple[int, int, float, float] | None = None  # the first execution
        self._executions = 0
        self._on = True

    def job_started(self, seconds_ago: float) -> None:
        self._record("record_job_start_time", self._at(self._wall() - seconds_ago))

    def block(self, category: str, phase: str | None, seconds: float) -> None:
        end = self._wall()
        start, end_at = self._at(end - seconds), self._at(end)
        if category == "tpu_init":
            self._pair("record_tpu_init", start, end_at)
        elif category == "checkpoint_restore" or phase == "training_preparation":
            self._pair("record_training_preparation", start, end_at)
        elif phase == "data_loading":
            self._pair("record_data_loading", start, end_at)
        elif category == "checkpoint_save" and seconds >= MIN_SAVE_EVENT_SECONDS:
            self._record("record_custom_badput_event_start_time", start,
                         custom_badput_event_type=CHECKPOINT_SAVE_EVENT)
            self._record("record_custom_badput_event_end_time", end_at,
                         custom_badput_event_type=CHECKPOINT_SAVE_EVENT)

    def execution(self, first_step: int, steps: int, seconds: float) -> None:
        end = self._wall()
        self._executions += 1
        if self._executions == 1:
            self._held = (first_step, steps, end - seconds, end)
            return
        self._write_held(seconds / steps)
        self._steps(first_step, steps, end - seconds, seconds / steps)

    def trained(self, step: int) -> None:
        self._write_held(0.0)
        self._record("record_step_start_time", step, self._at(self._wall()))

    def finished(self) -> None:
        self._record("record_job_end_time", self._at(self._wall()))

    def close(self) -> None:
        self._write_held(0.0)
        self._record("flush")

    def _write_held(self, seconds_per_step: float) -> None:
        """The first execution: its first step at its start (compilation), the others at
        its end, `seconds_per_step` apart (0: all at the end, no later step to time)."""
        if self._held is None:
            return
        first_step, steps, start, end = self._held
        self._held = None
        self._record("record_step_start_time", first_step, self._at(start))
        for i in range(1, steps):
            at = max(start, end - (steps - i) * seconds_per_step)
            self._record("record_step_start_time", first_step + i, self._at(at))

    def _steps(self, first_step: int, steps: int, start: float, seconds_per_step: float) -> None:
        for i in range(steps):
            self._record("record_step_start_time", first_step + i,
                         self._at(start + i * seconds_per_step))

    def _pair(self, event: str, start: datetime.datetime, end: datetime.datetime) -> None:
        self._record(f"{event}_start_time", start)
        self._record(f"{event}_end_time", end)

    def _record(self, method: str, *args: object, **kwargs: object) -> None:
        if not self._on:
            return
        try:
            getattr(self._recorder, method)(*args, **kwargs)
        except Exception as error:  # the job trains on whatever the recorder does
            self._on = False
            self._note(f"goodput recording off: {method} failed ({_short(error)})")

    @staticmethod
    def _at(seconds: float) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)


def _short(error: BaseException) -> str:
    text = str(error).strip().split("\n")[0][:200]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
