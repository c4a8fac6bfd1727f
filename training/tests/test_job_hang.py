"""The job's side of deadlines (docs/design.md, "Deadlines"): its phase lines, and every
thread's stack on SIGUSR1 while the main thread is blocked inside TensorFlow."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

TIMEOUT = 120.0


def test_a_job_blocked_reading_a_pipe_says_started_and_tpu_ready_then_dumps_its_stacks(
        tmp_path, make_job):
    pipe = tmp_path / "data" / "train-00000-of-00001.tfrecord"
    pipe.parent.mkdir()
    os.mkfifo(pipe)  # no writer: opening it blocks
    config = tmp_path / "job.json"
    config.write_text(json.dumps(make_job(tmp_path / "work") | {"trainData": str(pipe)}))
    env = os.environ | {"TPU_STACK_TPU_INIT_SECONDS": "7"}
    process = subprocess.Popen([sys.executable, "-m", "tpu_training", "run", "--config",
                                str(config)], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.rstrip("\n")) for line in process.stdout],
                     daemon=True).start()
    seen: list[str] = []
    try:
        while not any(line.startswith("tpu_training tpu_ready") for line in seen):
            seen.append(lines.get(timeout=TIMEOUT))
        time.sleep(1.0)  # into the read of the first record
        process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + TIMEOUT
        while not any("tpu_training/__main__.py" in line for line in seen):  # the outermost
            seen.append(lines.get(timeout=max(0.1, deadline - time.monotonic())))
        time.sleep(0.5)
        assert process.poll() is None  # the dump does not end the job
    finally:
        process.kill()
        process.wait(TIMEOUT)
    progress = [line for line in seen if line.startswith("tpu_training ")]
    assert progress[:2] == ["tpu_training started stacks=SIGUSR1 tpu_init_seconds=7",
                            "tpu_training tpu_ready replicas=2"]
    text = "\n".join(seen)
    assert re.search(r"^Current thread 0x[0-9a-f]+ \(most recent call first\):$", text, re.M) \
        or re.search(r"^Thread 0x[0-9a-f]+ \(most recent call first\):$", text, re.M)
    assert re.search(r'File ".*tpu_training/data\.py", line \d+ in check_records\n'
                     r'  File ".*tpu_training/train\.py", line \d+ in _dataset_fn', text)
