"""Resume continues the epoch: the ids of the records training consumed, across a SIGTERM
(none repeated or skipped) and a SIGKILL (at most the steps since the last checkpoint
replayed), and the input stream's order as a pure function of (seed, epoch, position)."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from test_preemption import Job, written_steps

from tpu_training import data, models, synth
from tpu_training.tf_env import tf

RECORDS, SHARDS = 96, 4
SPEC = models.ModelSpec("mnist_cnn", (28, 28, 1), 10, 0.1)
GLOBAL_BATCH = 8  # 2 replicas x 4: an epoch of 96 records is 12 steps
EPOCH_STEPS = RECORDS // GLOBAL_BATCH
EVERY = 4  # checkpointEverySteps
RECORDER = Path(__file__).with_name("record_ids.py")


@pytest.fixture(scope="module")
def numbered_data(tmp_path_factory) -> str:
    """RECORDS records whose first two pixels hold their id; round-robin over SHARDS files."""
    out = tmp_path_factory.mktemp("numbered")
    writers = [tf.io.TFRecordWriter(str(out / synth.shard_name("train", i, SHARDS)))
               for i in range(SHARDS)]
    for number in range(RECORDS):
        image = np.zeros(SPEC.image_shape, np.uint8)
        image.flat[:2] = divmod(number, 256)
        writers[number % SHARDS].write(synth.example_bytes(image, number % 10))
    for writer in writers:
        writer.close()
    return f"{out}/train-*.tfrecord"


class RecordedJob(Job):
    """The job's CLI with a model that logs the ids of every batch it trains on."""

    def __init__(self, config: Path, log: Path, ids: Path):
        self.ids = ids
        self.log = log.open("w")
        self.process = subprocess.Popen(
            [sys.executable, str(RECORDER), str(ids), "run", "--config", str(config)],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def consumed(self) -> list[int]:
        if not self.ids.exists():
            return []
        return [int(n) for line in self.ids.read_text().split("\n") for n in line.split()]


@pytest.fixture
def recorded_job(tmp_path, numbered_data):
    config = tmp_path / "job.json"
    config.write_text(json.dumps({
        "model": "mnist_cnn", "trainData": numbered_data, "globalBatchSize": GLOBAL_BATCH,
        "trainSteps": 100_000, "stepsPerExecution": 2, "checkpointEverySteps": EVERY,
        "checkpointDir": str(tmp_path / "ckpt"), "exportDir": str(tmp_path / "export"),
        "tensorboardDir": str(tmp_path / "tb")}))
    runs = iter(range(1, 10))

    def start() -> RecordedJob:
        run = next(runs)
        return RecordedJob(config, tmp_path / f"stderr-{run}.log", tmp_path / f"ids-{run}")

    return start


def epochs_of(consumed: list[int], count: int) -> list[Counter]:
    return [Counter(consumed[i * RECORDS:(i + 1) * RECORDS]) for i in range(count)]


EVERY_RECORD_ONCE = Counter(range(RECORDS))


def test_after_sigterm_the_epoch_goes_on_without_repeating_or_skipping(recorded_job):
    first = recorded_job()
    first.wait_for_step(6)
    assert first.stop(signal.SIGTERM) == 75
    stopped = first.steps[-1]
    assert stopped < EPOCH_STEPS
    before = first.consumed()
    assert len(before) == stopped * GLOBAL_BATCH  # one batch per replica and step

    rerun = recorded_job()
    rerun.wait_for_step(2 * EPOCH_STEPS + 2)
    assert rerun.stop(signal.SIGTERM) == 75
    assert rerun.progress[0] == f"tpu_training resumed_from={stopped}"
    consumed = before + rerun.consumed()
    assert epochs_of(consumed, 2) == [EVERY_RECORD_ONCE] * 2
    assert consumed[:RECORDS] != consumed[RECORDS:2 * RECORDS]  # each epoch its own order


def test_after_sigkill_only_the_steps_since_the_last_checkpoint_are_replayed(recorded_job):
    killed = recorded_job()
    killed.wait_for_step(EVERY + 6)
    assert killed.stop(signal.SIGKILL) == -signal.SIGKILL
    last_printed = killed.steps[-1]
    before = killed.consumed()

    rerun = recorded_job()
    rerun.wait_for_step(EPOCH_STEPS + 2)
    assert rerun.stop(signal.SIGTERM) == 75
    resumed = int(rerun.progress[0].removeprefix("tpu_training resumed_from="))
    # Saves are written in the background: the last one said to be written before the
    # kill, or one written after the last line read.
    written = max(written_steps(killed.lines), default=0)
    assert resumed % EVERY == 0 and written <= resumed <= last_printed
    after = rerun.consumed()
    kept = before[:resumed * GLOBAL_BATCH]  # what the checkpoint holds
    replayed = before[resumed * GLOBAL_BATCH:]  # trained on, then lost with the process
    # The kill may cut an execution short: its steps ran but never completed.
    assert len(replayed) <= (last_printed - written + 2) * GLOBAL_BATCH
    whole = len(replayed) // GLOBAL_BATCH * GLOBAL_BATCH  # the kill may split a step
    assert Counter(after[:whole]) == Counter(replayed[:whole])  # the same steps again
    assert set(replayed[whole:]) <= set(after[whole:whole + GLOBAL_BATCH])
    assert epochs_of(kept + after, 1) == [EVERY_RECORD_ONCE]


def test_the_stream_is_a_pure_function_of_its_position(numbered_data):
    """Per input pipeline: starting at step N skips N x (its replicas) batches of the fresh
    stream, also across an epoch's end and on a pod's second host."""
    files = data.list_files(numbered_data)
    for pipelines, replicas in ((1, 2), (2, 4)):
        context = tf.distribute.InputContext(num_input_pipelines=pipelines,
                                             input_pipeline_id=pipelines - 1,
                                             num_replicas_in_sync=replicas)
        dataset_fn = data.make_dataset_fn(files, SPEC, GLOBAL_BATCH * pipelines)
        fresh = batches(dataset_fn, context, 0, 40)
        per_step = replicas // pipelines
        for step in (1, 5, 13):
            assert batches(dataset_fn, context, step, 40 - step * per_step) == (
                fresh[step * per_step:])


def batches(dataset_fn, context, step: int, count: int) -> list[list[int]]:
    stream = data.starting_at(dataset_fn, step)(context).take(count)
    return [ids(images) for images, _ in stream]


def ids(images: tf.Tensor) -> list[int]:
    pixels = models.model_pixels(images, SPEC).numpy().reshape(len(images), -1)
    return (pixels[:, 0] * 256 + pixels[:, 1]).astype(int).tolist()


def test_a_dataset_fn_of_the_callers_own_restarts(numbered_data):
    def own(context):
        return tf.data.Dataset.range(3)

    assert data.starting_at(own, 7) is own
