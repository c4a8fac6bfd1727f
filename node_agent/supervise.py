"""Threads that never die: every loop of the agent runs here."""

# A loop is a body called again and again in a thread of its own until the agent stops
# it (or the body says it is done, returning False). An exception from the body is
# logged with its traceback, counted and followed by a pause, and the body runs again:
# one bad answer from a server, or a bug on a rare path, must not end the loop that
# notices a preemption or reads the job's output. A watchdog thread checks every loop
# each few seconds and starts a new thread for one whose thread ended without being
# done or stopped (a BaseException, or an interpreter fault in a C call), counting it.
#
# Liveness (issue 39): a loop whose body call has run longer than its `bound` (each loop's
# own worst case: a long-poll's timeout and backoff, an install's download and pip) is
# stuck, and so is the main thread when it has not beaten (`beat("main")`) for
# MAIN_BOUND_SECONDS. A thread cannot be killed, so the watchdog says so in the status
# (`agent.stuck`) and stops its keep-alive to systemd: under the unit's `WatchdogSec=` the
# agent sends `WATCHDOG=1` to $NOTIFY_SOCKET (sd_notify(3), with the standard library's
# socket) every WATCHDOG_SECONDS while nothing is stuck, so a stuck loop, a stuck main
# thread or a dead watchdog gets the agent restarted by systemd (systemd.service(5),
# WatchdogSec=: "If the time between two such calls is larger than the configured time,
# then the service is placed in a failed state"; with Restart=on-failure it is restarted).
#
# `Loops.health()` is what the status shows (`agent.threadFaults`,
# `agent.threadRestarts`, `agent.stuck`): the counts stay 0 when nothing went wrong, which
# the chaos test checks after a boot under faults.

from __future__ import annotations

import os
import socket
import threading
import time
import traceback
from collections.abc import Callable

from node_agent.common import log
from node_agent.handover import block_in_this_thread

WATCHDOG_SECONDS = 2.0
FAULT_PAUSE_SECONDS = 1.0  # after an unexpected exception, before the body runs again
DEFAULT_BOUND_SECONDS = 300.0  # a loop body's call longer than this is stuck ...
# ... and the main thread, which beats at least every FOLLOW_SECONDS while it follows a
# job and every MAIN_WAIT_SECONDS while it waits; its longest legitimate call is a stop
# (the stop deadline, at most deadlines.STOP_CEILING_SECONDS) or a new agent's check.
MAIN_BOUND_SECONDS = 600.0


def sd_notify(state: str) -> bool:
    """Send `state` (e.g. "READY=1", "WATCHDOG=1") to systemd's notification socket
    (sd_notify(3): a datagram to the AF_UNIX socket in $NOTIFY_SOCKET, an abstract one
    when it starts with "@"); False when there is none (not under systemd)."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address or address[0] not in "/@":
        return False
    target = "\0" + address[1:] if address[0] == "@" else address
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(target)
            sock.sendall(state.encode())
    except OSError as error:
        log(f"sd_notify {state}: {error}")
        return False
    return True


def watchdog_expected() -> bool:
    """systemd asks this process for keep-alives (sd_watchdog_enabled(3): WATCHDOG_USEC
    set, WATCHDOG_PID unset or this pid; exec keeps the pid, so a new agent still is)."""
    pid = os.environ.get("WATCHDOG_PID", "")
    return bool(os.environ.get("WATCHDOG_USEC")) and pid in ("", str(os.getpid()))


class Loop:
    """One supervised loop: `body()` until `stopped` is set or it returns False."""

    def __init__(self, name: str, body: Callable[[], bool | None], stopped: threading.Event,
                 on_fault: Callable[[str, BaseException], None],
                 bound: float = DEFAULT_BOUND_SECONDS):
        self.name = name
        self.body = body
        self.bound = bound
        self.busy_since: float | None = None  # when the body call under way began
        self.stopped = stopped
        self.done = threading.Event()
        self.on_fault = on_fault
        self.thread = self._start()

    def _start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        block_in_this_thread()  # stop signals go to the main thread only (handover.py)
        while not self.stopped.is_set():
            self.busy_since = time.monotonic()
            try:
                if self.body() is False:
                    break
            except Exception as error:  # the point: no loop dies
                self.on_fault(self.name, error)
                self.stopped.wait(FAULT_PAUSE_SECONDS)
            finally:
                self.busy_since = None
        self.done.set()

    def stuck(self, now: float) -> bool:
        since = self.busy_since
        return since is not None and now - since > self.bound and self.thread.is_alive()

    def ended_abnormally(self) -> bool:
        return not self.thread.is_alive() and not self.done.is_set() \
            and not self.stopped.is_set()

    def restart(self) -> None:
        self.thread = self._start()


class Loops:
    """Every supervised loop of one agent, and the watchdog that restarts them."""

    def __init__(self) -> None:
        self.faults = 0
        self.restarts = 0
        self.last_fault = ""
        self._loops: list[Loop] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self.main_beat: float | None = None  # the main thread's last beat (None: not yet)
        self.watchdog_beat = time.monotonic()
        # From the first moment (a new agent's start after a hand-over included).
        self.keep_alive: Callable[[], object] = (lambda: sd_notify("WATCHDOG=1")) \
            if watchdog_expected() else (lambda: None)
        threading.Thread(target=self._watch, name="watchdog", daemon=True).start()

    def start(self, name: str, body: Callable[[], bool | None],
              stopped: threading.Event, bound: float = DEFAULT_BOUND_SECONDS) -> Loop:
        """Run `body` supervised until `stopped` (or it returns False); a body call
        longer than `bound` seconds is stuck."""
        loop = Loop(name, body, stopped, self.fault, bound)
        with self._lock:
            self._loops = [kept for kept in self._loops if not kept.done.is_set()] + [loop]
        return loop

    def stop(self) -> None:
        self._stopped.set()

    def beat(self) -> None:
        """The main thread is alive (it calls this wherever it waits)."""
        self.main_beat = time.monotonic()

    def stuck(self, now: float | None = None) -> list[str]:
        """The loops (and `main`) past their bound, and `watchdog` when it stopped."""
        now = time.monotonic() if now is None else now
        with self._lock:
            names = [loop.name for loop in self._loops if loop.stuck(now)]
        if self.main_beat is not None and now - self.main_beat > MAIN_BOUND_SECONDS:
            names.append("main")
        if now - self.watchdog_beat > 5 * WATCHDOG_SECONDS + FAULT_PAUSE_SECONDS:
            names.append("watchdog")
        return names

    def health(self) -> dict[str, object]:
        stuck = self.stuck()
        with self._lock:
            return {"threadFaults": self.faults, "threadRestarts": self.restarts,
                    **({"lastFault": self.last_fault} if self.last_fault else {}),
                    **({"stuck": stuck} if stuck else {})}

    def fault(self, name: str, error: BaseException) -> None:
        """Count and log an exception a loop (or the main thread) caught."""
        with self._lock:
            self.faults += 1
            self.last_fault = f"{name}: {type(error).__name__}: {error}"[:300]
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        log(f"loop {name} raised (it runs again): {text.rstrip()}")

    def check(self) -> list[str]:
        """Restart every loop whose thread ended abnormally; their names."""
        with self._lock:
            dead = [loop for loop in self._loops if loop.ended_abnormally()]
            self.restarts += len(dead)
        for loop in dead:
            log(f"thread {loop.name} ended unexpectedly; the watchdog starts it again")
            loop.restart()
        return [loop.name for loop in dead]

    def _watch(self) -> None:
        block_in_this_thread()
        while not self._stopped.wait(WATCHDOG_SECONDS):
            self.watchdog_beat = time.monotonic()
            try:
                self.check()
                if not (stuck := self.stuck()):
                    self.keep_alive()
                else:
                    log(f"stuck: {', '.join(stuck)}; no keep-alive to systemd")
            except Exception as error:  # the watchdog must outlive everything
                log(f"watchdog: {type(error).__name__}: {error}")
