"""What the TPU runtime says of its own use: duty cycle and HBM, through `tpu-info`."""

# libtpu serves its runtime metrics over gRPC on localhost:8431 (`RuntimeMetricService.
# GetRuntimeMetric`: `tpu.runtime.tensorcore.dutycycle.percent`,
# `tpu.runtime.hbm.memory.usage.bytes`, `tpu.runtime.hbm.memory.total.bytes`;
# AI-Hypercomputer/cloud-accelerator-diagnostics tpu_info/tpu_info/metrics.py,
# get_chip_usage). The agent is standard library only and gRPC is not, so it runs
# Google's `tpu-info` CLI (PyPI `tpu-info`, 0.5.1 or newer for `--metric`) when the VM
# has it, and reads the two tables it prints (tpu_info/cli_helper.py,
# get_duty_cycle_table: a row per core, "<n>%"; get_hbm_usage_table: a row per device,
# "<used> GiB / <total> GiB"; "N/A" when the metrics are unavailable).
#
# Unconfirmed: no TPU VM image is known to carry tpu-info (install it with pip on the
# image, or point TPU_STACK_TPU_INFO at it), and tpu-info's README names JAX and
# PyTorch/XLA as the frameworks whose libtpu serves the metrics; whether TensorFlow's
# does is unknown. Without either, the status simply has no runtime figures: the job's
# own perf line (tpu_training.perf) does not depend on them.

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

TPU_INFO_ENV = "TPU_STACK_TPU_INFO"  # the tpu-info command; default: `tpu-info` on PATH
TIMEOUT_SECONDS = 10.0
EVERY_SECONDS = 60.0  # at most one read a minute
_PERCENT = re.compile(r"(?<![\w(])(\d+(?:\.\d+)?)\s*%")
_HBM = re.compile(r"(\d+(?:\.\d+)?)\s*GiB\s*/\s*(\d+(?:\.\d+)?)\s*GiB")


def parse_tpu_info(text: str) -> dict[str, float]:
    """`dutyCyclePercent` (the mean over cores), `hbmUsedGiB` and `hbmTotalGiB` (summed
    over devices) from `tpu-info --metric duty_cycle_percent --metric hbm_usage`; only the
    figures the text holds."""
    duty: list[float] = []
    used, total = [], []
    section = ""
    for line in text.splitlines():
        if "Duty Cycle" in line and "%" not in line.replace("(%)", ""):
            section = "duty"
        elif "HBM Usage" in line and "GiB /" not in line:
            section = "hbm"
        if match := _HBM.search(line):
            used.append(float(match[1]))
            total.append(float(match[2]))
        elif section == "duty" and (match := _PERCENT.search(line.replace("(%)", ""))):
            duty.append(float(match[1]))
    figures: dict[str, float] = {}
    if duty:
        figures["dutyCyclePercent"] = round(sum(duty) / len(duty), 2)
    if used:
        figures["hbmUsedGiB"] = round(sum(used), 2)
        figures["hbmTotalGiB"] = round(sum(total), 2)
    return figures


class RuntimeMetrics:
    """The latest runtime figures, read at most every EVERY_SECONDS; {} without tpu-info."""

    def __init__(self, command: str | None = None):
        self.command = command or os.environ.get(TPU_INFO_ENV) or "tpu-info"
        self._read_at = -EVERY_SECONDS
        self._figures: dict[str, float] = {}

    def latest(self) -> dict[str, float]:
        now = time.monotonic()
        if now - self._read_at >= EVERY_SECONDS:
            self._read_at = now
            self._figures = self._read()
        return dict(self._figures)

    def _read(self) -> dict[str, float]:
        executable = shutil.which(self.command)
        if executable is None:
            return {}
        try:
            done = subprocess.run(
                [executable, "--metric", "duty_cycle_percent", "--metric", "hbm_usage"],
                capture_output=True, text=True, timeout=TIMEOUT_SECONDS, check=False)
        except (OSError, subprocess.SubprocessError):
            return {}
        return parse_tpu_info(done.stdout)
