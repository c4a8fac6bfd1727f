"""The job's life on the node, run: what happens in each state, and each action done."""

# `Observers` says what happened next in each state the agent waits in (one method per
# state, `on_<state>`); `Actions` performs the actions of the row taken
# (node_agent/lifecycle.py), one method per action, named after it: HANDLERS is that
# table, and a test holds every action to a handler and every handler to an action.
# Both are mixed into agent.Agent, whose state (status, job, installer, watchers) they use.
# Nothing here decides what comes next: lifecycle.TABLE does.

import glob
import json
import os
import signal
import time
from pathlib import Path

from node_agent import devices
from node_agent.common import AgentError, Backoff, TransientError, log, parse_utc, utc_now
from node_agent.contract import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_STOP_SAVE_FAILED,
    EXIT_TRANSIENT,
    NETWORK_ENDPOINTS_KEY,
    RUNTIME_KEY,
    UNFINISHED_STATES,
    JobState,
)
from node_agent.deadlines import hang_message, named_worker
from node_agent.desired import Desired, Release
from node_agent.environment import grpc_tpu_name, job_environment, read_environment_file
from node_agent.goodput import Goodput, settle_run
from node_agent.job import orphan_output, process_start_time, terminate
from node_agent.job_lines import JobRun
from node_agent.lifecycle import Action, Event, Happened, Life, State, exit_event, step
from node_agent.metadata import node_id
from node_agent.watchers import release_poll_seconds

DATA_POLL_CAP_SECONDS = 15.0  # a listing every 15 s costs nothing; data starts soon
# Save this long before a maintenance window starts: the longest notice (120 s on a
# standard VM, docs/tpu-facts.md) plus room for the save and the job's teardown.
MAINTENANCE_LEAD_SECONDS = 300.0
# A pod worker other than 0 waits for worker 0's save at most the notice (the job's
# `noticeSeconds`, contract C3; else a spot VM's 30 s) less this margin for its own exit.
DEFAULT_NOTICE_SECONDS = 30.0
NOTICE_MARGIN_SECONDS = 5.0
WORKER_0_POLL_SECONDS = 1.0
FOLLOW_SECONDS = 1.0  # the main loop looks at the job, notices and updates this often
# The agent's line for the action `note` (lifecycle.TABLE): when a running job's event
# stops it, by the event; else by the state the event left.
NOTES = {
    "SIGTERM": "SIGTERM: stopping the job so it checkpoints",
    "NOTICE": "{detail}: stopping the job so it saves inside the notice",
    "STOP_REQUESTED": "stop requested ({detail}): stopping the job so it checkpoints",
    "MAINTENANCE": "maintenance window from {detail}: stopping the job so it saves first",
    "stopping-maintenance": "saved step {run.saved_step} before the maintenance window "
                            "(exit code {detail}); starting the job again",
    "stopping-update": "job stopped for the update (exit code {detail})",
    "stopped": "stop request withdrawn: starting the job again",
    "waiting-for-data": "data found for {pattern}; starting the job",
}


def maintenance_lead_seconds() -> float:
    return float(os.environ.get("TPU_STACK_MAINTENANCE_LEAD_SECONDS")
                 or MAINTENANCE_LEAD_SECONDS)


class Observers:
    """What happened next in each state the agent waits in (agent.Agent's), and before
    any: the release to run, a job an earlier agent handed over."""

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
        """Run `desired` to an exit code; an update runs its release next."""
        while not isinstance(outcome := self._live(desired), int):
            desired = outcome
        return outcome

    def _live(self, desired: Desired) -> int | Desired:
        """Step `desired`'s life from `release` to an end. A supervised loop: anything
        unexpected is logged with its traceback and backed off like a transient failure
        (a job still running is followed again, never started twice); the agent exiting
        would let systemd SIGKILL the job without a save."""
        self._desired, self.life, self._retry, self._fault = desired, Life(), Backoff(), Backoff()
        self._data_poll, self._pattern = Backoff(cap=DATA_POLL_CAP_SECONDS), ""
        happened: Happened | None = None
        while True:
            try:
                if happened is None:
                    happened = OBSERVERS[self.life.state](self, desired)
                self._from, (self.life, actions) = self.life.state, step(self.life, happened)
                outcome = None
                for action in actions:
                    if (outcome := HANDLERS[action](self, happened)) is not None:
                        break
            except AgentError as error:
                self.status.set(state=JobState.FAILED, message=str(error))
                return EXIT_FAILED
            except Exception as error:  # TransientError: the metadata server, a moment
                why = str(error)
                if not isinstance(error, TransientError):
                    self.loops.fault("main", error)
                    why = f"agent error {type(error).__name__}: {error}"
                outcome = Happened(Event.AGENT_ERROR, detail=why)
            if isinstance(outcome, (int, Desired)):
                return outcome
            happened = outcome

    def _interrupt(self, desired: Desired, update: bool = True) -> Happened | None:
        """What every waiting state answers: SIGTERM, a notice, a new release installed."""
        if self.terminated.is_set():
            return Happened(Event.SIGTERM)
        if reason := self._notice():
            return Happened(Event.NOTICE, detail=reason)
        if update and (new := self._update(desired)) is not None:
            return Happened(Event.RELEASE, detail=new)
        return None

    def _wait(self, desired: Desired, seconds: float) -> Happened | None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self._sleep(left)
            if happened := self._interrupt(desired):
                return happened
        return None

    def on_release(self, desired: Desired) -> Happened:
        if desired.workers == "0" and self.worker != 0:
            return Happened(Event.WORKER_IDLE)
        done = self.root / "done" / desired.run_key
        return Happened(Event.DONE_EARLIER, detail=done) if done.exists() else \
            Happened(Event.BEGIN)

    def on_starting(self, desired: Desired) -> Happened:
        if self.job.alive():  # adopted from an earlier agent, followed on
            return Happened(Event.ADOPTED)
        if happened := self._interrupt(desired):
            return happened
        if (reason := self.stop_requested()) is not None:  # held before it starts
            return Happened(Event.STOP_REQUESTED, detail=reason)
        return Happened(Event.GO)

    def on_installing(self, desired: Desired) -> Happened:
        """The package (installed in the background, updates.Updater), then the data,
        then the TPU. No data yet: wait rather than start TensorFlow (and the TPU) only
        to hear exit 66; the job still checks every pattern itself. Once the job found
        the TPU taken, it starts again only when nothing holds it."""
        while (result := self.updater.result(desired)) is None:
            if happened := self._interrupt(desired, update=False):
                return happened
            if not self.updater.busy(desired):
                self.updater.offer(desired)
            self._sleep(FOLLOW_SECONDS)
        if isinstance(result, TransientError):
            return Happened(Event.INSTALL_TRANSIENT, detail=str(result))
        if isinstance(result, Exception):
            raise result
        train_data = str(json.loads(desired.job_json).get("trainData") or "")
        if train_data and not self._data_present(train_data):
            return Happened(Event.NO_DATA, detail=train_data)
        if self.life.tpu_busy and (held := self._tpu_held(desired)):
            return Happened(Event.TPU_HELD, detail=held)
        return Happened(Event.INSTALLED, detail=result)

    def on_waiting_for_data(self, desired: Desired) -> Happened:
        """Poll the listing with backoff until a file matches the pattern."""
        try:
            while not (happened := self._wait(desired, self._data_poll.next_delay())):
                if self._data_present(self._pattern):
                    return Happened(Event.DATA_FOUND)
            return happened
        finally:
            self._account("waiting_for_data")

    def on_retrying(self, desired: Desired) -> Happened:
        return self._wait(desired, self._until - time.monotonic()) or Happened(Event.WAITED)

    def on_stopped(self, desired: Desired) -> Happened:
        """Run once (no `stay`): the agent exits. As a service: held until the request
        no longer holds, or SIGTERM, a notice or an update."""
        if not self.stay:
            return Happened(Event.ONE_PASS)
        while self.stop_requested() is not None:
            self._sleep(FOLLOW_SECONDS)
            if happened := self._interrupt(desired):
                return happened
        return Happened(Event.STOP_CLEARED)

    def on_restarting(self, desired: Desired) -> Happened:
        return Happened(Event.RESTART)

    def on_running(self, desired: Desired) -> Happened:
        """Follow the running job: once a second the first event that holds (SIGTERM,
        NOTICE, STOP_REQUESTED, HANG, MAINTENANCE, UPDATE), else its exit."""
        self._following = desired
        while self.job.poll() is None:
            self._sleep(FOLLOW_SECONDS)
            if happened := self._interrupt(desired, update=False):
                return happened
            if reason := self.stop_requested():
                return Happened(Event.STOP_REQUESTED, detail=reason)
            if (hang := self.job.overdue()) is not None:
                return Happened(Event.HANG, detail=hang)
            if window := self._maintenance_due():
                return Happened(Event.MAINTENANCE,
                                detail=f"{window['start']} to {window.get('end', '?')}")
            if (update := self._update(desired)) is not None:
                return Happened(Event.UPDATE, detail=update)
        return self._exited(self.job.wait())

    def _exited(self, code: int) -> Happened:
        """The job's exit as an event, its run settled into goodput."""
        run = self.job.run
        self.goodput.merge(settle_run(run, code, time.monotonic() - self._launched))
        self._since = time.monotonic()
        self.status.set(goodput=self.goodput.view())
        vm_stop = self.terminated.is_set() or bool(self._notice())
        event = exit_event(code, stop_sent=vm_stop,
                           stopped_in_start_up=self._stopped_in_start_up(code, run))
        return Happened(event, progressed=run.step > run.start_step, vm_stop=vm_stop,
                        saved_new=(run.saved_step or 0) > run.start_step, detail=code,
                        tpu_busy=code == EXIT_TRANSIENT and run.tpu_busy is not None)

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

    def _stopped_in_start_up(self, code: int, run: JobRun) -> bool:
        """Killed by our SIGTERM before it could install its handler (the interpreter
        still starting): it had not resumed, so it had nothing to save."""
        return code == -signal.SIGTERM and run.step <= run.start_step and \
            not run.reported and self._stop_sent


class Actions:
    """The handler of each action of lifecycle.TABLE, named after it (agent.Agent's)."""

    def publish_idle(self, happened: Happened) -> int:
        self.status.set(state=JobState.IDLE, package=self._desired.package_sha256,
                        message="pod slice: worker 0 runs the TensorFlow client")
        return EXIT_OK

    def publish_done_earlier(self, happened: Happened) -> int:
        self.status.set(state=JobState.SUCCEEDED, package=self._desired.package_sha256,
                        step=happened.detail.read_text().strip() or "0",
                        message="finished earlier; not rerun")
        return EXIT_OK

    def install(self, happened: Happened) -> None:
        if not self.installer.package_dir(self._desired.package_sha256).is_dir():
            self.status.set(state=JobState.INSTALLING, package=self._desired.package_sha256,
                            message="")
        self.updater.offer(self._desired)

    def start_job(self, happened: Happened) -> None:
        desired, package_dir = self._desired, happened.detail
        config = self.root / "jobs" / f"{desired.run_key}.json"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(desired.job_json)
        env = job_environment(os.environ, package_dir, desired.workers,
                              tpu_name=self._pod_tpu_name() if desired.workers == "0" else "",
                              runtime_version=self.attributes.get(RUNTIME_KEY, ""),
                              image_env=read_environment_file(Path("/etc/environment")))
        self.status.note(f"starting job: package {desired.package_sha256}, config {config}")
        self._account("infrastructure_recovery")
        self._stop_sent = False
        self._launched = time.monotonic()
        self.job.start(config, env, cwd=package_dir)
        self.status.set(state=JobState.RUNNING, package=desired.package_sha256,
                        release=desired.release.uri, message="")
        self._prune(desired)

    def publish_not_started(self, happened: Happened) -> None:
        self.status.set(state=JobState.PREEMPTED,
                        message=f"{happened.detail}: not starting the job")

    def wait_for_data(self, happened: Happened) -> None:
        job = json.loads(self._desired.job_json)
        self._pattern = happened.detail if happened.event is Event.NO_DATA else \
            self.job.run.waiting_pattern or str(job.get("trainData") or "")
        self._account("infrastructure_recovery")
        self.status.set(state=JobState.WAITING_FOR_DATA, message=f"no file matches "
                        f"{self._pattern} yet; the job starts when one does")

    def note(self, happened: Happened) -> None:
        key = happened.event.value if self._from is State.RUNNING else self._from.value
        self.status.note(NOTES[key].format(detail=happened.detail, run=self.job.run,
                                           pattern=self._pattern))

    def note_hang(self, happened: Happened) -> None:
        run = self.job.run
        durable = max(run.start_step, run.saved_step or 0)
        self.status.note(f"hung job stopped; starting it again from step {durable}")

    def back_off(self, happened: Happened) -> None:
        """State `retrying` for the next backoff delay."""
        run, why, backoff = self.job.run, happened.detail, self._retry
        if happened.event is Event.AGENT_ERROR:
            backoff = self._fault
        elif self._from is State.HUNG:
            why = f"hung again in phase {run.hang['phase']}"
        elif happened.event.value.startswith("EXIT_"):
            why = self._job_error(happened.detail, run)
            if happened.tpu_busy:
                why = self._tpu_held(self._desired) or why
        delay = backoff.next_delay()
        self._until = time.monotonic() + delay
        self.status.set(state=JobState.RETRYING, message=f"{why}; retrying in {delay:.0f}s "
                                                         f"(attempt {backoff.attempts})")

    def reset_backoff(self, happened: Happened) -> None:
        self._retry.reset()

    def stop_job(self, happened: Happened) -> Happened:
        self._stop_sent = True
        return self._exited(self.job.stop())

    def publish_hang(self, happened: Happened) -> None:
        """State `hung` (phase, seconds since the last progress line) (docs/design.md,
        "Deadlines"). On a pod only worker 0 runs the job, so its hang is the node's; a
        worker its last lines name is named."""
        hang, run = happened.detail, self.job.run
        worker = named_worker(run.recent, self.attributes.get(NETWORK_ENDPOINTS_KEY, "")) \
            if self._desired.workers == "0" else None
        self.status.set(state=JobState.HUNG, phase=hang.phase,
                        hang=hang.view() | {"at": utc_now()},
                        message=hang_message(hang, run.stacks_signal is not None, worker))

    def send_stacks(self, happened: Happened) -> None:
        self.job.send_stacks(happened.detail)

    def remember_done(self, happened: Happened) -> int:
        done = self.root / "done" / self._desired.run_key
        done.parent.mkdir(parents=True, exist_ok=True)
        done.write_text(str(self.status.fields["step"]) + "\n")
        self.status.set(state=JobState.SUCCEEDED, message="job finished")
        return EXIT_OK

    def publish_stop(self, happened: Happened) -> int:
        """The job stopped on a signal (ours or the VM's): `preempted`, not `failed`."""
        code, run, fields = happened.detail, self.job.run, {}
        why = self._notice() or ("SIGTERM" if self.terminated.is_set() else "a stop signal")
        if code == -signal.SIGTERM and self._stopped_in_start_up(code, run):
            code, what = EXIT_PREEMPTED, ("during the job's start-up, before it trained: "
                                          f"resumes from step {run.start_step}")
        elif code == EXIT_PREEMPTED:
            fields["stopSave"] = run.stop_save
            what = "after saving step " + \
                str(run.stop_save["step"] if run.stop_save else run.stopped_at or run.step)
        else:
            code, what = EXIT_STOP_SAVE_FAILED, (
                f"without a stop save ({self._job_error(code, run)}); resumes from step "
                f"{max(run.start_step, run.saved_step or 0)}")
        self.status.set(state=JobState.PREEMPTED, message=f"stopped ({why}) {what}", **fields)
        return code

    def publish_stopped(self, happened: Happened) -> None:
        """State `stopped` (a stop request or a limit, seam S4), naming the stop save when
        the job just made one."""
        run = self.job.run if self._from is State.STOPPING_REQUEST else None
        reason = self.life.stop_reason
        saved = run and run.stop_save and run.stop_save.get("step")
        saved = saved if saved is not None else (run.stopped_at if run else None)
        what = f"stopped ({reason}) after saving step {saved}" if saved is not None else \
            f"stopped ({reason}): the job is not started"
        self.status.set(state=JobState.STOPPED, stopSave=run.stop_save if run else None,
                        message=f"{what}; it starts again when the request is withdrawn")

    def publish_error(self, happened: Happened) -> int:
        why = self._job_error(happened.detail, self.job.run)
        if happened.event is Event.EXIT_CRASH:
            why += f" ({self.life.crashes} times in a row without progress)"
        self.status.set(state=JobState.FAILED, message=why)
        return EXIT_FAILED

    def run_update(self, happened: Happened) -> Desired:
        return self.life.update_to

    def exit_preempted(self, happened: Happened) -> int:
        return EXIT_PREEMPTED

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

    def _pod_tpu_name(self) -> str:
        """grpc:// endpoints of every worker (no TPU API on the node); the node's id
        where the VM does not list them."""
        endpoints = self.attributes.get(NETWORK_ENDPOINTS_KEY, "").strip()
        return grpc_tpu_name(endpoints) if endpoints else node_id(self.attributes, self.metadata)

    def begin_accounting(self, happened: Happened) -> None:
        """Totals for this job: carried on from an earlier agent's status, plus the time
        the node spent down in between when that agent was still working on it."""
        desired = self._desired
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


# Every action to its handler (tests/agent/test_lifecycle.py holds the two to each other).
HANDLERS = {action: getattr(Actions, action.value) for action in Action}
# The observer of each state the agent waits in (the others are left by an action).
OBSERVERS = {state: getattr(Observers, f"on_{state.name.lower()}") for state in State
             if hasattr(Observers, f"on_{state.name.lower()}")}
