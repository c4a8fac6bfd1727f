"""Who holds the TPU: processes with a TPU device open, and libtpu's lock file."""

# A TPU chip serves one process. TensorFlow's libtpu loader takes `lockf` on
# /tmp/libtpu_lockfile and, when that fails, answers "The TPU is already in use by
# process with pid N" or, when it cannot tell which, "Run "$ sudo lsof -w
# /dev/accel0" to figure out which process is using the TPU. If you still get this
# message, run "$ sudo rm /tmp/libtpu_lockfile"" (tensorflow/tensorflow
# tensorflow/core/tpu/tpu_initializer_helper.cc, TryAcquireTpuLock). The devices are
# /dev/accel* on v2-v4 and /dev/vfio/* on v5e and newer; Google's TPU CI frees them
# with `lsof -t /dev/<device> | xargs kill -9` before a retry
# (GoogleCloudPlatform/ml-auto-solutions xlml/utils/tpu.py, kill_process_by_pid).
# The agent finds holders the way lsof does, by reading every /proc/<pid>/fd link,
# with nothing but the standard library. It does not kill them: see `Holder.own`.
#
# TPU_STACK_TPU_DEVICES (globs separated by ':') and TPU_STACK_LIBTPU_LOCKFILE
# replace the device paths and the lock file, for tests.

from __future__ import annotations

import dataclasses
import fcntl
import glob
import os
from collections.abc import Iterable
from pathlib import Path

DEVICE_GLOBS = "/dev/accel*:/dev/vfio/*"
LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"
COMMAND_CHARS = 160


@dataclasses.dataclass(frozen=True)
class Holder:
    pid: int
    session: int  # the session id: a job the agent started leads its own session
    command: str

    def describe(self) -> str:
        return f"pid {self.pid} ({self.command})"


def device_paths() -> set[str]:
    globs = os.environ.get("TPU_STACK_TPU_DEVICES") or DEVICE_GLOBS
    return {os.path.realpath(path) for pattern in globs.split(":") if pattern
            for path in glob.glob(pattern)}


def lockfile_path() -> Path:
    return Path(os.environ.get("TPU_STACK_LIBTPU_LOCKFILE") or LIBTPU_LOCKFILE)


def holders(devices: Iterable[str] | None = None) -> list[Holder]:
    """Every other process with one of `devices` open (lsof's answer, from /proc)."""
    wanted = set(device_paths() if devices is None else devices)
    found = []
    for entry in Path("/proc").iterdir() if wanted else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            links = {os.readlink(fd) for fd in (entry / "fd").iterdir()}
        except OSError:  # gone, or another user's process (the agent runs as root)
            continue
        if links & wanted and (holder := _holder(int(entry.name))) is not None:
            found.append(holder)
    return sorted(found, key=lambda holder: holder.pid)


def _holder(pid: int) -> Holder | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    command = raw.replace(b"\0", b" ").decode(errors="replace").strip() or "?"
    if len(command) > COMMAND_CHARS:
        command = command[:COMMAND_CHARS - 1] + "…"
    session = int(stat.rsplit(")", 1)[1].split()[3])  # field 6 of proc(5)'s stat
    return Holder(pid, session, command)


def remove_stale_lockfile(path: Path | None = None) -> bool:
    """Remove libtpu's lock file when no process holds its lock; True if removed.

    Call it only when no process holds a TPU device: then the file is a leftover
    (e.g. created by another user, so a later process cannot open it to lock it),
    which is the case TensorFlow's message tells users to remove it for."""
    path = path or lockfile_path()
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    except OSError:
        fd = -1  # cannot open it to test the lock: nobody holds a device, remove it
    try:
        if fd >= 0:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # libtpu's lockf(F_TLOCK)
    except OSError:
        return False  # a live process holds the lock: not stale
    finally:
        if fd >= 0:
            os.close(fd)  # also drops the lock just taken
    path.unlink(missing_ok=True)
    return True
