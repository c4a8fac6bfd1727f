"""tpu-stack node agent: install the training package from GCS and supervise the job.

Runs on every TPU VM worker at every boot (the bootstrap writes the zipapp and starts
it), with nothing but the image's Python and TensorFlow: standard library only.
Its inputs are the node's metadata (docs/design.md, "What a TPU node carries in
metadata") and the releases under its `tpu-stack-release` prefix; every output goes
to guest attributes and to GCS, so nothing is lost when a spot node disappears.

    python3 agent.pyz run            one pass: install, run the job, exit with its outcome
    python3 agent.pyz run --stay     as a service: after the job ends wait for a new release

Transient failures (TPU not ready or in use, storage 5xx, data not there yet) are
retried with backoff for as long as the node lives; permanent ones (a bad job
config, records that do not fit the model, a package whose sha256 differs) stop
with state `failed` and the job's last error line as the message. A preemption
or host-maintenance notice stops the job at once so it saves inside the notice; an
announced maintenance window gets a checkpoint before it starts.

Environment: GCE_METADATA_HOST, STORAGE_EMULATOR_HOST (google-auth and
google-cloud-storage conventions), TPU_STACK_ROOT (default /opt/tpu-stack).
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from node_agent import devices
from node_agent.common import AgentError, Backoff, TransientError, log, parse_utc, utc_now
from node_agent.contract import (
    EXIT_FAILED,
    EXIT_NO_DATA,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_STOP_SAVE_FAILED,
    EXIT_TRANSIENT,
    NETWORK_ENDPOINTS_KEY,
    PERMANENT_EXITS,
    RUNTIME_KEY,
    STATUS_KEY,
    STOPPED_EXITS,
)
from node_agent.deadlines import Hang, hang_message, named_worker
from node_agent.desired import Desired, node_settings
from node_agent.environment import grpc_tpu_name, job_environment, read_environment_file
from node_agent.goodput import Goodput, settle_run
from node_agent.install import Installer
from node_agent.job import Job, process_start_time, stop_stale_job, terminate
from node_agent.job_lines import JobRun
from node_agent.metadata import DEFAULT_METADATA_HOST, Metadata, node_id, worker_number
from node_agent.runtime_metrics import RuntimeMetrics
from node_agent.status import Status
from node_agent.storage import Storage, storage_endpoint
from node_agent.watchers import (
    MaintenanceWatcher,
    NoticeWatcher,
    ReleaseWatcher,
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


def maintenance_lead_seconds() -> float:
    return float(os.environ.get("TPU_STACK_MAINTENANCE_LEAD_SECONDS")
                 or MAINTENANCE_LEAD_SECONDS)

ACTIVE_STATES = ("installing", "running", "retrying", "waiting-for-data", "preempted", "hung")


class Agent:
    def __init__(self, root: Path, stay: bool):
        self.root = root
        self.stay = stay
        self.started_at = time.time()
        self.metadata = Metadata(os.environ.get("GCE_METADATA_HOST") or DEFAULT_METADATA_HOST)
        self.storage = Storage(self.metadata, storage_endpoint())
        self.installer = Installer(root, self.storage)
        # One request for every attribute: a reboot's time to launch is mostly requests.
        self.attributes = self.metadata.attributes()
        self.worker = worker_number(self.attributes)
        self.status = Status(self.metadata, self.storage, root, self.worker)
        self.status.prefix = self.attributes.get(STATUS_KEY) or None
        self.previous = self.status.previous()
        self.job = Job(root, self.status)
        self.job.on_progress = self._progress
        self.wake = threading.Event()
        self.terminated = threading.Event()
        self.workers = "all"
        self.releases: ReleaseWatcher | None = None
        self.notices: NoticeWatcher | None = None
        self.maintenance: MaintenanceWatcher | None = None
        self._checkpointed_windows: set[str] = set()  # window starts already saved before
        self._maintenance_stop = False  # the job was stopped to save before a window
        self.goodput = Goodput("")
        self._since = time.monotonic()  # start of the span not yet accounted
        self.runtime_metrics = RuntimeMetrics()  # duty cycle and HBM, where tpu-info runs

    def terminate(self, *_: object) -> None:
        self.terminated.set()
        self.wake.set()

    def run(self) -> int:
        """Run the node's current release. As a service, an outcome is followed by
        watching for a new release (or, after a notice, for the notice to clear); the
        agent itself exits only when stopped, so systemd restarts only a crashed agent."""
        self.notices = NoticeWatcher(self.metadata, self.wake)
        self.maintenance = MaintenanceWatcher(self.metadata, self.wake,
                                              lambda window: self.status.set(maintenance=window))
        try:
            prefix, self.workers = node_settings(self.attributes)
        except AgentError as error:
            self.status.set(state="failed", message=str(error))
            self.maintenance.stop()
            self.status.close()
            return EXIT_FAILED
        self.releases = ReleaseWatcher(self.storage, prefix, self.wake, self.status.note)
        try:
            desired = self._first_release()
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
            self.status.close()

    def _notice(self) -> str | None:
        return self.notices.reason() if self.notices else None

    def _wait_until(self, done: Callable[[], bool]) -> bool:
        """Wake-ups until `done()`; False on SIGTERM."""
        while not self.terminated.is_set():
            if done():
                return True
            self.wake.wait()
            self.wake.clear()
        return False

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
                self.status.set(state="retrying", message=f"{shown}; checking every "
                                f"{release_poll_seconds():.0f}s")
            self.wake.wait()
            self.wake.clear()
        return None

    def _wait_for_release(self, desired: Desired) -> Desired | None:
        """A release other than `desired`, or None on SIGTERM."""
        while not self.terminated.is_set():
            self.wake.wait()
            self.wake.clear()
            if (new := self._new_release(desired)) is not None:
                return new
        return None

    def _new_release(self, desired: Desired) -> Desired | None:
        release = self.releases.take() if self.releases else None
        new = None if release is None else Desired(release, desired.workers)
        return None if new == desired else new

    def _run_once(self, desired: Desired | int) -> int:
        """Install and run `desired`, following updates; the exit code."""
        backoff = Backoff()
        try:
            while isinstance(desired, Desired):
                try:
                    desired = self._supervise(desired)
                except TransientError as error:  # e.g. the metadata server, for a moment
                    interrupted = self._pause(backoff, desired, str(error))
                    desired = desired if interrupted is None else interrupted
            return desired
        except AgentError as error:
            self.status.set(state="failed", message=str(error))
            return EXIT_FAILED

    def _supervise(self, desired: Desired) -> int | Desired:
        """Run `desired` to its outcome (an exit code) or to an update (the new Desired):
        transient failures back off and run it again, for as long as the node lives."""
        if desired.workers == "0" and self.worker != 0:
            self.status.set(state="idle", package=desired.package_sha256,
                            message="pod slice: worker 0 runs the TensorFlow client")
            return EXIT_OK
        done = self.root / "done" / desired.run_key
        if done.exists():
            self.status.set(state="succeeded", package=desired.package_sha256,
                            step=done.read_text().strip() or "0",
                            message="finished earlier; not rerun")
            return EXIT_OK
        self._begin_accounting(desired)
        retry, data_poll, crashes, hangs = Backoff(), Backoff(cap=DATA_POLL_CAP_SECONDS), 0, 0
        tpu_busy = False  # the job said another process holds the TPU
        while True:
            if (interrupted := self._interrupted(desired)) is not None:
                return interrupted
            try:
                package_dir = self._install(desired)
            except TransientError as error:
                if (interrupted := self._pause(retry, desired, str(error))) is not None:
                    return interrupted
                continue
            # No data yet: wait here rather than start TensorFlow (and the TPU) only to
            # hear exit 66; the job still checks every pattern itself.
            train_data = str(json.loads(desired.job_json).get("trainData") or "")
            if train_data and not self._data_present(train_data):
                if (interrupted := self._wait_for_data(data_poll, desired, train_data)) \
                        is not None:
                    return interrupted
                continue
            # Once the job found the TPU taken, start it again only when nothing holds it.
            if tpu_busy and (held := self._tpu_held(desired)):
                if (interrupted := self._pause(retry, desired, held)) is not None:
                    return interrupted
                continue
            code, update = self._run_job(desired, package_dir)
            if update is not None:
                return update
            run = self.job.run
            if self._maintenance_stop and not (self.terminated.is_set() or self._notice()):
                self._maintenance_stop = False
                self.status.note(f"saved step {run.saved_step} before the maintenance window "
                                 f"(exit code {code}); starting the job again")
                retry.reset()
                continue
            if run.hang is not None and not (self.terminated.is_set() or self._notice()):
                hangs = self._after_hang(retry, run, hangs)
                if hangs > 1 and (interrupted := self._pause(
                        retry, desired, f"hung again in phase {run.hang['phase']}")) is not None:
                    return interrupted
                continue
            if code == EXIT_OK:
                return self._succeeded(desired)
            if code in STOPPED_EXITS or self.terminated.is_set() or self._notice():
                return self._stopped(code, run)
            if code in PERMANENT_EXITS:
                self.status.set(state="failed", message=self._job_error(code, run))
                return EXIT_FAILED
            if run.step > run.start_step:
                retry.reset()
                crashes = 0
            if code == EXIT_NO_DATA:
                pattern = run.waiting_pattern or train_data
                if (interrupted := self._wait_for_data(data_poll, desired, pattern)) is not None:
                    return interrupted
                continue
            if code != EXIT_TRANSIENT:
                crashes += 1
                if crashes > CRASH_RETRIES:
                    self.status.set(state="failed", message=self._job_error(code, run) +
                                    f" ({crashes} times in a row without progress)")
                    return EXIT_FAILED
            why = self._job_error(code, run)
            if code == EXIT_TRANSIENT and run.tpu_busy is not None:
                tpu_busy = True
                why = self._tpu_held(desired) or why
            if (interrupted := self._pause(retry, desired, why)) is not None:
                return interrupted

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
        if not self.installer.package_dir(desired.package_sha256).is_dir():
            self.status.set(state="installing", package=desired.package_sha256, message="")
        return self.installer.ensure(desired.package_uri, desired.package_sha256)

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

    def _interrupted(self, desired: Desired) -> int | Desired | None:
        """SIGTERM or a notice (nothing to stop: the job is not running), or an update."""
        if self.terminated.is_set() or self._notice():
            if reason := self._notice():
                self.status.set(state="preempted", message=f"{reason}: not starting the job")
            return EXIT_PREEMPTED
        return self._update(desired)

    def _pause(self, backoff: Backoff, desired: Desired, why: str) -> int | Desired | None:
        """State `retrying` for the next backoff delay; what interrupted it, if anything."""
        delay = backoff.next_delay()
        self.status.set(state="retrying", message=f"{why}; retrying in {delay:.0f}s "
                                                  f"(attempt {backoff.attempts})")
        deadline = time.monotonic() + delay
        while (left := deadline - time.monotonic()) > 0:
            self.wake.wait(left)
            self.wake.clear()
            if (interrupted := self._interrupted(desired)) is not None:
                return interrupted
        return None

    def _wait_for_data(self, backoff: Backoff, desired: Desired,
                       pattern: str) -> int | Desired | None:
        """State `waiting-for-data` until a file matches `pattern` (polling the listing
        with backoff); what interrupted it, if anything."""
        self._account("infrastructure_recovery")
        self.status.set(state="waiting-for-data",
                        message=f"no file matches {pattern} yet; the job starts when one does")
        try:
            while True:
                deadline = time.monotonic() + backoff.next_delay()
                while (left := deadline - time.monotonic()) > 0:
                    self.wake.wait(left)
                    self.wake.clear()
                    if (interrupted := self._interrupted(desired)) is not None:
                        return interrupted
                if self._data_present(pattern):
                    self.status.note(f"data found for {pattern}; starting the job")
                    return None
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

    def _run_job(self, desired: Desired, package_dir: Path) -> tuple[int, Desired | None]:
        """Start the job and follow it to its exit code (and the update that stopped it)."""
        config = self.root / "jobs" / f"{desired.run_key}.json"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(desired.job_json)
        env = job_environment(os.environ, package_dir, desired.workers,
                              tpu_name=self._pod_tpu_name() if desired.workers == "0" else "",
                              runtime_version=self.attributes.get(RUNTIME_KEY, ""),
                              image_env=read_environment_file(Path("/etc/environment")))
        self.status.note(f"starting job: package {desired.package_sha256}, config {config}")
        self._account("infrastructure_recovery")
        launched = time.monotonic()
        self.job.start(config, env, cwd=package_dir)
        self.status.set(state="running", package=desired.package_sha256,
                        release=desired.release.uri, message="")
        code, update = self._follow(desired)
        self.goodput.merge(settle_run(self.job.run, code, time.monotonic() - launched))
        self._since = time.monotonic()
        self.status.set(goodput=self.goodput.view())
        return code, update

    def _pod_tpu_name(self) -> str:
        """grpc:// endpoints of every worker (no TPU API on the node); the node's id
        where the VM does not list them."""
        endpoints = self.attributes.get(NETWORK_ENDPOINTS_KEY, "").strip()
        return grpc_tpu_name(endpoints) if endpoints else node_id(self.attributes, self.metadata)

    def _follow(self, desired: Desired) -> tuple[int, Desired | None]:
        while self.job.poll() is None:
            self.wake.wait(1.0)
            self.wake.clear()
            if self.terminated.is_set():
                self.status.note("SIGTERM: stopping the job so it checkpoints")
                return self.job.stop(), None
            if reason := self._notice():
                self.status.note(f"{reason}: stopping the job so it saves inside the notice")
                return self.job.stop(), None
            if (hang := self.job.overdue()) is not None:
                return self._stop_hung(hang, desired), None
            if window := self._maintenance_due():
                self.status.note(f"maintenance window from {window['start']} to "
                                 f"{window.get('end', '?')}: stopping the job so it saves first")
                self._maintenance_stop = True
                return self.job.stop(), None
            update = self._update(desired)
            if update is not None:
                code = self.job.stop()
                self.status.note(f"job stopped for the update (exit code {code})")
                return code, update
        return self.job.wait(), None

    def _stop_hung(self, hang: Hang, desired: Desired) -> int:
        """State `hung` (phase, seconds since the last progress line), the job's stacks
        to job.log, then its stop (docs/design.md, "Deadlines"). On a pod only worker 0
        runs the job, so its hang is the node's; a worker its last lines name is named."""
        run = self.job.run
        worker = named_worker(run.recent, self.attributes.get(NETWORK_ENDPOINTS_KEY, "")) \
            if desired.workers == "0" else None
        self.status.set(state="hung", phase=hang.phase, hang=hang.view() | {"at": utc_now()},
                        message=hang_message(hang, run.stacks_signal is not None, worker))
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
        """A new release, installed while the old job still runs; None if none."""
        new = self._new_release(desired)
        if new is None:
            return None
        try:
            self.status.set(message=f"update: installing release {new.release.uri}")
            self.installer.ensure(new.package_uri, new.package_sha256)
        except TransientError as error:
            self.releases.forget(new.release)
            self.status.set(message=f"update not installed yet, still running the current "
                                    f"job: {error}")
            return None
        except AgentError as error:
            self.status.set(message=f"update refused, still running the current job: {error}")
            return None
        self.status.note("update installed: stopping the job so it checkpoints")
        return new

    def _succeeded(self, desired: Desired) -> int:
        done = self.root / "done" / desired.run_key
        done.parent.mkdir(parents=True, exist_ok=True)
        done.write_text(str(self.status.fields["step"]) + "\n")
        self.status.set(state="succeeded", message="job finished")
        return EXIT_OK

    def _stopped(self, code: int, run: JobRun) -> int:
        """The job stopped on a signal (ours or the VM's): `preempted`, not `failed`."""
        why = self._notice() or ("SIGTERM" if self.terminated.is_set() else "a stop signal")
        if code == EXIT_PREEMPTED:
            saved = run.stop_save["step"] if run.stop_save else run.stopped_at or run.step
            self.status.set(state="preempted", stopSave=run.stop_save,
                            message=f"stopped ({why}) after saving step {saved}")
            return EXIT_PREEMPTED
        durable = max(run.start_step, run.saved_step or 0)
        self.status.set(state="preempted", message=f"stopped ({why}) without a stop save "
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
            if self.previous.get("state") in ACTIVE_STATES:
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
    if args[:1] != ["run"] or any(arg != "--stay" for arg in args[1:]):
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(os.environ.get("TPU_STACK_ROOT") or DEFAULT_ROOT)
    root.mkdir(parents=True, exist_ok=True)
    lock = hold_lock(root)
    if lock is None:
        log(f"another agent already supervises {root}; leaving it alone")
        return EXIT_OK
    stop_stale_job(root)
    try:
        agent = Agent(root, stay="--stay" in args)
    except (AgentError, TransientError) as error:
        log(str(error))
        return EXIT_FAILED
    signal.signal(signal.SIGTERM, agent.terminate)
    signal.signal(signal.SIGINT, agent.terminate)
    return agent.run()
