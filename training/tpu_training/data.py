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
the Cloud TPU input guidance (docs/tpu-facts.md, "tf.data on TPU"): files are listed
once, sharded per input pipeline, shuffled per epoch and repeated, read
`interleave`d in parallel in chunks of records; a window of whole per-replica
batches (`drop_remainder=True`) is parsed at once and split at random into
batches; batches are prefetched. The order is non-deterministic and tf.data's
RAM budget bounded. Pixels leave the pipeline packed four to an int32 word;
`model_pixels` unpacks them in the training step, on the device.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from tpu_training.config import JobConfigError
from tpu_training.exits import NoDataError, RecordsError
from tpu_training.models import ModelSpec
from tpu_training.tf_env import tf

DatasetFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]

# 8 MiB read buffer per GCS file, as Cloud TPU's ResNet ImageNet input does
# (tensorflow/tpu, imagenet_input.py). Local files keep TF's default: allocating
# 8 MiB per opened file slows small local shards (bench/input_pipeline.py).
GCS_READ_BUFFER_BYTES = 8 * 1024 * 1024
MAX_PARALLEL_FILES = 16
# Records travel through tf.data in chunks read from one file, about this many bytes:
# tf.data's cost per element, paid per record, is most of the cost of reading small
# records (bench/input_pipeline.py).
CHUNK_BYTES = 1024 * 1024
MAX_CHUNK_RECORDS = 256
# Shuffling: a window of whole batches is parsed at once and permuted, at most this
# many bytes of pixels and records; a per-record shuffle buffer costs about as much
# as reading the record (bench/input_pipeline.py).
SHUFFLE_WINDOW_BYTES = 256 * 1024 * 1024
MAX_SHUFFLE_WINDOW_RECORDS = 8192
# Pixels leave the pipeline packed four to an int32 word and the step unpacks them on
# the device: TPUs take no uint8 (tensorflow/tensorflow issue 37426), and a cast to
# float32 on the host writes four bytes a pixel, the pipeline's largest cost after
# reading large images (bench/input_pipeline.py), and sends them all to the TPU.
PIXELS_PER_WORD = 4
# tf.bitcast keeps the bytes in memory order: a word's first pixel is its low byte
# on a little-endian host.
_BYTE_SHIFTS = [0, 8, 16, 24] if sys.byteorder == "little" else [24, 16, 8, 0]
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
    except tf.errors.UnavailableError:
        raise  # storage answering 5xx: transient, not a bad setting
    except tf.errors.OpError as error:
        raise JobConfigError.single(key, f"cannot list {pattern!r}: {error.message}") from error
    if not files:
        raise NoDataError(key, pattern)  # not uploaded yet: the agent waits for it
    return files


def check_records(files: list[str], spec: ModelSpec, *, key: str = "trainData") -> None:
    """Read the first record and check it against the schema of `spec`'s model."""
    try:
        first = next(iter(tf.data.TFRecordDataset(files[:1]).take(1)), None)
        if first is None:
            raise RecordsError.single(key, f"{files[0]} holds no records")
        example = tf.io.parse_single_example(first, _FEATURES)
    except tf.errors.UnavailableError:
        raise
    except tf.errors.OpError as error:
        raise RecordsError.single(
            key, f"{files[0]} is not a TFRecord file of tf.train.Examples with 'image' and "
                 f"'label': {error.message}") from error
    expected = _pixels(spec)
    actual = len(example["image"].numpy())
    if actual != expected:
        shape = "x".join(map(str, spec.image_shape))
        raise RecordsError.single(
            key, f"records in {files[0]} hold {actual}-byte images; {spec.name} reads "
                 f"{shape} = {expected} bytes (see imageSize)")


def make_dataset_fn(files: list[str], spec: ModelSpec, global_batch_size: int,
                    *, training: bool = True) -> DatasetFn:
    """The `distribute_datasets_from_function` input: per-replica batches.

    Training: shuffled and repeated forever. Evaluation (`training=False`): one
    pass, the last partial batch dropped (TPUs need static shapes).
    """
    key = "trainData" if training else "evalData"

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        if len(files) < context.num_input_pipelines:
            raise JobConfigError.single(
                key, f"{len(files)} files for {context.num_input_pipelines} input pipelines; "
                     "write at least one shard per host")
        batch_size = context.get_per_replica_batch_size(global_batch_size)
        chunks = read_chunks(files, spec, context.num_input_pipelines,
                             context.input_pipeline_id, training=training)
        if training:
            return chunks_to_batches(chunks, spec, batch_size)
        return (chunks.rebatch(batch_size, drop_remainder=True)
                .map(lambda serialized: _packed(*_decode(serialized, spec)),
                     num_parallel_calls=tf.data.AUTOTUNE)
                .prefetch(tf.data.AUTOTUNE).with_options(pipeline_options()))

    return dataset_fn


def read_chunks(files: list[str], spec: ModelSpec, num_shards: int = 1, index: int = 0,
                *, training: bool = True) -> tf.data.Dataset:
    """Serialized records of this pipeline's share of `files`, as vectors of up to
    `chunk_records(spec)` records from one file; for training, files are shuffled
    and repeated."""
    paths = tf.data.Dataset.from_tensor_slices(files).shard(num_shards, index)
    own = -(-(len(files) - index) // num_shards)
    if training:
        paths = paths.shuffle(own, reshuffle_each_iteration=True).repeat()
    buffer_size = GCS_READ_BUFFER_BYTES if files[0].startswith("gs://") else None
    size = chunk_records(spec)
    return paths.interleave(
        lambda path: tf.data.TFRecordDataset(path, buffer_size=buffer_size).batch(size),
        cycle_length=min(own, MAX_PARALLEL_FILES),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)


def chunk_records(spec: ModelSpec) -> int:
    """Records per chunk: about `CHUNK_BYTES` of pixels, at least one record."""
    return max(1, min(MAX_CHUNK_RECORDS, CHUNK_BYTES // _pixels(spec)))


def chunks_to_batches(chunks: tf.data.Dataset, spec: ModelSpec,
                      batch_size: int) -> tf.data.Dataset:
    """(images, labels) batches of `batch_size`: windows of whole batches parsed at once,
    each batch gathered from its window in a random order."""
    window = window_batches(spec, batch_size)

    def batches_of(images: tf.Tensor, labels: tf.Tensor, order: tf.Tensor) -> tf.data.Dataset:
        # Gathering each batch straight from the window copies the pixels once; a
        # shuffled copy of the whole window, then unbatched, copied them twice.
        return tf.data.Dataset.from_tensor_slices(order).map(
            lambda picks: _packed(tf.gather(images, picks), tf.gather(labels, picks)))

    batches = (chunks.rebatch(window * batch_size, drop_remainder=True)
               .map(lambda serialized: parse_window(serialized, spec, window),
                    num_parallel_calls=tf.data.AUTOTUNE)
               .flat_map(batches_of)
               .prefetch(tf.data.AUTOTUNE))
    return batches.with_options(pipeline_options())


def window_batches(spec: ModelSpec, batch_size: int) -> int:
    """How many batches one shuffle window holds (at least one)."""
    records = min(MAX_SHUFFLE_WINDOW_RECORDS, SHUFFLE_WINDOW_BYTES // _pixels(spec))
    return max(1, records // batch_size)


def parse_window(serialized: tf.Tensor, spec: ModelSpec,
                 batches: int) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """A window of records parsed, as uint8 images [N, H, W, C] and labels [N], and a
    random split of its N indices into `batches` batches [batches, N / batches]."""
    images, labels = _decode(serialized, spec)
    order = tf.random.shuffle(tf.range(tf.shape(labels)[0]))
    return images, labels, tf.reshape(order, [batches, -1])


def parse_batch(serialized: tf.Tensor, spec: ModelSpec) -> tuple[tf.Tensor, tf.Tensor]:
    """A batch of serialized Examples as float32 pixels [B, H, W, C] and int32 labels [B]."""
    images, labels = _decode(serialized, spec)
    return tf.cast(images, tf.float32), labels


def pack_pixels(images: tf.Tensor) -> tf.Tensor:
    """uint8 images [B, H, W, C] as int32 words [B, ceil(H * W * C / 4)], four pixels each."""
    pixels = images.shape[1:].num_elements()
    flat = tf.reshape(images, [-1, pixels])
    words = -(-pixels // PIXELS_PER_WORD)
    if words * PIXELS_PER_WORD > pixels:
        flat = tf.pad(flat, [[0, 0], [0, words * PIXELS_PER_WORD - pixels]])
    return tf.bitcast(tf.reshape(flat, [-1, words, PIXELS_PER_WORD]), tf.int32)


def model_pixels(images: tf.Tensor, spec: ModelSpec) -> tf.Tensor:
    """What the model takes, float32 [B, H, W, C], from a batch's pixels: this pipeline's
    packed words, unpacked where the step runs (on the TPU), or pixels of any number type
    (a `dataset_fn` passed to `train.run`)."""
    if images.dtype != tf.int32 or images.shape.rank != 2:
        return tf.cast(images, tf.float32)
    shifts = tf.constant(_BYTE_SHIFTS, tf.int32)
    pixels = tf.bitwise.bitwise_and(tf.bitwise.right_shift(images[..., tf.newaxis], shifts), 0xFF)
    pixels = tf.reshape(pixels, [-1, images.shape[-1] * PIXELS_PER_WORD])[:, :_pixels(spec)]
    return tf.cast(tf.reshape(pixels, [-1, *spec.image_shape]), tf.float32)


def _decode(serialized: tf.Tensor, spec: ModelSpec) -> tuple[tf.Tensor, tf.Tensor]:
    parsed = tf.io.parse_example(serialized, _FEATURES)
    # fixed_length keeps the batch's shape static, which TPUs need.
    pixels = tf.io.decode_raw(parsed["image"], tf.uint8, fixed_length=_pixels(spec))
    return tf.reshape(pixels, [-1, *spec.image_shape]), tf.cast(parsed["label"], tf.int32)


def _packed(images: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    return pack_pixels(images), labels


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
