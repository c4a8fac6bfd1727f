"""Picking the strategy off a TPU VM: `auto` falls back to the CPUs, `tpu` fails."""

from __future__ import annotations

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


def test_tpu_never_falls_back(strategy):
    with pytest.raises(strategies.StrategyError, match=r"^TPU 'local' did not initialise"):
        strategies.make_strategy("tpu")


def test_cpu_with_one_replica_is_the_default_strategy(strategy):
    assert strategies.make_strategy("cpu", 1) is tf.distribute.get_strategy()


def test_the_cpu_split_cannot_change_once_tensorflow_runs(strategy):
    with pytest.raises(strategies.StrategyError, match="already initialised with 2 logical"):
        strategies.make_strategy("cpu", 3)


@pytest.mark.parametrize(("env", "value", "message"), [
    ("TPU_STACK_STRATEGY", "gpu", "'gpu' is not allowed; use one of auto, tpu, cpu"),
    ("TPU_STACK_CPU_REPLICAS", "two", "must be a whole number of at least 1, got 'two'"),
    ("TPU_STACK_CPU_REPLICAS", "0", "must be a whole number of at least 1, got '0'"),
])
def test_bad_environment_values_name_the_variable(monkeypatch, env, value, message):
    monkeypatch.setenv("TPU_STACK_STRATEGY", "cpu")
    monkeypatch.setenv(env, value)
    with pytest.raises(JobConfigError) as caught:
        strategies.make_strategy()
    assert caught.value.problems == [(env, message)]
