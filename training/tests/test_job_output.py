"""The job's output as the node agent reads it: stdout and stderr on one pipe
(docs/design.md, "Job stdout lines"; "The job outlives its agent")."""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tpu_training

TIMEOUT = 120.0
LINES = 3000
# Another process writes to the same pipe (as TensorFlow's C++ threads write to stderr,
# outside the GIL) while the job says its lines: fragments without a newline, as often
# as it can. With print's two writes a line, about one line in ten was torn here. The
# noise says it is ready from inside its writing (after 100 fragments): a process that
# said so before its first write was, on a busy machine, killed before it wrote any.
NOISY_SAYER = f"""
import os, subprocess, sys
from tpu_training import output

ready, told = os.pipe()
noise = subprocess.Popen([sys.executable, "-c", "import os, sys\\nfor _ in range(100): "
                          "os.write(2, b'#')\\nos.write(int(sys.argv[1]), b'r')\\n"
                          "while True: os.write(2, b'#')", str(told)], pass_fds=[told])
os.read(ready, 1)
for i in range({LINES}):
    output.say(f"step={{i}} loss=0.5")
noise.kill()
"""


def test_every_line_is_one_write_while_another_thread_writes_the_same_pipe():
    env = os.environ | {"PYTHONUNBUFFERED": "1"}  # as the agent runs the job
    done = subprocess.run([sys.executable, "-c", NOISY_SAYER], env=env, timeout=TIMEOUT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=True)
    text = done.stdout.decode()
    assert text.count("#") > 0  # the noise did run
    torn = [i for i in range(LINES) if f"tpu_training step={i} loss=0.5\n" not in text]
    assert torn == []
    assert len(re.findall(r"tpu_training step=\d+ loss=0\.5\n", text)) == LINES


def test_no_module_of_the_job_prints_but_through_output():
    """One function every line goes through: no `print` and no direct write to the
    standard streams anywhere else in the package."""
    package = Path(tpu_training.__file__).parent
    offenders = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                called = ast.unparse(node.func)
                if called == "print" or called.startswith(("sys.stdout", "sys.stderr")):
                    offenders.append(f"{path.name}:{node.lineno} {called}")
    assert offenders == []


def start_job(config: Path, log: Path) -> subprocess.Popen:
    env = os.environ | {"PYTHONUNBUFFERED": "1", "TPU_STACK_JOB_LOG": str(log)}
    return subprocess.Popen([sys.executable, "-m", "tpu_training", "run", "--config",
                             str(config)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def read_until_step(process: subprocess.Popen) -> list[str]:
    lines = []
    while not lines or not lines[-1].startswith("tpu_training step="):
        line = process.stdout.readline()
        assert line, f"the job ended early: {lines}"
        lines.append(line.decode().rstrip("\n"))
    return lines


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_job_whose_reader_goes_trains_to_the_end_with_its_lines_in_its_log(
        job_file, tmp_path):
    config = job_file(trainSteps=200, stepsPerExecution=5, checkpointEverySteps=100)
    log = tmp_path / "run" / "job.log"
    log.parent.mkdir()
    process = start_job(config, log)
    before = read_until_step(process)
    process.stdout.close()  # the agent died: nobody reads the pipe
    assert process.wait(TIMEOUT) == 0
    lines = log.read_text().splitlines()
    assert lines[0] == f"tpu_training output_orphaned log={log}"
    steps = [int(m[1]) for m in map(re.compile(r"tpu_training step=(\d+) ").match, lines) if m]
    first = int(before[-1].split("=")[1].split()[0])
    assert steps and steps[0] > first and steps[-1] == 200
    assert "tpu_training complete=200 export=" in log.read_text()


def test_an_orphaned_job_stopped_by_pid_saves_and_says_where_it_stopped_in_its_log(
        job_file, tmp_path):
    config = job_file(trainSteps=100_000, stepsPerExecution=5, checkpointEverySteps=1000)
    log = tmp_path / "job.log"
    process = start_job(config, log)
    read_until_step(process)
    process.stdout.close()
    wait_for(lambda: log.exists() and "tpu_training step=" in log.read_text(),
             "a step line in the log after the reader went")
    process.send_signal(signal.SIGTERM)
    assert process.wait(TIMEOUT) == 75
    text = log.read_text()
    stopped = re.search(r"^tpu_training stopped_at=(\d+)$", text, re.M)
    assert stopped, text
    assert re.search(rf"^tpu_training saved step={stopped[1]} .* reason=stop ", text, re.M)



# Says a line a few times a second until told to stop, without the reader-following
# thread: only a failed write (EPIPE) can move its output.
SAYER_WITHOUT_FOLLOWER = """
import pathlib, sys, time
from tpu_training import output

output.say("step=0 loss=0.5")
stop = pathlib.Path(sys.argv[1])
i = 0
while not stop.exists():
    i += 1
    output.say(f"step={i} loss=0.5")
    output.tell(f"note {i}")
    time.sleep(0.05)
output.say(f"complete={i} export=x")
"""


@pytest.mark.parametrize("named", [True, False])
def test_a_write_that_meets_a_closed_pipe_moves_the_output_to_the_log(tmp_path, named):
    log = tmp_path / "job.log"
    env = {key: value for key, value in os.environ.items() if key != "TPU_STACK_JOB_LOG"}
    if named:
        env["TPU_STACK_JOB_LOG"] = str(log)
    stop = tmp_path / "stop"
    process = subprocess.Popen([sys.executable, "-c", SAYER_WITHOUT_FOLLOWER, str(stop)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert process.stdout.readline() == b"tpu_training step=0 loss=0.5\n"
    process.stdout.close()
    if not named:
        log = Path(f"/tmp/tpu_training-{process.pid}.log")
    try:
        wait_for(lambda: log.exists() and "tpu_training: note" in log.read_text(),
                 "a line in the log")
        stop.touch()
        assert process.wait(TIMEOUT) == 0  # no BrokenPipeError, no SIGPIPE
        lines = log.read_text().splitlines()
    finally:
        process.kill()
        if not named:
            log.unlink(missing_ok=True)
    assert lines[0] == f"tpu_training output_orphaned log={log}"
    assert lines[-1].startswith("tpu_training complete=")
