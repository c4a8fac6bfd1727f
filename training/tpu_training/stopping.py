"""SIGTERM as "save now": a flag the training loop checks between executions.

Standard library only, so `__main__` can install it before TensorFlow loads (a
SIGTERM during the import would otherwise kill the job without a checkpoint).

The node agent sends SIGTERM the moment `instance/preempted` or
`instance/maintenance-event` changes; a spot or preemptible VM powers off 30 s after
its ACPI soft-off, a standard VM 120 s after (Compute Engine API, `Scheduling.
skipGuestOsShutdown`; docs/tpu-facts.md, "Preemption notice"), so the execution
under way and the stop save must fit in that.

Why not TF's `PreemptionCheckpointHandler` (read in TF 2.18 and 2.20,
tensorflow/python/distribute/failure_handling/failure_handling.py): on a Cloud TPU VM
`failure_handling_util.detect_platform()` answers `GCE_TPU` (the metadata server
answers and TPU devices exist); for `GCE_TPU` the constructor only logs "does not
support usage with TPU or CPU device on GCP", `run()` calls the train function
unchanged and `save_checkpoint_if_preempted()` returns without looking. Its
TPUStrategy support is for `INTERNAL_TPU` (Google's own clusters, the
`check_preemption` op). Its GCE watcher also reads only `instance/maintenance-event`,
never `instance/preempted`. So the job handles SIGTERM itself.

Handlers others replace. On TPU VMs libtpu installs its own SIGTERM handler
(pytorch/xla#3028 and #5616: "Raising signal 15 with default behavior" kills the process
with no save), and may do so lazily, after the job installed its own. Python's
`signal.getsignal` cannot see that: it answers from Python's own table, not the kernel's
(CPython Modules/signalmodule.c, `Handlers[]`). So `HandlerGuard` reads the kernel's
handler with sigaction(2) (ctypes, glibc's `struct sigaction` starts with the handler)
and puts ours back when another took its place. faulthandler's C handler is put back by
unregister, then register: register alone leaves a handler it already registered as it
is, even when another replaced it (CPython Modules/faulthandler.c,
`faulthandler_register_py` installs only `if (!user->enabled)`; checked on 3.10).
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

SIG_DFL, SIG_IGN = 0, 1  # the kernel's values for the default action and "ignore"


class StopFlag:
    """Records that a stop signal arrived; never interrupts the work under way."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, object] = {}
        self.guard = HandlerGuard()  # the handlers this job keeps (its own and others)

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def install(self, signals: tuple[int, ...] = (signal.SIGTERM,)) -> StopFlag:
        """Handle `signals` from now on (a no-op outside the main thread)."""
        if threading.current_thread() is threading.main_thread():
            for signum in signals:
                self._previous[signum] = signal.signal(signum, self._handle)
                self.guard.keep(signum, self._reinstall, python_handler=self._handle)
        return self

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
            self.guard.forget(signum)
        self._previous.clear()

    def _reinstall(self, signum: int) -> None:
        signal.signal(signum, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signal = signum


class HandlerGuard:
    """The signal handlers the job relies on, and what `restore` puts back."""

    def __init__(self) -> None:
        self._kept: dict[int, _Kept] = {}

    def keep(self, signum: int, reinstall: Callable[[int], None], *,
             python_handler: object = None) -> None:
        """Keep the handler installed now for `signum`; `reinstall(signum)` installs it
        again; `python_handler`: what `signal.getsignal` answers while it is in place."""
        self._kept[signum] = _Kept(native_handler(signum), reinstall, python_handler)

    def forget(self, signum: int) -> None:
        self._kept.pop(signum, None)

    def restore(self) -> list[tuple[str, str]]:
        """Put back every kept handler another replaced; (signal name, what had
        replaced it) for each, in the order they were kept."""
        replaced = []
        for signum, kept in list(self._kept.items()):
            by = kept.replaced_by(signum)
            if by is not None:
                kept.reinstall(signum)
                self.keep(signum, kept.reinstall, python_handler=kept.python_handler)
                replaced.append((signal.Signals(signum).name, by))
        return replaced


class _Kept:
    def __init__(self, native: int | None, reinstall: Callable[[int], None],
                 python_handler: object) -> None:
        self.native, self.reinstall, self.python_handler = native, reinstall, python_handler

    def replaced_by(self, signum: int) -> str | None:
        """What holds `signum` now instead of the kept handler, or None."""
        if self.python_handler is not None:
            now = signal.getsignal(signum)
            if now != self.python_handler:
                return _python_name(now)
        native = native_handler(signum)
        if native is None or self.native is None or native == self.native:
            return None
        return describe_native(native)


def native_handler(signum: int) -> int | None:
    """The kernel's handler for `signum` (0 default, 1 ignore, else an address); None
    where sigaction cannot be called (not Linux with glibc or musl)."""
    libc = _libc()
    if libc is None:
        return None
    # glibc's struct sigaction is 152 bytes on x86_64 (handler, 128-byte mask, flags,
    # restorer); the handler is its first field on every Linux architecture.
    action = ctypes.create_string_buffer(256)
    if libc.sigaction(signum, None, action) != 0:
        return None
    return ctypes.c_void_p.from_buffer(action).value or SIG_DFL


def describe_native(handler: int) -> str:
    """`SIG_DFL`, `SIG_IGN`, or the file name of the library holding the handler."""
    if handler in (SIG_DFL, SIG_IGN):
        return "SIG_DFL" if handler == SIG_DFL else "SIG_IGN"
    libc, info = _libc(), _DlInfo()
    if libc is not None and libc.dladdr(ctypes.c_void_p(handler), ctypes.byref(info)) \
            and info.dli_fname:
        return os.path.basename(info.dli_fname.decode(errors="replace"))
    return hex(handler)


def _python_name(handler: object) -> str:
    if isinstance(handler, signal.Handlers):
        return handler.name
    if handler is None:  # installed from C, not from Python
        return "native"
    name = getattr(handler, "__qualname__", None) or type(handler).__name__
    return f"python:{getattr(handler, '__module__', '?')}.{name}"


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


_LIBC: list[ctypes.CDLL | None] = []


def _libc() -> ctypes.CDLL | None:
    if not _LIBC:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.sigaction, libc.dladdr  # noqa: B018 (both must exist)
        except (AttributeError, OSError):
            libc = None
        _LIBC.append(libc)
    return _LIBC[0]
