"""The job's goodput accounting: every second of the process in exactly one category."""

from __future__ import annotations

from tpu_training.goodput import CATEGORIES, Goodput


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_seconds_before_the_first_execution_are_start_up_then_productive():
    clock = Clock()
    goodput = Goodput(clock)
    clock.now += 7  # importing TensorFlow
    with goodput.timed("tpu_init"):
        clock.now += 3
    with goodput.timed("checkpoint_restore"):
        clock.now += 2
    clock.now += 5  # building the model, the first execution
    goodput.started_training()
    clock.now += 40  # training
    with goodput.timed("checkpoint_save"):
        clock.now += 1.5
    clock.now += 10
    assert goodput.totals() == {"productive": 50, "tpu_init": 3, "program_startup": 12,
                               "checkpoint_save": 1.5, "checkpoint_restore": 2}
    assert sum(goodput.totals().values()) == clock.now - 100  # nothing lost, nothing twice


def test_the_line_names_every_category_in_the_contract_order():
    clock = Clock()
    goodput = Goodput(clock)
    clock.now += 1.23456
    assert goodput.line(40) == ("goodput step=40 productive=0.000 tpu_init=0.000 "
                                "program_startup=1.235 checkpoint_save=0.000 "
                                "checkpoint_restore=0.000")
    assert CATEGORIES == ("productive", "tpu_init", "program_startup", "checkpoint_save",
                          "checkpoint_restore")


def test_a_failing_block_is_still_counted():
    clock = Clock()
    goodput = Goodput(clock)
    try:
        with goodput.timed("tpu_init"):
            clock.now += 4
            raise RuntimeError("TPU in use")
    except RuntimeError:
        pass
    assert goodput.totals()["tpu_init"] == 4
