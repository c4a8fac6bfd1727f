"""The job keeps its SIGTERM and SIGUSR1 handlers when TensorFlow or libtpu replaces them
(docs/design.md, "Job stdout lines", `handlers_reinstalled`; tpu_training.stopping)."""

from __future__ import annotations

import ctypes
import re
import signal
import subprocess
import sys
import time

import pytest

from tpu_training.stopping import StopFlag, native_handler

TIMEOUT = 120.0
# The job as the agent runs it, but a step of its start replaces its handlers behind
# Python's back (sigaction from C, as libtpu does on a TPU VM: pytorch/xla#3028, #5616),
# at once or lazily: making the strategy, or the first execution.
REPLACING_JOB = """
import ctypes, runpy, signal, sys
import tpu_training.strategy as strategies
from tpu_training import train

libc = ctypes.CDLL(None)

def replace_handlers():
    for signum in (signal.SIGTERM, signal.SIGUSR1):
        libc.signal(signum, ctypes.c_void_p(0))  # SIG_DFL: the default action ends us

def replacing(make):  # on the first call only
    calls = []
    def made(*args, **kwargs):
        result = make(*args, **kwargs)
        if not calls:
            replace_handlers()
        calls.append(1)
        return result
    return made

if sys.argv[2] == "strategy":
    strategies.make_strategy = replacing(strategies.make_strategy)
else:
    train_steps_fn = train.Job.train_steps_fn
    train.Job.train_steps_fn = lambda self: replacing(train_steps_fn(self))
sys.argv = ["tpu_training", "run", "--config", sys.argv[1]]
runpy.run_module("tpu_training", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("replaced_in", ["strategy", "first_execution"])
def test_handlers_replaced_while_the_tpu_initialises_are_put_back_and_sigterm_saves(
        job_file, tmp_path, replaced_in):
    config = job_file(trainSteps=100_000, stepsPerExecution=5, checkpointEverySteps=1000)
    stderr = tmp_path / "stderr.log"
    with stderr.open("w") as err:
        process = subprocess.Popen([sys.executable, "-c", REPLACING_JOB, str(config),
                                    replaced_in], stdout=subprocess.PIPE, stderr=err,
                                   text=True)
    lines: list[str] = []
    try:
        while not any(line.startswith("tpu_training step=10 ") for line in lines):
            line = process.stdout.readline()  # past the first execution, and one more
            assert line, f"the job ended early: {lines}"
            lines.append(line.rstrip("\n"))
        process.send_signal(signal.SIGUSR1)  # every thread's stack, and the job lives on
        deadline = time.monotonic() + TIMEOUT
        while "most recent call first" not in stderr.read_text():
            assert process.poll() is None and time.monotonic() < deadline, lines
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        assert process.wait(TIMEOUT) == 75
    finally:
        process.kill()
    lines += process.stdout.read().splitlines()
    after = "tpu_training tpu_ready replicas=2" if replaced_in == "strategy" else next(
        line for line in lines if line.startswith("tpu_training step=5 "))
    reinstalled = [i for i, line in enumerate(lines)
                   if line.startswith("tpu_training handlers_reinstalled")]
    assert [lines[i] for i in reinstalled] == [
        "tpu_training handlers_reinstalled signals=SIGTERM,SIGUSR1 replaced_by=SIG_DFL,SIG_DFL"]
    assert lines.index(after) < reinstalled[0]
    if replaced_in == "strategy":
        assert reinstalled[0] == lines.index(after) + 1
    stopped = re.fullmatch(r"tpu_training stopped_at=(\d+)", next(
        line for line in lines if line.startswith("tpu_training stopped_at=")))
    assert f"tpu_training saved step={stopped[1]} " in "\n".join(lines)


def test_the_guard_sees_a_handler_replaced_from_python_and_from_c():
    flag = StopFlag().install((signal.SIGUSR2,))
    libc = ctypes.CDLL(None)
    try:
        assert flag.guard.restore() == []
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        assert flag.guard.restore() == [("SIGUSR2", "SIG_IGN")]
        assert signal.getsignal(signal.SIGUSR2) == flag._handle
        ours = native_handler(signal.SIGUSR2)
        libc.signal(signal.SIGUSR2, ctypes.c_void_p(1))  # SIG_IGN, unseen by Python
        assert signal.getsignal(signal.SIGUSR2) == flag._handle
        assert flag.guard.restore() == [("SIGUSR2", "SIG_IGN")]
        assert native_handler(signal.SIGUSR2) == ours
        signal.raise_signal(signal.SIGUSR2)
        assert flag.signal == signal.SIGUSR2
    finally:
        flag.uninstall()
    assert flag.guard.restore() == []  # uninstalled: nothing kept
