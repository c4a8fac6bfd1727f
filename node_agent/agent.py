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

import dataclasses
import fcntl
import glob
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

from node_agent import devices, handover, lifecycle, supervise
from node_agent.common import (
    AgentError,
    Backoff,
    TransientError,
    log,
    parse_utc,
    utc_now,
    write_atomically,
)
from node_agent.contract import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_STOP_SAVE_FAILED,
    EXIT_TRANSIENT,
    NETWORK_ENDPOINTS_KEY,
    RUNTIME_KEY,
    STATUS_KEY,
    STOP_REQUEST_KEY,
    UNFINISHED_STATES,
    JobState,
)
from node_agent.deadlines import Hang, hang_message, named_worker
from node_agent.desired import Desired, Release, node_settings
from node_agent.environment import grpc_tpu_name, job_environment, read_environment_file
from node_agent.goodput import Goodput, settle_run
from node_agent.install import Installer
from node_agent.job import Job, orphan_output, process_start_time, stop_stale_job, terminate
from node_agent.job_lines import JobRun
from node_agent.limits import Limits, NodeView, StopConditions, node_started
from node_agent.metadata import DEFAULT_METADATA_HOST, Metadata, node_id, worker_number
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
    release_poll_seconds,
)

DEFAULT_ROOT = "/opt/tpu-stack"
CRASH_RETRIES = 3  # exit 1 or a signal, in a row without progress, before `failed`
DATA_POLL_CAP_SECONDS = 15.0  # a listing every 15 s costs nothing; data starts soon
# A pod worker other than 0 waits for worker 0's save at most the notice (the job's
# `noticeSeconds`, contract C3; else a spot VM's 30 s) less this margin for its own exit.
DEFAULT_NOTICE_SECONDS = 30.0
NOTICE_MARGIN_SECONDS = 5.0
WORKER_0_POLL_SECONDS = 1.0
# Save this long before a maintenance window starts: the longest notice (120 s on a
# standard VM, docs/tpu-facts.md) plus room for the save and the job's teardown.
MAINTENANCE_LEAD_SECONDS = 300.0
FOLLOW_SECONDS = 1.0  # the main loop looks at the job, notices and updates this often
MAIN_WAIT_SECONDS = 30.0  # the main thread beats (supervise.Loops.beat) at least this often
HANDOVER_FLUSH_SECONDS = 5.0  # the status upload before a hand-over waits at most this
STOPPING_ATTEMPTS = 3  # builds of an agent under a stop, with a job handed over


def maintenance_lead_seconds() -> float:
    return float(os.environ.get("TPU_STACK_MAINTENANCE_LEAD_SECONDS")
                 or MAINTENANCE_LEAD_SECONDS)

# The agent's line when a running job's event stops it (lifecycle.TABLE, action `note`).
STOP_NOTES = {
    "SIGTERM": "SIGTERM: stopping the job so it checkpoints",
    "NOTICE": "{detail}: stopping the job so it saves inside the notice",
    "STOP_REQUESTED": "stop requested ({detail}): stopping the job so it checkpoints",
    "MAINTENANCE": "maintenance window from {detail}: stopping the job so it saves first",
}


@dataclasses.dataclass
class Interrupted(Exception):  # noqa: N818 (an outcome, not an error)
    """The job's run under way ends here: the agent stops with `code` (a SIGTERM or a
    notice), or runs `update` next (a new release, installed)."""

    code: int = EXIT_PREEMPTED
    update: Desired | None = None


class Agent:
    def __init__(self, root: Path, stay: bool, handed: Mapping[str, object] | None = None,
                 stop_requested: Callable[[], str | None] = lifecycle.never_requested):
        self.root = root
        # Seam S4: a stop request (a limit, a budget) polled once a second while the job
        # runs and before it starts; the job is stopped with a save and not started again
        # while it holds (node_agent/lifecycle.py).
        self.stop_requested = stop_requested
        if stop_requested is lifecycle.never_requested:  # the node's own conditions
            self.stop_requested = self._conditions_due
        self.life = "running"  # the job's life (lifecycle.TABLE) once it is followed
        self._stop_reason = ""
        self._update_to: Desired | None = None  # the release an update stopped the job for
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

    def _take_orphan_output(self) -> None:
        """What a job said after it lost its agent (seam S2; main stopped it by pid) into
        job.log, and its stop save into the status."""
        lines = orphan_output(self.root)
        if not lines:
            return
        run = JobRun()
        for line in lines:
            self.status.append_job_line(line if line.endswith("\n") else line + "\n")
            run.read(line)
        saved = f"; it saved step {run.stopped_at}" if run.stopped_at is not None else ""
        self.status.note(f"read {len(lines)} lines the job left by an earlier agent wrote "
                         f"after losing it{saved}")
        if run.stop_save is not None:
            self.status.set(stopSave=run.stop_save, lastSave=run.last_save)

    def _adopt(self) -> Desired | None:
        """The release whose job an earlier agent of this process handed over, its job
        adopted; None when there is none (or it is gone)."""
        state, self.handed = self.handed, {}
        job = state.get("job")
        if not isinstance(job, dict) or not self.job.adopt(job):
            return None
        desired = Desired(Release(**state["release"]), str(state["workers"]))  # type: ignore[arg-type]
        self.goodput = Goodput(str(state.get("goodputJob") or desired.run_key),
                               state.get("goodput"))  # type: ignore[arg-type]
        self._launched = time.monotonic() - float(state.get("launchedAgo") or 0)  # type: ignore[arg-type]
        self._stop_sent = bool(state.get("stopSent"))
        self._checkpointed_windows = set(state.get("windows") or [])  # type: ignore[arg-type]
        self._running_package = desired.package_sha256
        self.previous = {}
        assert self.releases is not None
        self.releases.taken(desired.release)
        self.status.set(state=JobState.RUNNING, package=desired.package_sha256,
                        release=desired.release.uri, step=self.job.run.step,
                        message=f"agent {self.version} took over job pid "
                                f"{self.job.process.pid if self.job.process else '?'} from agent "
                                f"{state.get('from')}")
        return desired

    def _serves_worker_0(self, desired: Desired) -> bool:
        return desired.workers == "0" and self.worker != 0

    def _hold_for_worker_0(self, desired: Desired) -> None:
        """A pod worker other than 0, being stopped: stay until worker 0 reports its stop
        save (its state leaves `running`), at most the notice less a margin.

        Worker 0's save runs its checkpoint ops on every worker's TPU server
        (tensorflow/python/eager/remote.py, connect_to_cluster), which the image's
        tpu-runtime.service runs. The unit is ordered After= it, so systemd stops this
        agent first and keeps the runtime up while the agent waits (systemd.unit(5):
        stopping applies the inverse of the start-up order)."""
        notice = json.loads(desired.job_json).get("noticeSeconds") or DEFAULT_NOTICE_SECONDS
        bound = max(0.0, float(notice) - NOTICE_MARGIN_SECONDS)
        self.status.note(f"stopping: keeping this worker's TPU runtime up until worker 0 "
                         f"reports its save (at most {bound:.0f}s)")
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            status = self.status.read_worker(0)
            state = None if status is None else status.get("state")
            if status is not None and state != "running":
                self.status.note(f"worker 0 reports state {state}; letting the runtime go")
                return
            time.sleep(WORKER_0_POLL_SECONDS)
        self.status.note("worker 0 reported no save within the notice; letting the runtime go")

    def _first_release(self) -> Desired | None:
        """The current release, once there is one (None on SIGTERM): until then state
        `retrying`, naming why (none yet, or the listing failed)."""
        shown = ""
        while not self.terminated.is_set():
            if (release := self.releases.take()) is not None:
                return Desired(release, self.workers)
            if self.releases.polls and self.releases.problem != shown:
                shown = self.releases.problem
                self.status.set(state=JobState.RETRYING, message=f"{shown}; checking every "
                                f"{release_poll_seconds():.0f}s")
            self._sleep(None)
        return None

    def _wait_for_release(self, desired: Desired) -> Desired | None:
        """A release other than `desired`, or None on SIGTERM."""
        while not self.terminated.is_set():
            self._sleep(None)
            if (new := self._new_release(desired)) is not None:
                return new
        return None

    def _new_release(self, desired: Desired) -> Desired | None:
        release = self.releases.take() if self.releases else None
        new = None if release is None else Desired(release, desired.workers)
        return None if new == desired else new

    def _run_once(self, desired: Desired) -> int:
        """Install and run `desired`, following updates; the exit code. A supervised
        loop: anything unexpected is logged with its traceback and backed off like a
        transient failure (a job still running is followed again, never started twice);
        the agent exiting would let systemd SIGKILL the job without a save."""
        backoff = Backoff()
        while True:
            try:
                try:
                    return self._supervise(desired)
                except AgentError as error:
                    self.status.set(state=JobState.FAILED, message=str(error))
                    return EXIT_FAILED
                except Interrupted:
                    raise
                except Exception as error:  # TransientError: the metadata server, a moment
                    if not isinstance(error, TransientError):
                        self.loops.fault("main", error)
                    why = str(error) if isinstance(error, TransientError) else \
                        f"agent error {type(error).__name__}: {error}"
                    self._pause(backoff, desired, why)
            except Interrupted as interrupted:
                if interrupted.update is None:
                    return interrupted.code
                desired = interrupted.update

    def _supervise(self, desired: Desired) -> int:
        """Run `desired` to its outcome, an exit code (Interrupted: a stop, or an update
        to run next): transient failures back off and run it again, for as long as the
        node lives."""
        if desired.workers == "0" and self.worker != 0:
            self.status.set(state=JobState.IDLE, package=desired.package_sha256,
                            message="pod slice: worker 0 runs the TensorFlow client")
            return EXIT_OK
        done = self.root / "done" / desired.run_key
        if done.exists():
            self.status.set(state=JobState.SUCCEEDED, package=desired.package_sha256,
                            step=done.read_text().strip() or "0",
                            message="finished earlier; not rerun")
            return EXIT_OK
        self._begin_accounting(desired)
        retry, data_poll, crashes, hangs = Backoff(), Backoff(cap=DATA_POLL_CAP_SECONDS), 0, 0
        tpu_busy = False  # the job said another process holds the TPU
        train_data = str(json.loads(desired.job_json).get("trainData") or "")
        while True:
            package_dir = self.installer.package_dir(desired.package_sha256)
            if not self.job.alive():  # else: adopted from an earlier agent, followed on
                self._check_interrupted(desired)
                if (reason := self.stop_requested()) is not None:  # held before it starts
                    self._stop_reason = reason
                    if not self._hold_stopped(desired, reason):
                        return EXIT_PREEMPTED
                    continue
                try:
                    self._install(desired)
                except TransientError as error:
                    self._pause(retry, desired, str(error))
                    continue
                # No data yet: wait here rather than start TensorFlow (and the TPU) only
                # to hear exit 66; the job still checks every pattern itself.
                if train_data and not self._data_present(train_data):
                    self._wait_for_data(data_poll, desired, train_data)
                    continue
                # Once the job found the TPU taken, start it again only when nothing
                # holds it.
                if tpu_busy and (held := self._tpu_held(desired)):
                    self._pause(retry, desired, held)
                    continue
            code = self._run_job(desired, package_dir)
            run = self.job.run
            if (self.life.startswith("stopping-") or self.life == "hung") and \
                    (self.terminated.is_set() or self._notice()):  # the VM's stop wins
                self.life = "stopping-sigterm"
            event = lifecycle.exit_event(
                code, stop_sent=self.terminated.is_set() or bool(self._notice()),
                stopped_in_start_up=self._stopped_in_start_up(code, run))
            self.life, _ = lifecycle.step(self.life, event)
            if self.life == "updating":
                assert self._update_to is not None
                raise Interrupted(update=self._update_to)
            if self.life == "stopped":
                if not self._hold_stopped(desired, self._stop_reason, run):
                    return EXIT_PREEMPTED
                continue
            if self.life == "restarting" and run.hang is None:
                self.status.note(f"saved step {run.saved_step} before the maintenance window "
                                 f"(exit code {code}); starting the job again")
                retry.reset()
                continue
            if self.life == "restarting":
                hangs = self._after_hang(retry, run, hangs)
                if hangs > 1:
                    self._pause(retry, desired, f"hung again in phase {run.hang['phase']}")
                continue
            if self.life == "succeeded":
                return self._succeeded(desired)
            if self.life == "preempted":
                return self._stopped(code, run)
            if self.life == "failed":
                self.status.set(state=JobState.FAILED, message=self._job_error(code, run))
                return EXIT_FAILED
            if run.step > run.start_step:
                retry.reset()
                crashes = 0
            if self.life == "waiting-for-data":
                self._wait_for_data(data_poll, desired, run.waiting_pattern or train_data)
                continue
            if event == "EXIT_CRASH":
                crashes += 1
                if crashes > CRASH_RETRIES:
                    self.status.set(state=JobState.FAILED, message=self._job_error(code, run) +
                                    f" ({crashes} times in a row without progress)")
                    return EXIT_FAILED
            why = self._job_error(code, run)
            if code == EXIT_TRANSIENT and run.tpu_busy is not None:
                tpu_busy = True
                why = self._tpu_held(desired) or why
            self._pause(retry, desired, why)

    def _hold_stopped(self, desired: Desired, reason: str, run: JobRun | None = None) -> bool:
        """State `stopped` (a stop request or a limit, seam S4), naming the stop save when
        the job just made one. Run once (no `stay`): False, the agent exits. As a service:
        held until the request no longer holds (True: start the job again), Interrupted by
        SIGTERM, a notice or an update."""
        self.life = "stopped"
        saved = run and run.stop_save and run.stop_save.get("step")
        saved = saved if saved is not None else (run.stopped_at if run else None)
        what = f"stopped ({reason}) after saving step {saved}" if saved is not None else \
            f"stopped ({reason}): the job is not started"
        self.status.set(state=JobState.STOPPED, stopSave=run.stop_save if run else None,
                        message=f"{what}; it starts again when the request is withdrawn")
        if not self.stay:
            return False
        while (reason := self.stop_requested()) is not None:
            self._sleep(FOLLOW_SECONDS)
            if self.terminated.is_set() or self._notice():
                self.life, _ = lifecycle.step(self.life, "SIGTERM")
                raise Interrupted()
            if (update := self._update(desired)) is not None:
                raise Interrupted(update=update)
        self.life, _ = lifecycle.step(self.life, "STOP_CLEARED")
        self.status.note("stop request withdrawn: starting the job again")
        return True

    def _after_hang(self, retry: Backoff, run: JobRun, hangs: int) -> int:
        """Hangs in a row without progress, this one counted. A job that saved a new
        checkpoint before it hung starts again from it at once; one that hangs again
        without one backs off (the caller pauses) like a transient failure, for as
        long as the node lives: a hang is never `failed` (a worker may come back)."""
        if (run.saved_step or 0) > run.start_step:
            retry.reset()
            hangs = 0
        durable = max(run.start_step, run.saved_step or 0)
        self.status.note(f"hung job stopped; starting it again from step {durable}")
        return hangs + 1

    def _tpu_held(self, desired: Desired) -> str | None:
        """Who holds this host's TPU, as a status message; None when nothing does.

        A leftover of a job this agent started (its session) is stopped: it is ours and
        stale. Any other holder (a user's session, a foreground run) is only named: it
        may be doing work someone wants, and a kill cannot be undone. With no holder at
        all, a lock file libtpu left behind is removed (TensorFlow's own advice)."""
        if desired.workers == "0":
            return None  # a pod's client uses no local TPU; the image's runtime serves it
        found = devices.holders()
        for holder in [h for h in found if h.session in self.job.sessions]:
            self.status.note(f"stopping {holder.describe()}, left over from our job")
            terminate(holder.pid, process_start_time(holder.pid))
        others = [h for h in found if h.session not in self.job.sessions]
        if others:
            return (f"the TPU is held by {', '.join(h.describe() for h in others)}, not "
                    "started by this agent, so left running: the job starts once it exits")
        if devices.remove_stale_lockfile():
            self.status.note(f"no process holds the TPU: removed the stale "
                             f"{devices.lockfile_path()} (as TensorFlow's message advises)")
        return None

    def _install(self, desired: Desired) -> Path:
        """The installed package (installed in the background, updates.Updater); a
        stop or another release installed first meanwhile is Interrupted, the install's
        failure raised (TransientError: back off; AgentError: failed)."""
        if not self.installer.package_dir(desired.package_sha256).is_dir():
            self.status.set(state=JobState.INSTALLING, package=desired.package_sha256, message="")
        self.updater.offer(desired)
        while (result := self.updater.result(desired)) is None:
            if self.terminated.is_set() or self._notice():
                self._check_interrupted(desired)  # raises
            if not self.updater.busy(desired):
                self.updater.offer(desired)
            self._sleep(FOLLOW_SECONDS)
        if isinstance(result, Exception):
            raise result
        return result

    def _job_error(self, code: int, run: JobRun) -> str:
        what = f"job exited with code {code}" if code >= 0 else f"job killed by signal {-code}"
        said = f"{what}: {run.error}" if run.error else f"{what}; see job.log"
        return said + self._lost_worker(run)

    def _lost_worker(self, run: JobRun) -> str:
        """On a pod, the worker the job's last lines name (docs/design.md, "Deadlines")."""
        if self.workers != "0":
            return ""
        worker = named_worker(run.recent, self.attributes.get(NETWORK_ENDPOINTS_KEY, ""))
        return f" (the job's last lines name {worker}: its TPU runtime may have died)" \
            if worker else ""

    def _check_interrupted(self, desired: Desired) -> None:
        """Interrupted on SIGTERM or a notice (nothing to stop: the job is not running),
        or on an update installed meanwhile."""
        if self.terminated.is_set() or self._notice():
            if reason := self._notice():
                self.status.set(state=JobState.PREEMPTED, message=f"{reason}: not starting the job")
            raise Interrupted()
        if (update := self._update(desired)) is not None:
            raise Interrupted(update=update)

    def _pause(self, backoff: Backoff, desired: Desired, why: str) -> None:
        """State `retrying` for the next backoff delay (Interrupted meanwhile: see
        _check_interrupted)."""
        delay = backoff.next_delay()
        self.status.set(state=JobState.RETRYING, message=f"{why}; retrying in {delay:.0f}s "
                                                  f"(attempt {backoff.attempts})")
        deadline = time.monotonic() + delay
        while (left := deadline - time.monotonic()) > 0:
            self._sleep(left)
            self._check_interrupted(desired)

    def _wait_for_data(self, backoff: Backoff, desired: Desired, pattern: str) -> None:
        """State `waiting-for-data` until a file matches `pattern` (polling the listing
        with backoff; Interrupted meanwhile: see _check_interrupted)."""
        self._account("infrastructure_recovery")
        self.status.set(state=JobState.WAITING_FOR_DATA,
                        message=f"no file matches {pattern} yet; the job starts when one does")
        try:
            while True:
                deadline = time.monotonic() + backoff.next_delay()
                while (left := deadline - time.monotonic()) > 0:
                    self._sleep(left)
                    self._check_interrupted(desired)
                if self._data_present(pattern):
                    self.status.note(f"data found for {pattern}; starting the job")
                    return
        finally:
            self._account("waiting_for_data")

    def _data_present(self, pattern: str) -> bool:
        """A file matches `pattern` (gs://: a bucket listing; else the local disk). When
        the listing fails the job itself is asked again (it is the judge)."""
        if pattern.startswith("gs://"):
            try:
                return self.storage.any_match(pattern, "trainData")
            except (AgentError, TransientError) as error:
                log(f"listing for {pattern}: {error}; asking the job")
                return True
        if "://" in pattern:
            return True
        return bool(glob.glob(pattern))

    def _run_job(self, desired: Desired, package_dir: Path) -> int:
        """Start the job (unless an adopted one runs) and follow it to its exit code."""
        config = self.root / "jobs" / f"{desired.run_key}.json"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(desired.job_json)
        env = job_environment(os.environ, package_dir, desired.workers,
                              tpu_name=self._pod_tpu_name() if desired.workers == "0" else "",
                              runtime_version=self.attributes.get(RUNTIME_KEY, ""),
                              image_env=read_environment_file(Path("/etc/environment")))
        if self.job.alive():
            launched = self._launched
        else:
            self.status.note(f"starting job: package {desired.package_sha256}, config {config}")
            self._account("infrastructure_recovery")
            self._stop_sent = False
            launched = self._launched = time.monotonic()
            self.job.start(config, env, cwd=package_dir)
            self.status.set(state=JobState.RUNNING, package=desired.package_sha256,
                            release=desired.release.uri, message="")
            self._prune(desired)
        code = self._follow(desired)
        self.goodput.merge(settle_run(self.job.run, code, time.monotonic() - launched))
        self._since = time.monotonic()
        self.status.set(goodput=self.goodput.view())
        return code

    def _pod_tpu_name(self) -> str:
        """grpc:// endpoints of every worker (no TPU API on the node); the node's id
        where the VM does not list them."""
        endpoints = self.attributes.get(NETWORK_ENDPOINTS_KEY, "").strip()
        return grpc_tpu_name(endpoints) if endpoints else node_id(self.attributes, self.metadata)

    def _stop_job(self) -> int:
        self._stop_sent = True
        return self.job.stop()

    def _follow(self, desired: Desired) -> int:
        """Follow the running job to its exit: once a second the first event that holds
        (_running_event) moves the job's life on (its actions: the
        stop with a save, or the hang's stacks then the stop); the exit code (an update
        that stopped it is kept in `_update_to`, the life `stopping-update`)."""
        self._following = desired
        self.life = "running"
        while self.job.poll() is None:
            self._sleep(FOLLOW_SECONDS)
            event, detail = self._running_event(desired)
            if event is None:
                continue
            self.life, actions = lifecycle.step(self.life, event)
            if "note" in actions:
                self.status.note(STOP_NOTES[event].format(detail=detail))
            if "send_stacks" in actions:
                assert isinstance(detail, Hang)
                return self._stop_hung(detail, desired)
            code = self._stop_job()
            if event == "UPDATE":
                assert isinstance(detail, Desired)
                self._update_to = detail
                self.status.note(f"job stopped for the update (exit code {code})")
            return code
        return self.job.wait()

    def _running_event(self, desired: Desired) -> tuple[str | None, object]:
        """The first event that holds now, in their order of priority, with its detail."""
        if self.terminated.is_set():
            return "SIGTERM", "SIGTERM"
        if reason := self._notice():
            return "NOTICE", reason
        if reason := self.stop_requested():
            self._stop_reason = reason
            return "STOP_REQUESTED", reason
        if (hang := self.job.overdue()) is not None:
            return "HANG", hang
        if window := self._maintenance_due():
            return "MAINTENANCE", f"{window['start']} to {window.get('end', '?')}"
        if (update := self._update(desired)) is not None:
            return "UPDATE", update
        return None, None

    def _stop_hung(self, hang: Hang, desired: Desired) -> int:
        """State `hung` (phase, seconds since the last progress line), the job's stacks
        to job.log, then its stop (docs/design.md, "Deadlines"). On a pod only worker 0
        runs the job, so its hang is the node's; a worker its last lines name is named."""
        run = self.job.run
        worker = named_worker(run.recent, self.attributes.get(NETWORK_ENDPOINTS_KEY, "")) \
            if desired.workers == "0" else None
        self.status.set(state=JobState.HUNG, phase=hang.phase, hang=hang.view() | {"at": utc_now()},
                        message=hang_message(hang, run.stacks_signal is not None, worker))
        self._stop_sent = True
        return self.job.stop_hung(hang)

    def _maintenance_due(self) -> dict[str, str] | None:
        """The announced window, once it starts within MAINTENANCE_LEAD_SECONDS and the
        job has steps not yet saved; once per window. The job then saves (SIGTERM,
        exit 75) and starts again at once: the checkpoint is fresh when the host goes
        down, and training does not wait out a window that may be hours long."""
        window = self.maintenance.window if self.maintenance else None
        start = parse_utc(window["start"]) if window else None
        if window is None or start is None or window["start"] in self._checkpointed_windows:
            return None
        run = self.job.run
        if time.time() < start - maintenance_lead_seconds() or \
                run.step <= max(run.start_step, run.saved_step or 0):
            return None  # not yet, or nothing unsaved to keep
        self._checkpointed_windows.add(window["start"])
        return window

    def _update(self, desired: Desired) -> Desired | None:
        """A new release once its package is installed (in the background, while the
        current job runs and keeps receiving notices); None until then."""
        if (new := self._new_release(desired)) is not None:
            self._candidate = new
            if not self.installer.package_dir(new.package_sha256).is_dir():
                self.status.set(message=f"update: installing release {new.release.uri} in "
                                        "the background")
            self.updater.offer(new)
        new = self._candidate
        if new is not None and not self.updater.busy(new):
            self.updater.offer(new)  # again, when its folder was pruned since
        if new is None or (result := self.updater.result(new)) is None:
            return None
        self._candidate = None
        if isinstance(result, TransientError):
            assert self.releases is not None
            self.releases.forget(new.release)
            self.status.set(message=f"update not installed yet, still running the current "
                                    f"job: {result}")
            return None
        if isinstance(result, AgentError):
            self.status.set(message=f"update refused, still running the current job: {result}")
            return None
        self.status.note("update installed: stopping the job so it checkpoints")
        return new

    def _prune(self, desired: Desired) -> None:
        """Keep the package now running and the one that ran before it."""
        keep = {desired.package_sha256} | ({self._running_package} - {""})
        self._running_package = desired.package_sha256
        if self._candidate is not None:
            keep.add(self._candidate.package_sha256)
        try:
            removed = self.installer.prune(keep)
        except OSError as error:
            log(f"pruning packages: {error}")
            return
        if removed:
            self.status.note(f"removed installed packages {', '.join(removed)} (kept "
                             f"{', '.join(sorted(keep))})")

    def _succeeded(self, desired: Desired) -> int:
        done = self.root / "done" / desired.run_key
        done.parent.mkdir(parents=True, exist_ok=True)
        done.write_text(str(self.status.fields["step"]) + "\n")
        self.status.set(state=JobState.SUCCEEDED, message="job finished")
        return EXIT_OK

    def _stopped_in_start_up(self, code: int, run: JobRun) -> bool:
        """Killed by our SIGTERM before it could install its handler (the interpreter
        still starting): it had not resumed, so it had nothing to save."""
        return code == -signal.SIGTERM and run.step <= run.start_step and \
            not run.reported and self._stop_sent

    def _stopped(self, code: int, run: JobRun) -> int:
        """The job stopped on a signal (ours or the VM's): `preempted`, not `failed`."""
        why = self._notice() or ("SIGTERM" if self.terminated.is_set() else "a stop signal")
        if code == -signal.SIGTERM and self._stopped_in_start_up(code, run):
            self.status.set(state=JobState.PREEMPTED, message=f"stopped ({why}) during the job's "
                            f"start-up, before it trained: resumes from step {run.start_step}")
            return EXIT_PREEMPTED
        if code == EXIT_PREEMPTED:
            saved = run.stop_save["step"] if run.stop_save else run.stopped_at or run.step
            self.status.set(state=JobState.PREEMPTED, stopSave=run.stop_save,
                            message=f"stopped ({why}) after saving step {saved}")
            return EXIT_PREEMPTED
        durable = max(run.start_step, run.saved_step or 0)
        self.status.set(state=JobState.PREEMPTED, message=f"stopped ({why}) without a stop save "
                        f"({self._job_error(code, run)}); resumes from step {durable}")
        return EXIT_STOP_SAVE_FAILED

    # -- goodput ---------------------------------------------------------------------

    def _begin_accounting(self, desired: Desired) -> None:
        """Totals for this job: carried on from an earlier agent's status, plus the time
        the node spent down in between when that agent was still working on it."""
        if self.goodput.job == desired.run_key:
            return
        self.goodput = Goodput.resume(desired.run_key, self.previous)
        fields: dict[str, object] = {"node": node_id(self.attributes, self.metadata)}
        earlier = self.previous.get("goodput")
        if isinstance(earlier, dict) and earlier.get("job") == desired.run_key:
            fields["lastSave"] = self.previous.get("lastSave")
            if self.previous.get("state") in UNFINISHED_STATES:
                self.goodput.add("infrastructure_recovery",
                                 self.started_at - (parse_utc(str(self.previous.get("updated")))
                                                    or self.started_at))
        self.previous = {}
        self.status.set(goodput=self.goodput.view(), **fields)  # type: ignore[arg-type]

    def _account(self, category: str) -> None:
        now = time.monotonic()
        self.goodput.add(category, now - self._since)
        self._since = now

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
