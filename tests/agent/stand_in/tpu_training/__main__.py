"""`python -m tpu_training run --config FILE`, standing in for the real job.

TensorFlow loads `TF_PLUGGABLE_DEVICE_LIBRARY_PATH` at import and raises when it
is not a loadable plugin (tensorflow/__init__.py, load_pluggable_device_library),
and a CPU never fails TPU initialisation transiently, so the agent's tests use
this job for those two cases. The config's `standIn` picks the behaviour:

- `environment`: write the job's environment as JSON to `out`, then finish.
- `flaky`: exit 69 (TPU initialisation failed) the first `failures` runs, counting
  runs in `out`, then train to step 8 and finish.
- `busy`: take libtpu's lock as TensorFlow does (lockf F_TLOCK on the lock file,
  tensorflow/core/tpu/tpu_initializer_helper.cc); when that fails, print contract
  C4's `tpu_busy` line and exit 69, else train to step 8 and finish. A lock file
  owned by another user that is not writable fails as open(O_RDWR) fails for a
  process that is not root (the tests run as root, where it would not).
- `slow_first`: the job's phase lines (`started`, `tpu_ready`, `resumed_from=0`), then a
  first execution of `seconds` (tracing and compilation, merely slow), then steps 1 to 8
  a tenth of a second apart, and finish.
- `hang`: as a job does (faulthandler on SIGUSR1, `started stacks=SIGUSR1`), the phase
  lines, one step, then `lost` on stderr (what TensorFlow said of a lost worker), then
  block forever in `wait_forever` (its stacks name it).
- `lost`: `lost` on stderr, then an error line and exit 1 (a pod client that lost a
  worker and gave up).
- `train`: a step line every `stepSeconds` up to `steps`, resuming from the step
  saved in `out`; SIGTERM saves the step reached (`saved ... reason=stop`,
  `stopped_at=N`) and exits 75, as the real job does (docs/design.md, "Job stdout
  lines"). The pid of each run is appended to `out`.pids. When its stdout breaks (its
  agent died) it reopens stdout and stderr onto `TPU_STACK_JOB_LOG`, says
  `output_orphaned log=<path>` there and trains on (seam S2, as the real job does).
- `slow-start`: 60 s of start-up before anything is installed (the default SIGTERM
  disposition kills it), standing in for a job stopped before its handler exists.
"""

import faulthandler
import fcntl
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path


def take_tpu() -> bool:
    path = Path(os.environ["TPU_STACK_LIBTPU_LOCKFILE"])
    if path.exists():
        info = path.stat()
        if info.st_uid != os.getuid() and not info.st_mode & 0o002:
            return False
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True  # held until this process exits, as libtpu holds it


def wait_forever() -> None:
    threading.Event().wait()  # SIGTERM's default action ends it; the agent kills it anyway


def say(line: str) -> None:
    """A line on stdout; on a broken pipe (the agent died) onto TPU_STACK_JOB_LOG."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        path = os.environ.get("TPU_STACK_JOB_LOG")
        if not path:
            raise
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        print(f"tpu_training output_orphaned log={path}", flush=True)  # the line lost too


def train(config: dict, out: Path) -> int:
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stop.append(signum))
    with Path(f"{out}.pids").open("a") as pids:
        pids.write(f"{os.getpid()}\n")
    step = int(out.read_text()) if out.exists() else 0
    say(f"tpu_training resumed_from={step}")
    while step < config["steps"] and not stop:
        time.sleep(config.get("stepSeconds", 0.2))
        step += 1
        say(f"tpu_training step={step} loss=0.5")
    out.write_text(str(step))
    reason = "stop" if stop else "final"
    say(f"tpu_training saved step={step} seconds=0.01 bytes=1 reason={reason}")
    if stop:
        say(f"tpu_training stopped_at={step}")
        return 75
    say(f"tpu_training complete={step} export=none")
    return 0


def main() -> int:
    config = json.loads(Path(sys.argv[sys.argv.index("--config") + 1]).read_text())
    out = Path(config["out"])
    if config["standIn"] == "train":
        return train(config, out)
    if config["standIn"] == "slow-start":
        out.write_text("starting")
        time.sleep(60)
        return 0
    if config["standIn"] == "environment":
        out.write_text(json.dumps(dict(os.environ)))
        print("tpu_training step=1 loss=0.5", flush=True)
        return 0
    if config["standIn"] == "busy":
        if not take_tpu():
            print("tpu_training tpu_busy holders=unknown", flush=True)
            print("tpu_training: error: the TPU is in use by another process",
                  file=sys.stderr, flush=True)
            return 69
        print("tpu_training step=8 loss=0.1", flush=True)
        return 0
    if config["standIn"] == "hang":
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
        for line in ("started stacks=SIGUSR1 tpu_init_seconds=300", "tpu_ready replicas=8",
                     "resumed_from=0", "step=5 loss=1.0"):
            print(f"tpu_training {line}", flush=True)
        print(config["lost"], file=sys.stderr, flush=True)
        wait_forever()
    if config["standIn"] == "lost":
        print(config["lost"], file=sys.stderr, flush=True)
        print("tpu_training: error: Socket closed", file=sys.stderr, flush=True)
        return 1
    if config["standIn"] == "slow_first":
        for line in ("started tpu_init_seconds=300", "tpu_ready replicas=1",
                     "resumed_from=0"):
            print(f"tpu_training {line}", flush=True)
        time.sleep(config["seconds"])
        for step in range(1, 9):
            print(f"tpu_training step={step} loss=0.5", flush=True)
            time.sleep(0.1)
        return 0
    runs = int(out.read_text()) if out.exists() else 0
    out.write_text(str(runs + 1))
    if runs < config["failures"]:
        print("tpu_training: error: TPU 'local' did not initialise: UnavailableError: "
              "TPU in use", file=sys.stderr, flush=True)
        return 69
    print("tpu_training step=8 loss=0.1", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
