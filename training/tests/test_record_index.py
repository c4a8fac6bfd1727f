"""A resume reads the record counts it needs from an index, not every data file."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tpu_training import data, models, synth
from tpu_training.tf_env import tf

SPEC = models.ModelSpec("mnist_cnn", (28, 28, 1), 10, 0.1)
GLOBAL_BATCH = 8


def bytes_read() -> int:
    """What this process has read so far, every thread (Linux: /proc/self/io, rchar)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def read_by_resume(dataset_fn: data.EpochInput, step: int) -> int:
    """The bytes read to build the stream resumed at `step` and take its first batch."""
    context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                         num_replicas_in_sync=2)
    before = bytes_read()
    next(iter(data.starting_at(dataset_fn, step)(context)))
    return bytes_read() - before


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")
def test_a_resume_reads_the_index_not_every_file(strategy, tmp_path, monkeypatch):
    monkeypatch.setattr(data, "MAX_SHUFFLE_WINDOW_RECORDS", 64)  # small windows, many of them
    pattern = synth.write_dataset(str(tmp_path / "data"), SPEC, examples=32768, shards=8).pattern
    files = data.list_files(pattern)
    total = sum(os.path.getsize(path) for path in files)
    index = data.RecordIndex(str(tmp_path / "ckpt"))
    counted = data.make_dataset_fn(files, SPEC, GLOBAL_BATCH)  # as every resume did
    indexed = data.make_dataset_fn(files, SPEC, GLOBAL_BATCH, index=index)

    assert read_by_resume(counted, 3) >= total
    read_by_resume(indexed, 0)  # a fresh start counts its files while it trains
    deadline = time.monotonic() + 120
    while not tf.io.gfile.exists(index.path):
        assert time.monotonic() < deadline, "the fresh start wrote no record index"
        time.sleep(0.2)
    assert index.records(files) == 32768
    assert read_by_resume(indexed, 3) < total / 4


def test_files_the_index_lacks_are_counted_once_and_added(strategy, tmp_path):
    pattern = synth.write_dataset(str(tmp_path / "data"), SPEC, examples=40, shards=4).pattern
    files = data.list_files(pattern)
    index = data.RecordIndex(str(tmp_path / "ckpt"))
    assert index.records(files[:2]) == 20
    assert index.records(files) == 40
    (tmp_path / "data" / Path(files[0]).name).write_bytes(b"")  # not read again
    assert index.records(files) == 40


def test_a_torn_index_is_counted_again(strategy, tmp_path):
    pattern = synth.write_dataset(str(tmp_path / "data"), SPEC, examples=12, shards=2).pattern
    index = data.RecordIndex(str(tmp_path / "ckpt"))
    (tmp_path / "ckpt").mkdir()
    Path(index.path).write_text('{"counts": {"')
    assert index.records(data.list_files(pattern)) == 12


@pytest.mark.parametrize("read_bytes", [7, 8 * 1024 * 1024])
def test_records_are_counted_from_their_framing(strategy, tmp_path, monkeypatch, read_bytes):
    """Records of any length, across the pieces the file is read in."""
    monkeypatch.setattr(data, "COUNT_READ_BYTES", read_bytes)
    path = str(tmp_path / "mixed.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for size in (0, 1, 11, 12, 5000, 3):
            writer.write(b"x" * size)
    read = int(tf.data.TFRecordDataset(path).reduce(0, lambda count, _: count + 1))
    assert data.records_in(path) == read == 6
