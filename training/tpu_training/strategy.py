"""The distribution strategy: TPUStrategy on a TPU VM, MirroredStrategy on CPU off it.

`TPU_STACK_STRATEGY` picks it (docs/design.md, "The training package"):

- `tpu`: a TPU must initialise, or the job fails. The node agent sets this, so a
  broken libtpu never trains silently on the host CPU (docs/tpu-facts.md, "On the VM").
- `auto` (default): try the TPU, fall back to the CPU strategy when none is found.
- `cpu`: never look for a TPU.

With `tpu`, initialisation is retried with backoff for `TPU_STACK_TPU_INIT_SECONDS`
(default 300): a TPU that is not ready yet (a pod slice's other workers still booting)
usually comes free within that. After it the job exits 69 and the node agent retries
with backoff as long as the node lives.

A TPU held by another process is not retried: libtpu's lock is taken once, when
TensorFlow loads. `static bool tpu_library_finder = FindAndInitializeTpuLibrary();`
(tensorflow/core/tpu/tpu_api_dlsym_initializer.cc) runs `TryAcquireTpuLock()`
(third_party/xla/xla/stream_executor/tpu/tpu_initialize_util.cc; tensorflow/core/tpu/
tpu_initializer_helper.cc before) as a static initializer: `lockf(F_TLOCK)` on
/tmp/libtpu_lockfile, and on failure it only logs "The TPU is already in use by process
with pid N. Not attempting to load libtpu.so in this process." (or "... by another
process probably owned by another user ...", "... in use or the lock file is stale",
"... accessing libtpu multi-process lockfile"); the TPU platform is never registered in
this process, so no later call can succeed. So when initialisation fails and another
process holds the lock or a TPU device (`lock_holders`, `device_holders`, the way
`IsTpuUsed` looks for them), or the error names the lock, the job prints `tpu_training
tpu_busy holders=<pids or unknown>` and exits 69 at once: the agent's backoff starts a
fresh process, which takes the lock once it is free.

On CPU, `TPU_STACK_CPU_REPLICAS=N` splits the host CPU into N logical devices under
a MirroredStrategy, so per-replica batching and gradient all-reduce run for real.
"""

from __future__ import annotations

import fcntl
import os
import re
import struct
import time
from collections.abc import Callable
from pathlib import Path

from tpu_training import exits, output
from tpu_training.config import JobConfigError, tpu_init_seconds
from tpu_training.exits import UnavailableError
from tpu_training.tf_env import tf

STRATEGY_ENV = "TPU_STACK_STRATEGY"
CPU_REPLICAS_ENV = "TPU_STACK_CPU_REPLICAS"
FIRST_RETRY_SECONDS = 2.0
MAX_RETRY_SECONDS = 30.0
STRATEGY_KINDS = ("auto", "tpu", "cpu")
MAX_ERROR_CHARS = 200
LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"
# What libtpu's lock failure says (tpu_initialize_util.cc, all versions above).
BUSY_TEXTS = ("TPU is already in use", "libtpu multi-process lockfile")
# The device files IsTpuUsed looks for: /dev/accel<N> (v2-v4), /dev/vfio/<N> (v5e and newer).
TPU_DEVICE = re.compile(r"/dev/(accel\d+|vfio/\d+)")
_FLOCK = "hhqqi4x"  # struct flock on 64-bit Linux: type, whence, start, len, pid


class StrategyError(RuntimeError):
    """No strategy could be made (a bad setting raises JobConfigError instead)."""


class TpuUnavailableError(StrategyError, UnavailableError):
    """No TPU initialised (with `tpu`: within the job's bounded retries); exit 69."""


class TpuBusyError(TpuUnavailableError, exits.TpuBusyError):
    """Another process holds the TPU: never retried in this process; exit 69."""


def make_strategy(kind: str | None = None, cpu_replicas: int | None = None, *,
                  stopped: Callable[[], bool] = lambda: False) -> tf.distribute.Strategy:
    """The strategy `kind` (default: `$TPU_STACK_STRATEGY`, else `auto`) asks for.

    `stopped()` true (a stop signal arrived) ends the TPU retries at once: the agent
    is stopping the job, and nothing has trained since the last checkpoint.
    """
    kind = kind or os.environ.get(STRATEGY_ENV) or "auto"
    if kind not in STRATEGY_KINDS:
        raise JobConfigError.single(
            STRATEGY_ENV, f"{kind!r} is not allowed; use one of {', '.join(STRATEGY_KINDS)}")
    if kind == "tpu":
        return retried(tpu_strategy, tpu_init_seconds(os.environ), stopped=stopped)
    replicas = cpu_replicas or _cpu_replicas_from_env()
    # Looking for a TPU starts TensorFlow, after which the CPU can no longer be split.
    devices = split_cpu(replicas) if replicas > 1 else None
    if kind == "auto":
        try:
            return tpu_strategy()
        except StrategyError as error:
            output.tell(f"{error}; training on CPU")
    return tf.distribute.MirroredStrategy(devices) if devices else tf.distribute.get_strategy()


def tpu_strategy() -> tf.distribute.TPUStrategy:
    """TPUStrategy for this host's TPU, or the pod slice named by `$TPU_NAME`.

    Single host: `TPUClusterResolver(tpu="local")` on every worker. Pod slice: one
    client on worker 0 resolves the slice by name (docs/tpu-facts.md, "TensorFlow on
    TPU"; tensorflow.org/guide/tpu). Off a TPU VM the resolver succeeds and
    `initialize_tpu_system` raises NotFoundError (same source).
    """
    name = os.environ.get("TPU_NAME") or "local"
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=name)
        if name != "local":
            tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (tf.errors.OpError, ValueError, RuntimeError) as error:
        summary = str(error).strip().split(". ")[0][:MAX_ERROR_CHARS]
        message = f"TPU {name!r} did not initialise: {type(error).__name__}: {summary}"
        holders = sorted(lock_holders() | device_holders())
        if holders or any(text in str(error) for text in BUSY_TEXTS):
            raise TpuBusyError(f"{message}; the TPU is held by another process "
                               f"({_pids(holders)}), and libtpu takes its lock only when "
                               "TensorFlow loads: not retried", tuple(holders)) from error
        raise TpuUnavailableError(message) from error
    return tf.distribute.TPUStrategy(resolver)


_lock_files: dict[str, int] = {}  # kept open: closing one drops this process's lockf locks


def lock_holders(path: str = LIBTPU_LOCKFILE) -> set[int]:
    """The other process holding libtpu's lock on `path` (fcntl F_GETLK), if any."""
    try:
        fd = _lock_files.get(path)
        if fd is None:
            fd = _lock_files[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(_FLOCK, fcntl.F_RDLCK, 0, 0, 0, 0))
    except OSError:
        return set()
    kind, _, _, _, pid = struct.unpack(_FLOCK, answer)
    return {pid} if kind != fcntl.F_UNLCK and pid != os.getpid() else set()


def device_holders(proc: str = "/proc") -> set[int]:
    """Other processes with a TPU device open, as libtpu's `IsTpuUsed` finds them (only
    processes this user may inspect)."""
    holders = set()
    for fd_dir in Path(proc).glob("[0-9]*/fd"):
        pid = int(fd_dir.parent.name)
        if pid == os.getpid():
            continue
        try:
            if any(TPU_DEVICE.fullmatch(os.readlink(fd)) for fd in fd_dir.iterdir()):
                holders.add(pid)
        except OSError:  # gone, or not ours to read
            continue
    return holders


def _pids(holders: list[int]) -> str:
    return f"pid {', '.join(map(str, holders))}" if holders else "pid unknown"


def retried(make: Callable[[], tf.distribute.TPUStrategy], seconds: float, *,
            stopped: Callable[[], bool] = lambda: False,
            sleep: Callable[[float], None] | None = None,
            clock: Callable[[], float] = time.monotonic) -> tf.distribute.TPUStrategy:
    """`make()`, retried with doubling pauses while `seconds` allow and nothing `stopped()`
    the job; its last error then."""
    sleep = sleep or (lambda pause: _sleep_unless(pause, stopped))
    deadline, pause = clock() + seconds, FIRST_RETRY_SECONDS
    while True:
        try:
            return make()
        except TpuBusyError:
            raise
        except TpuUnavailableError as error:
            left = deadline - clock()
            if left <= 0 or stopped():
                why = ("a stop signal ended the retries" if stopped()
                       else f"retried for {seconds:g} s")
                raise TpuUnavailableError(f"{error} ({why})") from error
            pause = min(pause, left)
            output.tell(f"{error}; retrying in {pause:.1f} s")
            sleep(pause)
            pause = min(2 * pause, MAX_RETRY_SECONDS)


def _sleep_unless(seconds: float, stopped: Callable[[], bool], tick: float = 0.2) -> None:
    """Sleep `seconds`, or less once `stopped()` (a signal does not cut time.sleep short)."""
    deadline = time.monotonic() + seconds
    while not stopped() and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(tick, left))


def split_cpu(replicas: int) -> list[str]:
    """Split the host CPU into `replicas` logical devices; must run before TF starts."""
    (cpu,) = tf.config.list_physical_devices("CPU")
    configured = tf.config.get_logical_device_configuration(cpu)
    if configured is None or len(configured) != replicas:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
        except RuntimeError as error:
            raise StrategyError(
                f"{CPU_REPLICAS_ENV}={replicas}: the CPU is already initialised with "
                f"{len(tf.config.list_logical_devices('CPU'))} logical devices") from error
    return [device.name for device in tf.config.list_logical_devices("CPU")]


def _cpu_replicas_from_env() -> int:
    text = os.environ.get(CPU_REPLICAS_ENV, "1")
    if not text.isdigit() or int(text) < 1:
        raise JobConfigError.single(
            CPU_REPLICAS_ENV, f"must be a whole number of at least 1, got {text!r}")
    return int(text)
