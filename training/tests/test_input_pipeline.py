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
    assert (images.shape, images.dtype) == ((8, 28 * 28 // 4), tf.int32)  # packed pixels
    assert (labels.shape, labels.dtype) == ((8,), tf.int32)


def test_each_replica_gets_its_share_of_the_global_batch(strategy, mnist_data):
    dataset_fn = data.make_dataset_fn(data.list_files(mnist_data), SPEC, 16)
    images, labels = next(iter(strategy.distribute_datasets_from_function(dataset_fn)))
    per_replica = [models.model_pixels(batch, SPEC)
                   for batch in strategy.experimental_local_results(images)]
    assert [tuple(batch.shape) for batch in per_replica] == [(8, 28, 28, 1)] * 2
    pixels = tf.concat(per_replica, axis=0)
    assert float(tf.reduce_min(pixels)) >= 0 and float(tf.reduce_max(pixels)) <= 255
    assert len(strategy.experimental_local_results(labels)) == 2


def test_files_are_sharded_per_input_pipeline(mnist_data):
    files = data.list_files(mnist_data)
    assert len(files) == 16
    mine, others = records_of(files[1::2]), records_of(files[0::2])
    read = {record.numpy() for record in data.read_chunks(files, SPEC, 2, 1).unbatch().take(600)}
    assert read <= mine  # 600 > 512 records in my 8 files: the shard repeats
    assert len(read) == len(mine) and not read & others


def test_chunks_come_from_one_file_each_and_miss_no_record(mnist_data, monkeypatch):
    monkeypatch.setattr(data, "MAX_CHUNK_RECORDS", 5)  # 64 records a file: a partial last chunk
    files = data.list_files(mnist_data)
    chunks = [chunk.numpy() for chunk in data.read_chunks(files, SPEC, training=False)]
    by_file = [records_of([path]) for path in files]
    assert all(any(set(chunk) <= mine for mine in by_file) for chunk in chunks)
    assert sorted(map(len, chunks)) == [4] * 16 + [5] * (16 * 12)
    read = [record for chunk in chunks for record in chunk]
    assert len(read) == len(set(read)) == 1024 and set(read) == records_of(files)


def test_a_chunk_holds_about_a_mebibyte_of_pixels():
    assert data.chunk_records(SPEC) == 256
    assert data.chunk_records(models.ModelSpec("resnet50", (224, 224, 3), 1000, 0.1)) == 6
    assert data.chunk_records(models.ModelSpec("resnet50", (1024, 1024, 3), 1000, 0.1)) == 1


def test_options_keep_the_order_within_a_ram_budget():
    options = data.pipeline_options()
    assert options.deterministic is True  # resume relies on it (data.EpochInput)
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


def numbered_records(count: int) -> tf.Tensor:
    """Records whose pixels all hold their number, labelled number % 10."""
    return tf.constant([synth.example_bytes(np.full(SPEC.image_shape, i, np.uint8), i % 10)
                        for i in range(count)])


def test_a_window_is_split_into_whole_batches_in_an_order_drawn_from_its_coordinates():
    def order(epoch: int, index: int, skip: int = 0, count: int = 35) -> np.ndarray:
        return data.window_order(tf.constant(count), 8, 0, tf.constant(epoch, tf.int64),
                                 tf.constant(index, tf.int64), tf.constant(skip)).numpy()

    first = order(0, 0)
    assert first.shape == (4, 8)  # 35 records: 4 whole batches, 3 records left out
    assert len(set(first.reshape(-1))) == 32 and set(first.reshape(-1)) <= set(range(35))
    assert (order(0, 0) == first).all()  # a pure function of (seed, epoch, window)
    assert not (order(1, 0) == first).all() and not (order(0, 1) == first).all()
    assert (order(0, 0, skip=3) == first[3:]).all()


def test_training_batches_hold_whole_examples_each_once_per_window(monkeypatch):
    windows = tf.data.Dataset.from_tensors(
        (tf.constant(0, tf.int64), tf.constant(0, tf.int64), numbered_records(32)))
    batches = [(models.model_pixels(images, SPEC), labels) for images, labels in
               data.raw_batches(windows, SPEC, 8, 0, lambda *_: tf.constant(0, tf.int64))]
    assert len(batches) == 4
    assert all((images.shape, images.dtype) == ((8, 28, 28, 1), tf.float32)
               for images, _ in batches)
    numbers = np.concatenate([images.numpy().reshape(8, -1) for images, _ in batches])
    firsts = numbers[:, 0].astype(int)
    assert sorted(firsts) == list(range(32)) and list(firsts) != list(range(32))
    assert (numbers == firsts[:, None]).all()
    labels = np.concatenate([labels.numpy() for _, labels in batches])
    assert list(labels) == [number % 10 for number in firsts]


def test_pixels_packed_on_the_host_unpack_exactly_in_xla():
    odd = models.ModelSpec("resnet18", (5, 5, 3), 10, 0.1)  # 75 pixels: a padded last word
    unpack = tf.function(models.model_pixels, jit_compile=True)  # XLA, as on a TPU
    for spec in (SPEC, odd):
        images = np.random.default_rng(0).integers(0, 256, (3, *spec.image_shape), np.uint8)
        images[0] = 255  # every sign bit of the words set
        words = data.pack_pixels(tf.constant(images))
        assert (words.dtype, words.shape) == (tf.int32, (3, -(-images[0].size // 4)))
        assert (unpack(words, spec).numpy() == images.astype(np.float32)).all()


def test_pixels_a_caller_passes_unpacked_reach_the_model_as_floats():
    images = np.arange(2 * 28 * 28).reshape(2, 28, 28, 1) % 256
    for dtype in (tf.uint8, tf.int32, tf.float32):
        pixels = models.model_pixels(tf.constant(images, dtype), SPEC)
        assert pixels.dtype == tf.float32 and (pixels.numpy() == images).all()
