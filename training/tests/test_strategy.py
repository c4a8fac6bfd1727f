"""Picking the strategy off a TPU VM: `auto` falls back to the CPUs, `tpu` retries, fails."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from tpu_training import strategy as strategies
from tpu_training.config import JobConfigError
from tpu_training.tf_env import tf


def test_auto_falls_back_to_the_cpu_replicas(strategy, capsys):
    fallback = strategies.make_strategy("auto", 2)
    assert isinstance(fallback, tf.distribute.MirroredStrategy)
    assert fallback.num_replicas_in_sync == 2
    assert capsys.readouterr().err == (
        "tpu_training: TPU 'local' did not initialise: NotFoundError: TPUs not found in the "
        "cluster; training on CPU\n")


def test_tpu_never_falls_back(strategy, monkeypatch):
    monkeypatch.setenv("TPU_STACK_TPU_INIT_SECONDS", "0")
    with pytest.raises(strategies.TpuUnavailableError,
                       match=r"^TPU 'local' did not initialise: .* \(retried for 0 s\)$"):
        strategies.make_strategy("tpu")


class FakeClock:
    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_a_tpu_that_comes_free_is_used_after_backoff(strategy, monkeypatch, capsys):
    """"TPU in use" / not ready yet: initialisation is retried, pauses doubling."""
    attempts = []

    def initialize(resolver):
        attempts.append(resolver)
        if len(attempts) < 4:
            raise tf.errors.UnavailableError(None, None, "TPU in use by another process")

    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", initialize)
    monkeypatch.setattr(tf.distribute, "TPUStrategy", lambda resolver: ("tpu", resolver))
    clock = FakeClock()
    made = strategies.retried(strategies.tpu_strategy, 60, sleep=clock.sleep, clock=clock)
    assert made == ("tpu", attempts[-1])
    assert clock.sleeps == [2, 4, 8]
    assert capsys.readouterr().err.splitlines()[0] == (
        "tpu_training: TPU 'local' did not initialise: UnavailableError: TPU in use by "
        "another process; retrying in 2.0 s")


def test_tpu_retries_are_bounded_in_time(strategy, monkeypatch):
    def never(resolver):
        raise tf.errors.NotFoundError(None, None, "TPUs not found in the cluster")

    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", never)
    clock = FakeClock()
    with pytest.raises(strategies.TpuUnavailableError, match=r"\(retried for 100 s\)$"):
        strategies.retried(strategies.tpu_strategy, 100, sleep=clock.sleep, clock=clock)
    assert clock.sleeps == [2, 4, 8, 16, 30, 30, 10]  # capped at 30 s, the last cut to fit
    assert clock.now == 100


def test_cpu_with_one_replica_is_the_default_strategy(strategy):
    assert strategies.make_strategy("cpu", 1) is tf.distribute.get_strategy()


def test_the_cpu_split_cannot_change_once_tensorflow_runs(strategy):
    with pytest.raises(strategies.StrategyError, match="already initialised with 2 logical"):
        strategies.make_strategy("cpu", 3)


@pytest.mark.parametrize(("env", "value", "message"), [
    ("TPU_STACK_STRATEGY", "gpu", "'gpu' is not allowed; use one of auto, tpu, cpu"),
    ("TPU_STACK_CPU_REPLICAS", "two", "must be a whole number of at least 1, got 'two'"),
    ("TPU_STACK_CPU_REPLICAS", "0", "must be a whole number of at least 1, got '0'"),
    ("TPU_STACK_TPU_INIT_SECONDS", "soon", "must be a number of seconds, 0 or more, got 'soon'"),
    ("TPU_STACK_TPU_INIT_SECONDS", "-1", "must be a number of seconds, 0 or more, got '-1'"),
])
def test_bad_environment_values_name_the_variable(monkeypatch, env, value, message):
    monkeypatch.setenv("TPU_STACK_STRATEGY", "tpu" if env.endswith("INIT_SECONDS") else "cpu")
    monkeypatch.setenv(env, value)
    with pytest.raises(JobConfigError) as caught:
        strategies.make_strategy()
    assert caught.value.problems == [(env, message)]


def test_a_stop_signal_ends_the_tpu_retries_at_once(strategy, monkeypatch):
    """The agent stops a job still waiting for its TPU: it must not wait out the retries."""
    def busy(resolver):
        raise tf.errors.UnavailableError(None, None, "TPU in use")

    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", busy)
    monkeypatch.setenv("TPU_STACK_TPU_INIT_SECONDS", "300")
    signalled = []
    threading.Timer(0.5, signalled.append, args=[15]).start()
    started = time.monotonic()
    with pytest.raises(strategies.TpuUnavailableError,
                       match=r"TPU in use \(a stop signal ended the retries\)$"):
        strategies.make_strategy("tpu", stopped=lambda: bool(signalled))
    assert time.monotonic() - started < 1.5  # within the first 2 s pause


def test_a_tpu_held_by_another_process_is_not_retried(strategy, monkeypatch):
    """libtpu takes its lock once, when TensorFlow loads: retrying in-process is futile."""
    def held(resolver):
        raise tf.errors.AbortedError(None, None, "The TPU is already in use by process with "
                                                 "pid 4242. Not attempting to load libtpu.so")

    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", held)
    monkeypatch.setattr(strategies, "lock_holders", lambda: set())
    monkeypatch.setattr(strategies, "device_holders", lambda: {4242})
    clock = FakeClock()
    with pytest.raises(strategies.TpuBusyError) as caught:
        strategies.retried(strategies.tpu_strategy, 300, sleep=clock.sleep, clock=clock)
    assert clock.sleeps == []
    assert caught.value.holders == (4242,)
    assert caught.value.line == "tpu_busy holders=4242"
    assert str(caught.value).endswith("the TPU is held by another process (pid 4242), and "
                                      "libtpu takes its lock only when TensorFlow loads: "
                                      "not retried")


def test_a_failure_naming_the_lock_is_busy_even_without_a_holder_found(strategy, monkeypatch):
    def stale(resolver):
        raise tf.errors.AbortedError(None, None, "Internal error when accessing libtpu "
                                                 "multi-process lockfile")

    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", stale)
    monkeypatch.setattr(strategies, "lock_holders", lambda: set())
    monkeypatch.setattr(strategies, "device_holders", lambda: set())
    with pytest.raises(strategies.TpuBusyError) as caught:
        strategies.tpu_strategy()
    assert caught.value.line == "tpu_busy holders=unknown"


def test_the_holder_of_the_libtpu_lock_is_found(tmp_path):
    lockfile = tmp_path / "libtpu_lockfile"
    lockfile.touch()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         f"fd = os.open({str(lockfile)!r}, os.O_RDWR)\nfcntl.lockf(fd, fcntl.LOCK_EX)\n"
         "print('locked', flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        assert strategies.lock_holders(str(lockfile)) == {holder.pid}
    finally:
        holder.kill()
        holder.wait()
    assert strategies.lock_holders(str(tmp_path / "absent")) == set()


def test_the_holders_of_a_tpu_device_are_found(tmp_path):
    for pid, target in (("101", "/dev/accel0"), ("102", "/dev/vfio/3"), ("103", "/dev/null"),
                        ("104", "/dev/vfio/vfio")):
        fd = tmp_path / pid / "fd"
        fd.mkdir(parents=True)
        (fd / "7").symlink_to(target)
    assert strategies.device_holders(str(tmp_path)) == {101, 102}
