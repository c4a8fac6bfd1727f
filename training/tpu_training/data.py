"""The input pipeline: sharded TFRecords from GCS or a local path, per replica.

Record schema (one `tf.train.Example` per image, every model):

| feature | type | content |
| --- | --- | --- |
| `image` | bytes | raw uint8 pixels, row-major height x width x channels |
| `label` | int64 | the class, 0 <= label < numClasses |

- `mnist_cnn`: 28 x 28 x 1 pixels (784 bytes), labels 0-9 unless `numClasses` says otherwise.
- `resnet18`, `resnet50`: imageSize x imageSize x 3 pixels (RGB; imageSize defaults to
  224, so 150528 bytes), labels below `numClasses` (default 1000).

`python -m tpu_training synth` writes data in this schema. The pipeline follows
the Cloud TPU input guidance (tpu-facts.md, "tf.data on TPU"): files are listed
once, sharded per input pipeline, shuffled per epoch and repeated, read
`interleave`d in parallel; a window of whole per-replica batches
(`drop_remainder=True`) is parsed at once and permuted; batches are prefetched.
The order is non-deterministic and tf.data's RAM budget bounded.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from tpu_training.config import JobConfigError
from tpu_training.models import ModelSpec
from tpu_training.tf_env import tf

DatasetFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]

# 8 MiB read buffer per GCS file, as Cloud TPU's ResNet ImageNet input does
# (tensorflow/tpu, imagenet_input.py). Local files keep TF's default: allocating
# 8 MiB per opened file slows small local shards (bench/input_pipeline.py).
GCS_READ_BUFFER_BYTES = 8 * 1024 * 1024
MAX_PARALLEL_FILES = 16
# Records taken from a file per visit: switching files every record costs more
# than parsing on small records (bench/input_pipeline.py).
RECORDS_PER_FILE_VISIT = 16
# Shuffling: a window of whole batches is parsed at once and permuted, at most this
# many bytes of pixels and records; a per-record shuffle buffer costs about as much
# as reading the record (bench/input_pipeline.py).
SHUFFLE_WINDOW_BYTES = 256 * 1024 * 1024
MAX_SHUFFLE_WINDOW_RECORDS = 8192
# tf.data's autotuner may use half of the available RAM by default
# (tf.data.experimental.AutotuneOptions.ram_budget); the job leaves room for the rest.
RAM_BUDGET_FRACTION = 0.25

_FEATURES = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64),
}


def list_files(pattern: str, *, key: str = "trainData") -> list[str]:
    """The files `pattern` matches, sorted; a clear error naming `key` if none."""
    if pattern.count("[") != pattern.count("]"):
        # TensorFlow's glob matches nothing rather than rejecting it.
        raise JobConfigError.single(key, f"{pattern!r} is not a valid glob: unbalanced [ ]")
    try:
        files = sorted(tf.io.gfile.glob(pattern))
    except tf.errors.OpError as error:
        raise JobConfigError.single(key, f"cannot list {pattern!r}: {error.message}") from error
    if not files:
        raise JobConfigError.single(key, f"no files match {pattern!r}")
    return files


def check_records(files: list[str], spec: ModelSpec, *, key: str = "trainData") -> None:
    """Read the first record and check it against the schema of `spec`'s model."""
    try:
        first = next(iter(tf.data.TFRecordDataset(files[:1]).take(1)), None)
        if first is None:
            raise JobConfigError.single(key, f"{files[0]} holds no records")
        example = tf.io.parse_single_example(first, _FEATURES)
    except tf.errors.OpError as error:
        raise JobConfigError.single(
            key, f"{files[0]} is not a TFRecord file of tf.train.Examples with 'image' and "
                 f"'label': {error.message}") from error
    expected = _pixels(spec)
    actual = len(example["image"].numpy())
    if actual != expected:
        shape = "x".join(map(str, spec.image_shape))
        raise JobConfigError.single(
            key, f"records in {files[0]} hold {actual}-byte images; {spec.name} reads "
                 f"{shape} = {expected} bytes (see imageSize)")


def make_dataset_fn(files: list[str], spec: ModelSpec, global_batch_size: int,
                    *, training: bool = True) -> DatasetFn:
    """The `distribute_datasets_from_function` input: per-replica batches.

    Training: shuffled and repeated forever. Evaluation (`training=False`): one
    pass in file order, the last partial batch dropped (TPUs need static shapes).
    """
    key = "trainData" if training else "evalData"

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        if len(files) < context.num_input_pipelines:
            raise JobConfigError.single(
                key, f"{len(files)} files for {context.num_input_pipelines} input pipelines; "
                     "write at least one shard per host")
        batch_size = context.get_per_replica_batch_size(global_batch_size)
        records = shard_records(files, context.num_input_pipelines,
                                context.input_pipeline_id, training=training)
        if training:
            return records_to_batches(records, spec, batch_size)
        return (records.batch(batch_size, drop_remainder=True)
                .map(lambda serialized: parse_batch(serialized, spec),
                     num_parallel_calls=tf.data.AUTOTUNE)
                .prefetch(tf.data.AUTOTUNE).with_options(pipeline_options()))

    return dataset_fn


def shard_records(files: list[str], num_shards: int = 1, index: int = 0,
                  *, training: bool = True) -> tf.data.Dataset:
    """Serialized records of this pipeline's share of `files`; for training, shuffled
    by file and repeated."""
    paths = tf.data.Dataset.from_tensor_slices(files).shard(num_shards, index)
    own = -(-(len(files) - index) // num_shards)
    if training:
        paths = paths.shuffle(own, reshuffle_each_iteration=True).repeat()
    buffer_size = GCS_READ_BUFFER_BYTES if files[0].startswith("gs://") else None
    return paths.interleave(
        lambda path: tf.data.TFRecordDataset(path, buffer_size=buffer_size),
        cycle_length=min(own, MAX_PARALLEL_FILES), block_length=RECORDS_PER_FILE_VISIT,
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)


def records_to_batches(records: tf.data.Dataset, spec: ModelSpec,
                       batch_size: int) -> tf.data.Dataset:
    """(images, labels) batches of `batch_size`: windows of batches parsed and shuffled."""
    window = window_batches(spec, batch_size)
    batches = (records.batch(window * batch_size, drop_remainder=True)
               .map(lambda serialized: shuffled_window(serialized, spec, window),
                    num_parallel_calls=tf.data.AUTOTUNE)
               .unbatch()
               .map(_to_float, num_parallel_calls=tf.data.AUTOTUNE)
               .prefetch(tf.data.AUTOTUNE))
    return batches.with_options(pipeline_options())


def window_batches(spec: ModelSpec, batch_size: int) -> int:
    """How many batches one shuffle window holds (at least one)."""
    records = min(MAX_SHUFFLE_WINDOW_RECORDS, SHUFFLE_WINDOW_BYTES // _pixels(spec))
    return max(1, records // batch_size)


def shuffled_window(serialized: tf.Tensor, spec: ModelSpec,
                    batches: int) -> tuple[tf.Tensor, tf.Tensor]:
    """A window of records, parsed and permuted, as uint8 [batches, B, H, W, C] and [batches, B]."""
    images, labels = _decode(serialized, spec)
    order = tf.random.shuffle(tf.range(tf.shape(labels)[0]))
    batch_size = serialized.shape[0] // batches
    return (tf.reshape(tf.gather(images, order), [batches, batch_size, *spec.image_shape]),
            tf.reshape(tf.gather(labels, order), [batches, batch_size]))


def parse_batch(serialized: tf.Tensor, spec: ModelSpec) -> tuple[tf.Tensor, tf.Tensor]:
    """A batch of serialized Examples as float32 pixels [B, H, W, C] and int32 labels [B]."""
    return _to_float(*_decode(serialized, spec))


def _decode(serialized: tf.Tensor, spec: ModelSpec) -> tuple[tf.Tensor, tf.Tensor]:
    parsed = tf.io.parse_example(serialized, _FEATURES)
    # fixed_length keeps the batch's shape static, which TPUs need.
    pixels = tf.io.decode_raw(parsed["image"], tf.uint8, fixed_length=_pixels(spec))
    return tf.reshape(pixels, [-1, *spec.image_shape]), tf.cast(parsed["label"], tf.int32)


def _to_float(images: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    # uint8 until here (a quarter of the memory in the shuffle window), but not onto
    # the device: TPUs do not take uint8 (tensorflow/tensorflow issue 37426).
    return tf.cast(images, tf.float32), labels


def pipeline_options() -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = False
    options.autotune.enabled = True
    options.autotune.ram_budget = int(_physical_memory() * RAM_BUDGET_FRACTION)
    return options


def _pixels(spec: ModelSpec) -> int:
    height, width, channels = spec.image_shape
    return height * width * channels


def _physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
