"""What the job prints on stdout (docs/design.md, "Job stdout lines"), read into a JobRun."""

from __future__ import annotations

import collections
import dataclasses
import re

STEP_LINE = re.compile(r"^tpu_training step=(\d+)")
RESUMED_LINE = re.compile(r"^tpu_training resumed_from=(\d+)")
STOPPED_LINE = re.compile(r"^tpu_training stopped_at=(\d+)")
SAVED_LINE = re.compile(r"^tpu_training saved (.*)$")
GOODPUT_LINE = re.compile(r"^tpu_training goodput (.*)$")
WAITING_LINE = re.compile(r"^tpu_training waiting_for_data pattern=(.*)$")
ERROR_LINE = re.compile(r"^tpu_training: error: (.*)$")
# The job's first line: the signal its faulthandler dumps every thread's stack on, and
# its bound on TPU initialisation; then the line once the TPU is initialised
# (docs/design.md, "Deadlines").
STARTED_LINE = re.compile(r"^tpu_training started (.*)$")
TPU_READY_LINE = re.compile(r"^tpu_training tpu_ready\b")
PROGRESS_PREFIX = "tpu_training "  # every line of the stdout contract (errors have a colon)
RECENT_LINES = 40  # other output kept for the status message (a pod worker named)
# Contract C4: the job found the TPU held by another process and exits 69 at once.
TPU_BUSY_LINE = re.compile(r"^tpu_training tpu_busy holders=(.*)$")
# How busy the TPU is (tpu_training.perf): at least every 50 executions and at the end.
PERF_LINE = re.compile(r"^tpu_training perf (.*)$")
# `checkpointEvery: auto`: the interval the job chose and why (tpu_training.config).
CHECKPOINT_INTERVAL_LINE = re.compile(r"^tpu_training checkpoint_interval (.*)$")

# Google's ML Goodput Measurement categories (docs/design.md, "Goodput"). The job
# reports the first five for its own process run; the agent owns the last three.
JOB_CATEGORIES = ("productive", "tpu_init", "program_startup", "checkpoint_save",
                  "checkpoint_restore")


def key_values(text: str) -> dict[str, str]:
    """`a=1 b=x` -> {"a": "1", "b": "x"}."""
    return dict(part.split("=", 1) for part in text.split() if "=" in part)


def seconds_fields(text: str) -> dict[str, float]:
    found = {}
    for key, value in key_values(text).items():
        try:
            found[key] = float(value)
        except ValueError:
            continue
    return found


@dataclasses.dataclass
class JobRun:
    """What one job process said on stdout: steps, saves, goodput, errors."""

    start_step: int = 0  # resumed_from
    step: int = 0  # the furthest step reached
    saved_step: int | None = None  # the last checkpoint this run wrote
    stopped_at: int | None = None  # `stopped_at=N`: stopped on a signal after saving N
    last_save: dict[str, object] | None = None
    stop_save: dict[str, object] | None = None
    reported: dict[str, float] = dataclasses.field(default_factory=dict)
    reported_step: int = 0
    waiting_pattern: str | None = None
    error: str | None = None
    tpu_busy: str | None = None  # `tpu_busy holders=...`: what the job saw holding the TPU
    perf: dict[str, object] | None = None  # the latest perf line (perf_fields)
    # {seconds, saveCost, mtbf, reason}: the latest checkpoint_interval line
    checkpoint_interval: dict[str, object] | None = None
    stacks_signal: str | None = None  # `started stacks=SIGUSR1`: its faulthandler's signal
    tpu_init_seconds: float | None = None  # `started tpu_init_seconds=...`
    executions: int = 0  # `step=` lines
    recent: collections.deque[str] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=RECENT_LINES))
    hang: dict[str, object] | None = None  # set by the agent when it stopped the run as hung

    def read(self, line: str) -> str | None:
        """Take in one line; which part changed ("started", "ready", "step", "save",
        "goodput") or None."""
        line = line.rstrip("\n")
        if not line.startswith(PROGRESS_PREFIX):
            self.recent.append(line)
        if match := STARTED_LINE.match(line):
            values = key_values(match[1])
            self.stacks_signal = values.get("stacks")
            self.tpu_init_seconds = seconds_fields(match[1]).get("tpu_init_seconds")
            return "started"
        if TPU_READY_LINE.match(line):
            return "ready"
        if match := RESUMED_LINE.match(line):
            self.start_step = self.step = int(match[1])
            return "step"
        if match := STOPPED_LINE.match(line):
            self.stopped_at = int(match[1])
            self.saved_step = self.stopped_at
        if STEP_LINE.match(line):
            self.executions += 1
        if match := STEP_LINE.match(line) or STOPPED_LINE.match(line):
            self.step = max(self.step, int(match[1]))
            return "step"
        if match := SAVED_LINE.match(line):
            return self._saved(key_values(match[1]))
        if match := GOODPUT_LINE.match(line):
            values = seconds_fields(match[1])
            self.reported_step = int(values.pop("step", self.reported_step))
            self.reported = {k: v for k, v in values.items() if k in JOB_CATEGORIES}
            return "goodput"
        if match := PERF_LINE.match(line):
            self.perf = perf_fields(match[1]) or self.perf
            return "perf"
        if match := CHECKPOINT_INTERVAL_LINE.match(line):
            values, figures = key_values(match[1]), seconds_fields(match[1])
            if {"seconds", "save_cost", "mtbf"} <= set(figures):
                self.checkpoint_interval = {
                    "seconds": figures["seconds"], "saveCost": figures["save_cost"],
                    "mtbf": figures["mtbf"], "reason": values.get("reason", "")}
                return "interval"
        if match := WAITING_LINE.match(line):
            self.waiting_pattern = match[1].strip()
        elif match := TPU_BUSY_LINE.match(line):
            self.tpu_busy = match[1].strip()
        elif match := ERROR_LINE.match(line):
            self.error = match[1].strip()
        return None

    def _saved(self, values: dict[str, str]) -> str | None:
        try:
            save: dict[str, object] = {"step": int(values["step"]),
                                       "seconds": float(values.get("seconds", 0)),
                                       "bytes": int(values.get("bytes", 0)),
                                       "reason": values.get("reason", "")}
        except (KeyError, ValueError):
            return None
        self.saved_step = int(save["step"])  # type: ignore[arg-type]
        self.step = max(self.step, self.saved_step)
        self.last_save = save
        if save["reason"] == "stop":
            self.stop_save = {k: save[k] for k in ("step", "seconds", "bytes")}
        return "save"


def perf_fields(text: str) -> dict[str, object] | None:
    """A perf line's figures as status fields: {step, examplesPerSec, inputWaitShare,
    mfu} (`mfu` a number, or "na" off a TPU); None when the line is malformed."""
    values = key_values(text)
    try:
        fields: dict[str, object] = {
            "step": int(values["step"]),
            "examplesPerSec": float(values["examples_per_sec"]),
            "inputWaitShare": float(values["input_wait_share"]),
            "mfu": "na" if values["mfu"] == "na" else float(values["mfu"]),
        }
    except (KeyError, ValueError):
        return None
    numbers = [v for v in fields.values() if isinstance(v, float)]
    return fields if all(0 <= v < float("inf") for v in numbers) else None
