"""tpu-stack node agent: install the training package from GCS and supervise the job.

    python3 agent.pyz run            one pass: install, run the job, exit with its outcome
    python3 agent.pyz run --stay     as a service: after the job ends wait for a new release

Environment: GCE_METADATA_HOST, STORAGE_EMULATOR_HOST (google-auth and
google-cloud-storage conventions), TPU_STACK_ROOT (default /opt/tpu-stack).
"""
# Runs on every TPU VM worker at every boot (the bootstrap writes the zipapp and starts
# it), with nothing but the image's Python and TensorFlow: standard library only.
# Its inputs are the node's metadata (docs/design.md, "What a TPU node carries in
# metadata") and the releases under its `tpu-stack-release` prefix; every output goes
# to guest attributes and to GCS, so nothing is lost when a spot node disappears.
#
# Transient failures (TPU not ready or in use, storage 5xx, data not there yet) are
# retried with backoff for as long as the node lives; permanent ones (a bad job
# config, records that do not fit the model, a package whose sha256 differs) stop
# with state `failed` and the job's last error line as the message. A preemption
# or host-maintenance notice stops the job at once so it saves inside the notice; an
# announced maintenance window gets a checkpoint before it starts.

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from node_agent import handover, lifecycle, supervise
from node_agent.common import (
    AgentError,
    Backoff,
    TransientError,
    log,
    write_atomically,
)
from node_agent.contract import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PREEMPTED,
    STATUS_KEY,
    STOP_REQUEST_KEY,
    JobState,
)
from node_agent.desired import Desired, node_settings
from node_agent.goodput import Goodput
from node_agent.install import Installer
from node_agent.job import Job, stop_stale_job, terminate
from node_agent.job_lines import JobRun
from node_agent.life import Actions, Observers
from node_agent.limits import Limits, NodeView, StopConditions, node_started
from node_agent.metadata import DEFAULT_METADATA_HOST, Metadata, worker_number
from node_agent.runtime_metrics import RuntimeMetrics
from node_agent.status import Status
from node_agent.storage import Storage, storage_endpoint
from node_agent.supervise import Loops
from node_agent.updates import Updater
from node_agent.watchers import (
    MAINTENANCE_RETRY_CAP_SECONDS,
    LongPoll,
    MaintenanceWatcher,
    NoticeWatcher,
    ReleaseWatcher,
    long_poll_bound,
)

DEFAULT_ROOT = "/opt/tpu-stack"
MAIN_WAIT_SECONDS = 30.0  # the main thread beats (supervise.Loops.beat) at least this often
HANDOVER_FLUSH_SECONDS = 5.0  # the status upload before a hand-over waits at most this
STOPPING_ATTEMPTS = 3  # builds of an agent under a stop, with a job handed over


class Agent(Observers, Actions):
    def __init__(self, root: Path, stay: bool, handed: Mapping[str, object] | None = None,
                 stop_requested: Callable[[], str | None] = lifecycle.never_requested):
        self.root = root
        # Seam S4: a stop request (a limit, a budget) polled once a second while the job
        # runs and before it starts; the job is stopped with a save and not started again
        # while it holds (node_agent/lifecycle.py).
        self.stop_requested = stop_requested
        if stop_requested is lifecycle.never_requested:  # the node's own conditions
            self.stop_requested = self._conditions_due
        self.stay = stay
        self.started_at = time.time()
        self.loops = Loops()
        self.metadata = Metadata(os.environ.get("GCE_METADATA_HOST") or DEFAULT_METADATA_HOST)
        self.storage = Storage(self.metadata, storage_endpoint())
        self.installer = Installer(root, self.storage)
        # One request for every attribute: a reboot's time to launch is mostly requests.
        self.attributes = self.metadata.attributes()
        self.worker = worker_number(self.attributes)
        self.status = Status(self.metadata, self.storage, root, self.worker, self.loops)
        self.status.prefix = self.attributes.get(STATUS_KEY) or None
        self.previous = self.status.previous()
        self.job = Job(root, self.status, self.loops)
        self.job.on_progress = self._progress
        self.updater = Updater(self.installer, self.loops)
        self.wake = threading.Event()
        self.terminated = threading.Event()
        self.reexec = threading.Event()  # SIGHUP or new agent code: hand over to it
        self.agent_file = handover.running_file()
        self.version = handover.file_version(self.agent_file)
        # This agent's own bytes: put back when a new agent is refused (handover.py).
        self.own_bytes = self.agent_file.read_bytes() if self.agent_file else b""
        self._refused = ""  # the last new agent this one refused
        self.handed = dict(handed or {})
        self._agent_code_stop = threading.Event()
        self.workers = "all"
        self.releases: ReleaseWatcher | None = None
        self.notices: NoticeWatcher | None = None
        self.maintenance: MaintenanceWatcher | None = None
        self._checkpointed_windows: set[str] = set()  # window starts already saved before
        self.goodput = Goodput("")
        self._since = time.monotonic()  # start of the span not yet accounted
        self.runtime_metrics = RuntimeMetrics()  # duty cycle and HBM, where tpu-info runs
        self._launched = time.monotonic()  # when the job now running started
        self._candidate: Desired | None = None  # a release being installed as an update
        self._running_package = ""  # the package of the job started last
        self._stop_sent = False  # the agent sent the running job SIGTERM
        self._shown_health: dict[str, object] = {}
        self._following: Desired | None = None  # the release whose job runs
        # Run-time limits and stop requests (node_agent/limits.py), seam S4.
        self.limits = StopConditions(Limits.from_attributes(self.attributes))
        self.node_started = node_started(root, time.time())
        self._stop_request = self.attributes.get(STOP_REQUEST_KEY, "")

    def terminate(self, *_: object) -> None:
        self.terminated.set()
        self.wake.set()

    def hang_up(self, *_: object) -> None:
        """SIGHUP (the unit's ExecReload=): hand over to the agent.pyz on disk."""
        self.reexec.set()
        self.wake.set()

    def run(self) -> int:
        """Run the node's current release. As a service, an outcome is followed by
        watching for a new release (or, after a notice, for the notice to clear); the
        agent itself exits only when stopped, so systemd restarts only a crashed agent."""
        self.notices = NoticeWatcher(self.metadata, self.wake, self.loops)
        self.maintenance = MaintenanceWatcher(self.metadata, self.wake,
                                              lambda window: self.status.set(maintenance=window),
                                              self.loops)
        self._watch_agent_code()
        self._watch_stop_request()
        self.loops.beat()  # from now on the main thread's liveness counts
        supervise.sd_notify("READY=1")
        self._shown_health = self._agent_view()
        self.status.set(agent=self._shown_health)
        try:
            prefix, self.workers = node_settings(self.attributes)
        except AgentError as error:
            self.status.set(state=JobState.FAILED, message=str(error))
            self.maintenance.stop()
            self.status.close()
            return EXIT_FAILED
        self.releases = ReleaseWatcher(self.storage, prefix, self.wake, self.status.note,
                                       self.loops)
        try:
            self._take_orphan_output()
            desired = self._adopt() or self._first_release()
            code = EXIT_PREEMPTED
            while desired is not None:
                code = self._run_once(desired)
                if self.terminated.is_set() and self._serves_worker_0(desired):
                    self._hold_for_worker_0(desired)
                if not self.stay or self.terminated.is_set():
                    return code
                if self._notice():
                    self.status.note("waiting for the notice to clear")
                    if not self._wait_until(lambda: self._notice() is None):
                        return code
                    desired = self._new_release(desired) or desired
                    continue
                self.status.note("waiting for a new release")
                if (new := self._wait_for_release(desired)) is None and \
                        self._serves_worker_0(desired):
                    self._hold_for_worker_0(desired)
                desired = new
            return code
        finally:
            self.releases.stop()
            self.notices.stop()
            self.maintenance.stop()
            self.updater.stop()
            self._agent_code_stop.set()
            self.status.close()
            self.loops.stop()

    def _notice(self) -> str | None:
        return self.notices.reason() if self.notices else None

    def _wait_until(self, done: Callable[[], bool]) -> bool:
        """Wake-ups until `done()`; False on SIGTERM."""
        while not self.terminated.is_set():
            if done():
                return True
            self._sleep(None)
        return False

    def _sleep(self, seconds: float | None) -> None:
        """Until a wake-up (or `seconds`); the one place the main loop waits, so a
        requested hand-over to a new agent happens at any of them."""
        self.loops.beat()
        self.wake.wait(MAIN_WAIT_SECONDS if seconds is None else min(seconds, MAIN_WAIT_SECONDS))
        self.wake.clear()
        self.loops.beat()
        if self.reexec.is_set() and not self.terminated.is_set():
            self._hand_over()
        if (view := self._agent_view()) != self._shown_health:
            self._shown_health = view
            self.status.set(agent=view)

    # -- run-time limits and stop requests (node_agent/limits.py) -----------------------

    def _watch_stop_request(self) -> None:
        """Long-poll every attribute (a key not set yet has no value to wait on; the
        metadata server's wait_for_change works on a directory with recursive=true,
        cloud.google.com/compute/docs/metadata/querying-metadata#waitforchange)."""
        def changed(value: str) -> None:
            try:
                attributes = json.loads(value)
            except ValueError:
                return
            if isinstance(attributes, dict):
                self._stop_request = str(attributes.get(STOP_REQUEST_KEY) or "")
                self.wake.set()

        poll = LongPoll(self.metadata, "instance/attributes/", self._agent_code_stop, changed,
                        params={"recursive": "true"})
        self.loops.start("watch stop request", poll.step, self._agent_code_stop)

    def _conditions_due(self) -> str | None:
        """The node's stop request or limit that holds now (the agent's stop_requested)."""
        now, running = time.time(), self.job.alive()
        last = None
        if running:  # the phase clock is monotonic: the same moment on the wall clock
            last = now - (time.monotonic() - self.job.clock.last_progress)
        view = NodeView(self.node_started, running, last, (), self._stop_request)
        if self.limits.wants_duty_cycle(now, view):
            duty = self.runtime_metrics.latest().get("dutyCyclePercent")
            view = NodeView(self.node_started, running, last, (duty,), self._stop_request)
        return self.limits.due(now, view)

    # -- the agent replacing itself (node_agent/handover.py) ----------------------------

    def _agent_view(self) -> dict[str, object]:
        """The status's `agent`: the version running, and whether any loop faulted."""
        refused = {"refused": self._refused} if self._refused else {}
        return {"version": self.version} | self.loops.health() | refused

    def _watch_agent_code(self) -> None:
        """Long-poll the startup script: when it changes to carry an agent that is not
        this one, write it over this agent's file and hand over to it. Its value at
        start is left to the bootstrap, which runs it (it reloads an agent systemd
        started from the disk before the script wrote the new one)."""
        if self.agent_file is None:
            return  # not run from a zipapp (tests, `python -m node_agent`)

        first = [True]
        took_over_from = str(self.handed.get("from") or "")

        def changed(script: str) -> None:
            # The first value counts too: the script may have changed between the boot
            # and this poll. Only the agent this one just took over from is left alone
            # there: the bootstrap (or a reload) chose this one over it.
            data = handover.zipapp_in_script(script)
            was_first, first[0] = first[0], False
            if data is None or (new := handover.version_of(data)) == self.version or \
                    new in handover.refused(self.root) or (was_first and new == took_over_from):
                return
            assert self.agent_file is not None
            if handover.file_version(self.agent_file) != new:
                handover.install_agent(self.agent_file, data, self.own_bytes)
            self.status.note(f"the startup script carries agent {new}"
                             f" (this is {self.version}): handing over to it")
            self.hang_up()

        poll = LongPoll(self.metadata, handover.AGENT_CODE_PATH, self._agent_code_stop,
                        changed, retry_cap=MAINTENANCE_RETRY_CAP_SECONDS)
        self.loops.start("watch agent code", poll.step, self._agent_code_stop,
                         long_poll_bound(MAINTENANCE_RETRY_CAP_SECONDS))

    def _hand_over(self) -> None:
        """Hand the running job to the agent.pyz on disk when it is another version, as a
        transaction (node_agent/handover.py): the new agent proves it starts first, a
        stop signal is never lost on the way, a refused agent is never tried again.
        Returns when there is nothing to do, the new agent was refused, a stop came
        first, or the exec failed: this agent then goes on with the job."""
        self.reexec.clear()
        new = handover.file_version(self.agent_file)
        if self.agent_file is None or new in (self.version, "unknown") or \
                self.terminated.is_set():
            return
        if new in handover.refused(self.root):
            self._refuse(new, "refused before")
            return
        job_pid = self.job.process.pid if self.job.alive() and self.job.process else None
        self.status.note(f"agent {self.version} hands over to agent {new}"
                         + (f" (job pid {job_pid} keeps running)" if job_pid else ""))
        self.status.flush(HANDOVER_FLUSH_SECONDS)  # bounded: uploads go on behind
        if (problem := handover.check(self.agent_file, self._handover_state({}),
                                      self.root)) is not None:
            self._refuse(new, problem)
            return
        handover.block_signals()  # from here a stop stays pending for the new agent
        if self.terminated.is_set():  # taken in before the block: hand it over too
            self.status.note("a stop came during the hand-over: the new agent stops the job")
        job = self.job.handover() if job_pid else None
        try:
            handover.save(self.root, self._handover_state(job))
        except OSError as error:
            self.status.note(f"hand-over state not written ({error}); agent {self.version} "
                             "keeps the job")
        else:
            handover.exec_agent(self.agent_file)
            (self.root / handover.HANDOVER_FILE).unlink(missing_ok=True)  # the exec failed
        handover.unblock_signals()
        self.job.resume_reading()

    def _handover_state(self, job: dict[str, object] | None) -> dict[str, object]:
        """What the new agent needs: the job (when one runs), its release, goodput, and a
        stop this agent had taken in (`stopPending`)."""
        state: dict[str, object] = {"from": self.version, "worker": self.worker,
                                    "stopPending": self.terminated.is_set()}
        desired = self._following
        if job is not None and desired is not None:
            state |= {"job": job, "release": vars(desired.release),
                      "workers": desired.workers, "goodput": self.goodput.totals,
                      "goodputJob": self.goodput.job,
                      "launchedAgo": time.monotonic() - self._launched,
                      "stopSent": self._stop_sent, "windows": sorted(self._checkpointed_windows)}
        return state

    def _refuse(self, version: str, why: str) -> None:
        """A new agent that failed its check: this agent's bytes back on the file (a
        restart runs this one), the version never tried again, the job kept."""
        assert self.agent_file is not None
        handover.refuse(self.root, version)
        try:
            write_atomically(self.agent_file, self.own_bytes)
        except OSError as error:
            log(f"restoring {self.agent_file}: {error}")
        self.status.note(f"agent {version} refused ({why}); agent {self.version} keeps "
                         "running the job")
        self._refused = version
        self._shown_health = self._agent_view()
        self.status.set(agent=self._shown_health)

    # -- the job's life (node_agent/lifecycle.py): observers say what happened in the state
    # the agent waits in, HANDLERS perform the actions of the row taken ------------------

    # -- the actions ------------------------------------------------------------------

    # -- goodput ---------------------------------------------------------------------

    def _progress(self, run: JobRun, what: str) -> None:
        """From the job's output (the reader thread): steps, goodput so far, saves."""
        if what == "save":
            self.status.set(step=run.step, lastSave=run.last_save,
                            goodput=self.goodput.view(run.reported))
        elif what == "interval":
            self.status.set(checkpointInterval=run.checkpoint_interval)
        elif what == "perf" and run.perf is not None:
            self.status.progress(step=run.step,
                                 perf={**run.perf, **self.runtime_metrics.latest()})
        else:
            self.status.progress(step=run.step, goodput=self.goodput.view(run.reported))


def hold_lock(root: Path) -> IO[str] | None:
    """One agent per node: an exclusive lock held for the agent's lifetime."""
    lock = (root / "agent.lock").open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    return lock


def main(argv: list[str] | None = None) -> int:
    # No argparse: importing it is a noticeable part of a reboot's time to launch.
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["check"] and len(args) == 2:
        return handover.run_check(args[1])  # a new agent proving it starts (handover.py)
    if args[:1] != ["run"] or any(arg != "--stay" for arg in args[1:]):
        print(__doc__, file=sys.stderr)
        return 2
    # The stop signals first (a SIGTERM before this would kill the agent and leave
    # the job to systemd's SIGKILL); one that came during a hand-over is pending until
    # the unblock below (node_agent/handover.py), and so is a reload.
    stopping, reload = threading.Event(), threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    signal.signal(signal.SIGHUP, lambda *_: reload.set())
    handover.unblock_signals()
    root = Path(os.environ.get("TPU_STACK_ROOT") or DEFAULT_ROOT)
    root.mkdir(parents=True, exist_ok=True)
    lock = hold_lock(root)
    if lock is None:
        log(f"another agent already supervises {root}; leaving it alone")
        return EXIT_OK
    handed = handover.take(root)
    if handed is None:
        stop_stale_job(root)
    elif unknown := handover.unknown_fields(handed):
        handover.fall_back(root, handed, f"hand-over fields it does not know: {unknown}")
    agent = start_agent(root, "--stay" in args, handed, stopping)
    if agent is None:
        if handed and isinstance(handed.get("job"), dict):
            handover.fall_back(root, handed, "it could not start")
            stop_handed_job(root, handed["job"])  # type: ignore[arg-type]
        return EXIT_FAILED if not stopping.is_set() else EXIT_PREEMPTED
    signal.signal(signal.SIGTERM, agent.terminate)
    signal.signal(signal.SIGINT, agent.terminate)
    signal.signal(signal.SIGHUP, agent.hang_up)
    if stopping.is_set() or (handed or {}).get("stopPending"):
        agent.terminate()
    if reload.is_set():
        agent.hang_up()
    handover.mark_capable(root)
    return agent.run()


def start_agent(root: Path, stay: bool, handed: Mapping[str, object] | None,
                stopping: threading.Event) -> Agent | None:
    """The agent, once the metadata server answers (a transient failure backs off for
    as long as the node lives); None on a permanent problem or a stop signal. With a
    job handed over it is built even under a stop (the stop must reach the job as a
    save), a few attempts at most."""
    backoff = Backoff(base=1.0, cap=60.0)
    attempts_under_stop = 0
    job_handed = bool(handed and isinstance(handed.get("job"), dict))
    while not stopping.is_set() or (job_handed and attempts_under_stop < STOPPING_ATTEMPTS):
        attempts_under_stop += stopping.is_set()
        try:
            return Agent(root, stay, handed)
        except TransientError as error:
            delay = backoff.next_delay()
            log(f"starting: {error}; trying again in {delay:.0f}s")
            wait_alive(stopping, delay if not job_handed else min(delay, 2.0))
        except AgentError as error:
            log(str(error))
            return None
        except Exception:  # a bug on a rare path: logged, backed off, tried again
            log(f"starting: {traceback.format_exc().rstrip()}")
            if job_handed:
                return None  # the previous agent takes the job (main falls back)
            wait_alive(stopping, backoff.next_delay())
    return None


def wait_alive(stopping: threading.Event, seconds: float) -> None:
    """Wait (until a stop) keeping systemd's watchdog fed: no supervised loop runs yet."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0 and not stopping.is_set():
        if supervise.watchdog_expected():
            supervise.sd_notify("WATCHDOG=1")
        stopping.wait(min(left, 10.0))


def stop_handed_job(root: Path, job: Mapping[str, object]) -> None:
    """No agent could take the job handed over: stop it by pid with a save (SIGTERM,
    exit 75), reading its output into job.log meanwhile (a job blocked on a full pipe
    could not save)."""
    try:
        pid, fd = int(job["pid"]), int(job["fd"])  # type: ignore[call-overload]
    except (KeyError, TypeError, ValueError):
        return
    log_path = root / "status" / "worker-0" / "job.log"

    def drain() -> None:
        handover.block_in_this_thread()
        try:
            with os.fdopen(fd, "rb") as output, log_path.open("ab") as out:
                for line in output:
                    out.write(line)
        except OSError as error:
            log(f"reading the job's output: {error}")

    threading.Thread(target=drain, name="job-output", daemon=True).start()
    log(f"stopping job pid {pid} with a save: no agent could take it over")
    terminate(pid, job.get("started") if isinstance(job.get("started"), str) else None)
