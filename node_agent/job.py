"""The training process: started in its own session, its output read, stopped with a grace."""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from node_agent.common import log, utc_now
from node_agent.contract import EXIT_PREEMPTED, JOB_LOG_ENV, ORPHAN_LOG
from node_agent.deadlines import STOP_SECONDS, Deadlines, Hang, PhaseClock
from node_agent.job_lines import PROGRESS_PREFIX, JobRun
from node_agent.status import Status
from node_agent.supervise import Loop, Loops

STOP_GRACE_SECONDS = STOP_SECONDS  # the unit's TimeoutStopSec leaves room above this
EXIT_AFTER_STOP_SECONDS = 3.0  # after `stopped_at=N` (its checkpoint saved) the job gets this
# What systemd gives the agent for sd_notify (supervise.py); never the job's to use.
SYSTEMD_ONLY = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
READ_WAIT_SECONDS = 0.5  # the reader looks up this often (to pause for a hand-over)
LONGEST_LINE_BYTES = 1 << 20  # a longer run of output without a newline counts as a line


def process_start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat, telling a pid apart from a later reuse of it;
    None when no such process lives (a zombie has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


class Process(Protocol):
    pid: int

    def poll(self) -> int | None: ...
    def wait(self) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def kill(self) -> None: ...


class Adopted:
    """A job process this agent did not start but inherited: an earlier agent of the
    same process (exec in place, see agent.py) started it, so it is still this
    process's child and waitpid(2) reaps it, as Popen would."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def _reap(self, flags: int) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, flags)
            except ChildProcessError:  # reaped elsewhere: its code is lost
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> int | None:
        return self._reap(os.WNOHANG)

    def wait(self) -> int:
        code = self._reap(0)
        assert code is not None
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Job:
    """The training process: its own session, a pid file, output parsed into a JobRun.

    Its output is read from the pipe's file descriptor in a supervised loop that never
    stops before the end of the output: a line that cannot be taken in is logged and
    skipped (the job would block on a full pipe otherwise). The reader can pause and
    hand the descriptor, the unread part of a line and the JobRun to a new agent."""

    def __init__(self, root: Path, status: Status, loops: Loops | None = None):
        self.pid_file = root / "run" / "job.pid"
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        self.status = status
        self.loops = loops or Loops()
        self.process: Process | None = None
        self.run = JobRun()
        self.sessions: set[int] = set()  # every job started leads a session of its own
        self.on_progress: Callable[[JobRun, str], None] = lambda _run, _what: None
        self._fd: int | None = None
        self._stdout: object = None  # keeps Popen's pipe object (and so the fd) open
        self._partial = b""
        self._reader_stop = threading.Event()
        self._reader: Loop | None = None
        self._config: Path | None = None
        self.clock = PhaseClock(Deadlines(), 0, time.monotonic())
        self._hung: tuple[Hang, float] | None = None  # stacks sent, the stop next

    def start(self, config: Path, env: Mapping[str, str], cwd: Path) -> None:
        command = [sys.executable, "-m", "tpu_training", "run", "--config", str(config)]
        orphan_log = self.pid_file.with_name(ORPHAN_LOG)
        orphan_log.unlink(missing_ok=True)  # an earlier job's, already read
        env = {key: value for key, value in env.items() if key not in SYSTEMD_ONLY} | \
            {JOB_LOG_ENV: str(orphan_log)}  # seam S2
        self.run = JobRun()
        self._config = config
        self._start_clock(json.loads(config.read_text()), env)
        process = subprocess.Popen(command, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self.process = process
        self.sessions.add(process.pid)
        assert process.stdout is not None
        self._stdout = process.stdout
        self._read_from(process.stdout.fileno(), b"")  # first: nothing below may leave it unread
        try:
            self.pid_file.write_text(f"{process.pid} {process_start_time(process.pid)}\n")
        except OSError as error:  # a full disk: a new agent cannot find it by pid, no more
            self.status.note(f"{self.pid_file}: {error}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def handover(self) -> dict[str, object]:
        """Pause the reader and describe the running job for a new agent of this same
        process (its descriptor made inheritable across exec)."""
        assert self.process is not None and self._fd is not None
        self._reader_stop.set()
        if self._reader is not None:
            self._reader.done.wait(READ_WAIT_SECONDS * 4)
        os.set_inheritable(self._fd, True)
        return {"pid": self.process.pid, "started": process_start_time(self.process.pid),
                "fd": self._fd, "partial": self._partial.decode(errors="replace"),
                "run": {**dataclasses.asdict(self.run), "recent": list(self.run.recent)},
                "sessions": sorted(self.sessions), "config": str(self._config or "")}

    def resume_reading(self) -> None:
        """Go on reading after a hand-over that did not happen."""
        if self._fd is not None and (self._reader is None or self._reader.done.is_set()):
            self._read_from(self._fd, self._partial)

    def adopt(self, state: Mapping[str, object]) -> bool:
        """Follow the job an earlier agent of this process handed over; False when it
        is not the process that was described (then nothing is adopted)."""
        pid, fd = int(state["pid"]), int(state["fd"])  # type: ignore[call-overload]
        if process_start_time(pid) != state.get("started"):
            return False
        self.process = Adopted(pid)
        run = dict(state["run"])  # type: ignore[call-overload]
        recent = run.pop("recent", [])
        self.run = JobRun(**run)
        self.run.recent.extend(recent)
        self._adopt_clock(Path(str(state.get("config") or "")))
        self.sessions |= set(state.get("sessions") or [pid])  # type: ignore[arg-type]
        os.set_inheritable(fd, False)
        self._read_from(fd, str(state.get("partial") or "").encode())
        return True

    def _start_clock(self, job: Mapping[str, object], env: Mapping[str, str]) -> None:
        steps = job.get("trainSteps")
        self.clock = PhaseClock(Deadlines.for_job(job, env),
                                steps if isinstance(steps, int) else 0, time.monotonic())
        self.status.progress(phase=self.clock.phase, progressAt=utc_now())

    def _adopt_clock(self, config: Path) -> None:
        """The phase clock of a job handed over mid-run: its deadlines from its config,
        its phase from what the run has seen (the time of its last line is not handed
        over: it counts from now)."""
        self._config = config
        try:
            job = json.loads(config.read_text())
        except (OSError, ValueError):
            job = {}
        self._start_clock(job if isinstance(job, dict) else {}, os.environ)
        now = time.monotonic()
        self.clock.started(self.run.tpu_init_seconds, now)
        if self.run.executions:
            self.clock.executed(self.run.executions, self.run.step, now)

    def poll(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def overdue(self) -> Hang | None:
        """The running job's phase has passed its deadline (docs/design.md, "Deadlines")."""
        return self.clock.overdue(time.monotonic()) if self.poll() is None else None

    def send_stacks(self, hang: Hang) -> None:
        """Stacks of every thread to job.log (the signal the job's `started` line named,
        then a moment), before the stop; the run keeps the hang and, once it exited, the
        seconds since its last progress line (goodput counts them lost)."""
        assert self.process is not None
        if (name := self.run.stacks_signal) in signal.Signals.__members__:
            self.status.note(f"no progress for {hang.seconds:.0f}s in phase {hang.phase} "
                             f"(deadline {hang.deadline:.0f}s): {name} for the job's stacks")
            self.process.send_signal(signal.Signals[name])
            time.sleep(self.clock.deadlines.stacks_wait)
        self._hung = (hang, self.clock.last_progress)

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
        if self._hung is not None:  # the stacks were sent: the run keeps the hang
            hang, last_progress = self._hung
            self.run.hang = hang.view() | {"lost": round(time.monotonic() - last_progress, 1)}
            self._hung = None
        if self._reader is not None:
            self._reader.done.wait(10)
        self.pid_file.unlink(missing_ok=True)
        return code

    def _read_from(self, fd: int, partial: bytes) -> None:
        self._fd, self._partial = fd, partial
        self._reader_stop = threading.Event()
        self._reader = self.loops.start("job-output", self._read_some, self._reader_stop)

    def _read_some(self) -> bool:
        """One read of the job's output; False at its end."""
        assert self._fd is not None
        ready, _, _ = select.select([self._fd], [], [], READ_WAIT_SECONDS)
        if not ready:
            return True
        chunk = os.read(self._fd, 1 << 16)
        if not chunk:
            if self._partial:
                self._take(self._partial)
                self._partial = b""
            if self._stdout is None:  # an adopted descriptor is this reader's to close
                os.close(self._fd)
            return False
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for line in lines:
            self._take(line + b"\n")
        if len(self._partial) > LONGEST_LINE_BYTES:
            self._take(self._partial + b"\n")
            self._partial = b""
        return True

    def _take(self, raw: bytes) -> None:
        """One line of output into job.log and the JobRun; a failure loses the line only."""
        try:
            line = raw.decode(errors="replace")
            self.status.append_job_line(line)
            changed = self.run.read(line)
            if line.startswith(PROGRESS_PREFIX):
                self._timed(changed)
            if changed:
                self.on_progress(self.run, changed)
        except Exception as error:  # the reader never stops (see the class)
            log(f"job output line not taken in: {type(error).__name__}: {error}")

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
    """A job left by an earlier agent (a crash, an OOM kill, a bad update) still holds the
    TPU: stop it by pid with SIGTERM, so it saves and exits 75. A job that lost its agent
    writes its lines to run/job-output.log (seam S2); `orphan_output` reads them."""
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


def orphan_output(root: Path) -> list[str]:
    """The lines a job wrote after it lost its agent (seam S2), taken once (the file is
    removed); [] when there are none."""
    path = root / "run" / ORPHAN_LOG
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    path.unlink(missing_ok=True)
    return text.splitlines(keepends=True)


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
