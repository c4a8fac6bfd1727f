"""The input pipeline: per-replica batches, files sharded per input pipeline."""

from __future__ import annotations

import os

import numpy as np

from tpu_training import data, models, synth
from tpu_training.tf_env import tf

SPEC = models.ModelSpec("mnist_cnn", (28, 28, 1), 10, 0.1)


def records_of(files: list[str]) -> set[bytes]:
    return {record.numpy() for record in tf.data.TFRecordDataset(files)}


def test_batches_are_per_replica_with_static_shapes(mnist_data):
    context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                         num_replicas_in_sync=4)
    dataset = data.make_dataset_fn(data.list_files(mnist_data), SPEC, 32)(context)
    images, labels = dataset.element_spec
    assert (images.shape, images.dtype) == ((8, 28, 28, 1), tf.float32)
    assert (labels.shape, labels.dtype) == ((8,), tf.int32)


def test_each_replica_gets_its_share_of_the_global_batch(strategy, mnist_data):
    dataset_fn = data.make_dataset_fn(data.list_files(mnist_data), SPEC, 16)
    images, labels = next(iter(strategy.distribute_datasets_from_function(dataset_fn)))
    per_replica = strategy.experimental_local_results(images)
    assert [tuple(batch.shape) for batch in per_replica] == [(8, 28, 28, 1)] * 2
    pixels = tf.concat(per_replica, axis=0)
    assert float(tf.reduce_min(pixels)) >= 0 and float(tf.reduce_max(pixels)) <= 255
    assert len(strategy.experimental_local_results(labels)) == 2


def test_files_are_sharded_per_input_pipeline(mnist_data):
    files = data.list_files(mnist_data)
    assert len(files) == 16
    mine, others = records_of(files[1::2]), records_of(files[0::2])
    read = {record.numpy() for record in data.shard_records(files, 2, 1).take(600)}
    assert read <= mine  # 600 > 512 records in my 8 files: the shard repeats
    assert len(read) == len(mine) and not read & others


def test_options_trade_order_for_speed_within_a_ram_budget():
    options = data.pipeline_options()
    assert options.deterministic is False
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert options.autotune.ram_budget == memory // 4


def test_too_few_files_for_the_input_pipelines(mnist_data):
    context = tf.distribute.InputContext(num_input_pipelines=32, input_pipeline_id=0,
                                         num_replicas_in_sync=32)
    dataset_fn = data.make_dataset_fn(data.list_files(mnist_data), SPEC, 64)
    try:
        dataset_fn(context)
    except data.JobConfigError as error:
        assert error.problems == [("trainData", "16 files for 32 input pipelines; "
                                                "write at least one shard per host")]
    else:
        raise AssertionError("no error")


def test_a_shuffle_window_permutes_whole_examples_into_batches():
    records = tf.constant([synth.example_bytes(np.full(SPEC.image_shape, i, np.uint8), i % 10)
                           for i in range(32)])
    images, labels = data.shuffled_window(records, SPEC, 4)
    assert (images.shape, labels.shape) == ((4, 8, 28, 28, 1), (4, 8))
    firsts = images.numpy().reshape(32, -1)[:, 0].astype(int)
    assert sorted(firsts) == list(range(32)) and list(firsts) != list(range(32))
    assert list(labels.numpy().reshape(32)) == [i % 10 for i in firsts]
    assert (images.numpy().reshape(32, -1) == firsts[:, None]).all()
