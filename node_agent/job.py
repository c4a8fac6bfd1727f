"""The training process: started in its own session, its output read, stopped with a grace."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from node_agent.common import log, utc_now
from node_agent.contract import EXIT_PREEMPTED
from node_agent.deadlines import STOP_SECONDS, Deadlines, Hang, PhaseClock
from node_agent.job_lines import PROGRESS_PREFIX, JobRun
from node_agent.status import Status

STOP_GRACE_SECONDS = STOP_SECONDS  # the unit's TimeoutStopSec leaves room above this
EXIT_AFTER_STOP_SECONDS = 3.0  # after `stopped_at=N` (its checkpoint saved) the job gets this


def process_start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat, telling a pid apart from a later reuse of it;
    None when no such process lives (a zombie has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


class Job:
    """The training process: its own session, a pid file, output parsed into a JobRun."""

    def __init__(self, root: Path, status: Status):
        self.pid_file = root / "run" / "job.pid"
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        self.status = status
        self.process: subprocess.Popen[bytes] | None = None
        self.run = JobRun()
        self.sessions: set[int] = set()  # every job started leads a session of its own
        self.on_progress: Callable[[JobRun, str], None] = lambda _run, _what: None
        self._reader: threading.Thread | None = None
        self.clock = PhaseClock(Deadlines(), 0, time.monotonic())

    def start(self, config: Path, env: Mapping[str, str], cwd: Path) -> None:
        command = [sys.executable, "-m", "tpu_training", "run", "--config", str(config)]
        self.run = JobRun()
        job = json.loads(config.read_text())
        self.clock = PhaseClock(Deadlines.for_job(job, env), int(job.get("trainSteps") or 0),
                                time.monotonic())
        self.status.progress(phase=self.clock.phase, progressAt=utc_now())
        self.process = subprocess.Popen(command, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self.sessions.add(self.process.pid)
        self.pid_file.write_text(f"{self.process.pid} {process_start_time(self.process.pid)}\n")
        self._reader = threading.Thread(target=self._read_output, args=(self.process.stdout,),
                                        daemon=True)
        self._reader.start()

    def poll(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def overdue(self) -> Hang | None:
        """The running job's phase has passed its deadline (docs/design.md, "Deadlines")."""
        return self.clock.overdue(time.monotonic()) if self.poll() is None else None

    def stop_hung(self, hang: Hang) -> int:
        """Stacks of every thread to job.log (the signal the job's `started` line named,
        then a moment), then the stop; the run keeps the hang and, once it exited, the
        seconds since its last progress line (goodput counts them lost)."""
        assert self.process is not None
        if (name := self.run.stacks_signal) in signal.Signals.__members__:
            self.status.note(f"no progress for {hang.seconds:.0f}s in phase {hang.phase} "
                             f"(deadline {hang.deadline:.0f}s): {name} for the job's stacks")
            self.process.send_signal(signal.Signals[name])
            time.sleep(self.clock.deadlines.stacks_wait)
        last_progress = self.clock.last_progress
        code = self.stop()
        self.run.hang = hang.view() | {"lost": round(time.monotonic() - last_progress, 1)}
        return code

    def stop(self, grace: float | None = None) -> int:
        """SIGTERM (the job checkpoints and exits 75), SIGKILL after `grace` seconds (the
        job's stop deadline by default), or
        EXIT_AFTER_STOP_SECONDS after the job said its stop checkpoint is saved: a
        TensorFlow process can spend longer than a spot VM's notice tearing itself down
        (16 s for mnist_cnn on a loaded 2-core machine), and the checkpoint is durable."""
        assert self.process is not None
        self.clock.stopping(time.monotonic())
        self.status.progress(phase="stop")
        grace = self.clock.deadline() if grace is None else grace
        deadline = time.monotonic() + grace
        saved_at: float | None = None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        while self.process.poll() is None:
            now = time.monotonic()
            if saved_at is None and self.run.stopped_at is not None:
                saved_at = now
            if saved_at is not None and now - saved_at > EXIT_AFTER_STOP_SECONDS:
                self.status.note(f"job saved step {self.run.stopped_at} but had not exited "
                                 f"{EXIT_AFTER_STOP_SECONDS:.0f}s later; killing it")
                self.process.kill()
                self.wait()
                return EXIT_PREEMPTED
            if now > deadline:
                self.status.note(f"job ignored SIGTERM for {grace:.0f}s; killing it")
                self.process.kill()
                break
            time.sleep(0.1)
        return self.wait()

    def wait(self) -> int:
        assert self.process is not None
        code = self.process.wait()
        if self._reader is not None:
            self._reader.join(timeout=10)
        self.pid_file.unlink(missing_ok=True)
        return code

    def _read_output(self, stream: IO[bytes]) -> None:
        for raw in stream:
            line = raw.decode(errors="replace")
            self.status.append_job_line(line)
            changed = self.run.read(line)
            if line.startswith(PROGRESS_PREFIX):
                self._timed(changed)
            if changed:
                self.on_progress(self.run, changed)

    def _timed(self, changed: str | None) -> None:
        """A progress line: the phase clock moves on, status gets phase and time."""
        now, clock = time.monotonic(), self.clock
        if changed == "started":
            clock.started(self.run.tpu_init_seconds, now)
        elif changed == "ready":
            clock.tpu_ready(now)
        elif changed == "step":
            clock.executed(self.run.executions, self.run.step, now)
        else:
            clock.progressed(now)
        self.status.progress(phase=clock.phase, progressAt=utc_now())


def stop_stale_job(root: Path) -> None:
    """A job left by an earlier agent still holds the TPU ("TPU in use"): stop it by pid."""
    pid_file = root / "run" / "job.pid"
    try:
        pid_text, started = pid_file.read_text().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        return
    if process_start_time(pid) == started:
        log(f"stopping job pid {pid} left by an earlier agent")
        terminate(pid, started)
    pid_file.unlink(missing_ok=True)


def terminate(pid: int, started: str | None, grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds, to the process `pid` started at
    `started` (never to a later process that reused the pid)."""
    if started is None or process_start_time(pid) != started:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while process_start_time(pid) == started and time.monotonic() < deadline:
        time.sleep(0.5)
    if process_start_time(pid) == started:
        os.kill(pid, signal.SIGKILL)
