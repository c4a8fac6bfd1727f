"""Threads that never die: every loop of the agent runs here.

A loop is a body called again and again in a thread of its own until the agent stops
it (or the body says it is done, returning False). An exception from the body is
logged with its traceback, counted and followed by a pause, and the body runs again:
one bad answer from a server, or a bug on a rare path, must not end the loop that
notices a preemption or reads the job's output. A watchdog thread checks every loop
each few seconds and starts a new thread for one whose thread ended without being
done or stopped (a BaseException, or an interpreter fault in a C call), counting it.

`Loops.health()` is what the status shows (`agent.threadFaults`,
`agent.threadRestarts`): both stay 0 when nothing went wrong, which the chaos test
checks after a boot under faults.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable

from node_agent.common import log
from node_agent.handover import block_in_this_thread

WATCHDOG_SECONDS = 2.0
FAULT_PAUSE_SECONDS = 1.0  # after an unexpected exception, before the body runs again


class Loop:
    """One supervised loop: `body()` until `stopped` is set or it returns False."""

    def __init__(self, name: str, body: Callable[[], bool | None], stopped: threading.Event,
                 on_fault: Callable[[str, BaseException], None]):
        self.name = name
        self.body = body
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
            try:
                if self.body() is False:
                    break
            except Exception as error:  # the point: no loop dies
                self.on_fault(self.name, error)
                self.stopped.wait(FAULT_PAUSE_SECONDS)
        self.done.set()

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
        threading.Thread(target=self._watch, name="watchdog", daemon=True).start()

    def start(self, name: str, body: Callable[[], bool | None],
              stopped: threading.Event) -> Loop:
        """Run `body` supervised until `stopped` (or it returns False)."""
        loop = Loop(name, body, stopped, self.fault)
        with self._lock:
            self._loops = [kept for kept in self._loops if not kept.done.is_set()] + [loop]
        return loop

    def stop(self) -> None:
        self._stopped.set()

    def health(self) -> dict[str, object]:
        with self._lock:
            return {"threadFaults": self.faults, "threadRestarts": self.restarts,
                    **({"lastFault": self.last_fault} if self.last_fault else {})}

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
            try:
                self.check()
            except Exception as error:  # the watchdog must outlive everything
                log(f"watchdog: {type(error).__name__}: {error}")
