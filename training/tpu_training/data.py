"""The input pipeline: sharded TFRecords from GCS or a local path, per replica.

Two record formats (the job key `recordFormat`), one `tf.train.Example` per image:

`raw` (the default), the package's own:

| feature | type | content |
| --- | --- | --- |
| `image` | bytes | raw uint8 pixels, row-major height x width x channels |
| `label` | int64 | the class, 0 <= label < numClasses |

- `mnist_cnn`: 28 x 28 x 1 pixels (784 bytes), labels 0-9 unless `numClasses` says otherwise.
- `resnet18`, `resnet50`: imageSize x imageSize x 3 pixels (RGB; imageSize defaults to
  224, so 150528 bytes), labels below `numClasses` (default 1000).

`imagenet`, the ImageNet TFRecords of tensorflow/tpu `tools/datasets/imagenet_to_gcs.py`
(what Cloud TPU's ResNet tutorial and Google's `fake_imagenet` use), resnet models only:
`image/encoded` (JPEG bytes) and `image/class/label` (int64, 1 to numClasses: the
script numbers the sorted synsets from 1, `k + 1`) are read; `image/object/bbox/{ymin,
xmin,ymax,xmax}` (floats in [0, 1], any number of boxes) guide the training crop;
`image/height`, `image/width`, `image/channels`, `image/colorspace`, `image/format`,
`image/filename`, `image/class/synset` are carried but not needed. Labels leave the
pipeline less one, in [0, numClasses), as tensorflow/models' ResNet input does
(`official/legacy/image_classification/resnet/imagenet_preprocessing.py`, parse_record:
"Subtract one so that labels are in [0, 1000)"). Images get that file's ResNet
preprocessing: training, the JPEG decoded fused with an Inception-style random crop
(`sample_distorted_bounding_box` over the boxes, then `decode_and_crop_jpeg`), a random
left-right flip, a bilinear resize to imageSize x imageSize; evaluation, a decode, an
aspect-preserving resize of the short side to imageSize * 256 / 224, a centre crop. The
mean subtraction is left out: the models rescale pixels themselves (`models`). JPEGs
are decoded on the host, in parallel across tf.data's threads (Cloud TPU performance
guide, "Model is input bound"; tensorflow.org/guide/data_performance, "Parallelizing
data transformation").

`bert_pretraining`, google-research/bert's pre-training Examples, BERT models only:
`tpu_training.bert_data`, which this pipeline's windows and batches carry.

`python -m tpu_training synth [--format imagenet]` writes either image format, and
`synth --model bert_tiny` BERT records.

The pipeline follows the Cloud TPU input guidance (docs/tpu-facts.md, "tf.data on
TPU"): files are listed once, sharded per input pipeline, read `interleave`d in
parallel in chunks of records; a window of whole per-replica batches is permuted at
once and split into batches (`drop_remainder=True`); batches are prefetched.

Training order is a pure function of (seed, epoch, position): an epoch visits this
pipeline's files in an order drawn from (seed, epoch) and permutes each window with
(seed, epoch, window), so the stream of batches never depends on timing, and a job
resumed at step N starts at batch N x (replicas per pipeline) of it
(`EpochInput.starting_at`): after a stop that saved at step N no example of the epoch
is repeated or skipped, after a kill at most the steps since the last checkpoint are
replayed. Each epoch ends with its last whole batch (at most a batch less one record is
left out, the same records every epoch).

To find the epoch a step falls in, a resume needs the number of records of its files.
They are kept in an index, `record_counts.json` in the job's checkpointDir (`RecordIndex`,
per file): a fresh start counts its files in a background thread while it trains, a
resume reads the index and counts only files it does not list (once). So a resume reads
the index and the records of the current epoch up to where it starts, not every file.

Raw pixels leave the pipeline packed four to an int32 word; `models.model_pixels` unpacks them
in the training step, on the device.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import struct
import sys
import threading
from collections.abc import Callable

from tpu_training import bert_data
from tpu_training.bert import BertSpec
from tpu_training.config import JobConfigError
from tpu_training.exits import NoDataError, RecordsError
from tpu_training.models import PIXELS_PER_WORD, ModelSpec
from tpu_training.tf_env import tf

DatasetFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]

# 8 MiB read buffer per GCS file, as Cloud TPU's ResNet ImageNet input does
# (tensorflow/tpu, imagenet_input.py). Local files keep TF's default: allocating
# 8 MiB per opened file slows small local shards (bench/input_pipeline.py).
GCS_READ_BUFFER_BYTES = 8 * 1024 * 1024
MAX_PARALLEL_FILES = 16
# Counting records reads files in pieces this big and walks the records' framing.
COUNT_READ_BYTES = 8 * 1024 * 1024
RECORD_HEADER_BYTES, RECORD_FOOTER_BYTES = 12, 4
# Records travel through tf.data in chunks read from one file, about this many bytes:
# tf.data's cost per element, paid per record, is most of the cost of reading small
# records (bench/input_pipeline.py).
CHUNK_BYTES = 1024 * 1024
MAX_CHUNK_RECORDS = 256
# Shuffling: a window of whole batches is permuted at once, at most this many bytes of
# records; a per-record shuffle buffer costs about as much as reading the record
# (bench/input_pipeline.py).
SHUFFLE_WINDOW_BYTES = 256 * 1024 * 1024
MAX_SHUFFLE_WINDOW_RECORDS = 8192
# What an ImageNet record weighs, for chunks and windows: ILSVRC-2012's 1.28 M training
# JPEGs fill 1024 shards of about 140 MB (tensorflow/tpu imagenet_to_gcs.py), ~110 KiB each.
IMAGENET_RECORD_BYTES = 128 * 1024
# The seed of every job's order: runs of one job must agree, jobs need not differ.
ORDER_SEED = 0
# tf.data's autotuner may use half of the available RAM by default
# (tf.data.experimental.AutotuneOptions.ram_budget); the job leaves room for the rest.
RAM_BUDGET_FRACTION = 0.25

_FEATURES = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64),
}
IMAGENET_IMAGE, IMAGENET_LABEL = "image/encoded", "image/class/label"
_BOX_KEYS = ("image/object/bbox/ymin", "image/object/bbox/xmin",
             "image/object/bbox/ymax", "image/object/bbox/xmax")
_IMAGENET_FEATURES = {
    IMAGENET_IMAGE: tf.io.FixedLenFeature([], tf.string),
    IMAGENET_LABEL: tf.io.FixedLenFeature([], tf.int64),
    **{key: tf.io.VarLenFeature(tf.float32) for key in _BOX_KEYS},
}
# tensorflow/models imagenet_preprocessing.py: _decode_crop_and_flip and _RESIZE_MIN.
CROP_MIN_OBJECT_COVERED = 0.1
CROP_ASPECT_RATIO_RANGE = (0.75, 1.33)
CROP_AREA_RANGE = (0.05, 1.0)
CROP_MAX_ATTEMPTS = 100
EVAL_RESIZE_RATIO = 256 / 224


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


def check_records(files: list[str], spec: ModelSpec, *, key: str = "trainData",
                  record_format: str = "raw") -> None:
    """Read the first record and check it against `record_format` and `spec`'s model."""
    try:
        first = next(iter(tf.data.TFRecordDataset(files[:1]).take(1)), None)
    except tf.errors.UnavailableError:
        raise
    except tf.errors.OpError as error:
        raise RecordsError.single(
            key, f"{files[0]} is not a TFRecord file: {error.message}") from error
    if first is None:
        raise RecordsError.single(key, f"{files[0]} holds no records")
    try:
        example = tf.train.Example.FromString(first.numpy())
    except Exception as error:  # the protobuf runtime's DecodeError has no stable home
        raise RecordsError.single(
            key, f"{files[0]} holds records that are not tf.train.Examples") from error
    features = example.features.feature
    if record_format == "bert_pretraining":
        bert_data.check_record(features, files[0], spec, key)
    elif record_format == "imagenet":
        _check_imagenet(features, files[0], spec, key)
    else:
        _check_raw(features, files[0], spec, key)


def _check_raw(features, path: str, spec: ModelSpec, key: str) -> None:
    missing = [name for name in _FEATURES if name not in features]
    if missing:
        hint = ("; these are imagenet records: set recordFormat: imagenet"
                if IMAGENET_IMAGE in features else "")
        raise RecordsError.single(
            key, f"records in {path} have no {_names(missing)} feature; raw records hold "
                 f"'image' (uint8 pixels) and 'label' (int64){hint}")
    expected = spec.pixel_count
    actual = len(features["image"].bytes_list.value[0]) if features["image"].bytes_list.value \
        else 0
    if actual != expected:
        shape = "x".join(map(str, spec.image_shape))
        raise RecordsError.single(
            key, f"records in {path} hold {actual}-byte images; {spec.name} reads "
                 f"{shape} = {expected} bytes (see imageSize)")


def _check_imagenet(features, path: str, spec: ModelSpec, key: str) -> None:
    for name, kind in ((IMAGENET_IMAGE, "bytes_list"), (IMAGENET_LABEL, "int64_list")):
        if name not in features or len(getattr(features[name], kind).value) != 1:
            hint = ("; these are raw records: leave recordFormat raw"
                    if "image" in features else "")
            raise RecordsError.single(
                key, f"records in {path} have no '{name}' feature ({kind}, one value); "
                     f"recordFormat imagenet reads '{IMAGENET_IMAGE}' (JPEG bytes) and "
                     f"'{IMAGENET_LABEL}' (1 to numClasses){hint}")
    label = features[IMAGENET_LABEL].int64_list.value[0]
    if not 1 <= label <= spec.num_classes:
        raise RecordsError.single(
            key, f"records in {path} have {IMAGENET_LABEL} {label}; imagenet labels run from "
                 f"1 to numClasses ({spec.num_classes})")
    try:
        tf.io.extract_jpeg_shape(features[IMAGENET_IMAGE].bytes_list.value[0])
    except tf.errors.OpError as error:
        raise RecordsError.single(
            key, f"records in {path} hold an '{IMAGENET_IMAGE}' that is not a JPEG: "
                 f"{error.message}") from error


def make_dataset_fn(files: list[str], spec: ModelSpec, global_batch_size: int,
                    *, training: bool = True, record_format: str = "raw",
                    index: RecordIndex | None = None) -> EpochInput:
    """The `distribute_datasets_from_function` input: per-replica batches.

    Training: epochs in a fixed order, forever (see `EpochInput`), the files' record
    counts kept in `index`. Evaluation (`training=False`): one pass, the last partial
    batch dropped (TPUs need static shapes).
    """
    if isinstance(spec, BertSpec):  # BERT reads one format only
        record_format = "bert_pretraining"
    return EpochInput(tuple(files), spec, global_batch_size, training, record_format,
                      index=index)


def starting_at(dataset_fn: DatasetFn, step: int) -> DatasetFn:
    """`dataset_fn` resumed at `step`, when it is an `EpochInput`; others restart."""
    return dataset_fn.starting_at(step) if isinstance(dataset_fn, EpochInput) else dataset_fn


@dataclasses.dataclass(frozen=True)
class EpochInput:
    """A `DatasetFn` whose training stream is a pure function of (seed, epoch, position)."""

    files: tuple[str, ...]
    spec: ModelSpec
    global_batch_size: int
    training: bool = True
    record_format: str = "raw"
    start_step: int = 0
    seed: int = ORDER_SEED
    index: RecordIndex | None = None  # None: a resume counts the records of its files

    @property
    def key(self) -> str:
        return "trainData" if self.training else "evalData"

    def starting_at(self, step: int) -> EpochInput:
        return dataclasses.replace(self, start_step=step)

    def __call__(self, context: tf.distribute.InputContext) -> tf.data.Dataset:
        if len(self.files) < context.num_input_pipelines:
            raise JobConfigError.single(
                self.key, f"{len(self.files)} files for {context.num_input_pipelines} input "
                          "pipelines; write at least one shard per host")
        batch_size = context.get_per_replica_batch_size(self.global_batch_size)
        own = list(self.files[context.input_pipeline_id::context.num_input_pipelines])
        if not self.training:
            return self._eval_batches(own, batch_size)
        self._check_one_batch(own, batch_size)
        replicas_here = context.num_replicas_in_sync // context.num_input_pipelines
        return self.batches(own, batch_size, self.start_step * replicas_here)

    def batches(self, files: list[str], batch_size: int, skip: int = 0) -> tf.data.Dataset:
        """The training stream of `files` in batches of `batch_size`, from batch `skip`."""
        window = window_batches(self.spec, batch_size, self.record_format)
        per_epoch = 1
        if skip:
            records = self.index.records(files) if self.index else count_records(files)
            per_epoch = records // batch_size
        elif self.index:
            self.index.count_in_background(files)
        start_epoch, in_epoch = divmod(skip, per_epoch)
        first_window, first_batch = divmod(in_epoch, window)
        windows = epoch_windows(files, self.spec, batch_size, self.record_format, self.seed,
                                start_epoch, first_window)

        def skipped(epoch: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
            first = tf.logical_and(tf.equal(epoch, start_epoch), tf.equal(index, first_window))
            return tf.where(first, tf.constant(first_batch, tf.int64), tf.constant(0, tf.int64))

        if self.record_format == "bert_pretraining":
            batches = bert_data.batches(windows, self.spec, batch_size, self.seed, skipped,
                                        window_order)
        elif self.record_format == "imagenet":
            batches = imagenet_batches(windows, self.spec, batch_size, self.seed, skipped)
        else:
            batches = raw_batches(windows, self.spec, batch_size, self.seed, skipped)
        return batches.prefetch(tf.data.AUTOTUNE).with_options(pipeline_options())

    def _eval_batches(self, files: list[str], batch_size: int) -> tf.data.Dataset:
        chunks = read_chunks(files, self.spec, training=False, record_format=self.record_format)
        if self.record_format == "bert_pretraining":
            batches = bert_data.eval_batches(chunks, self.spec, batch_size)
        elif self.record_format == "imagenet":
            batches = (chunks.unbatch()
                       .map(lambda record: parse_imagenet(record, self.spec, training=False),
                            num_parallel_calls=tf.data.AUTOTUNE)
                       .batch(batch_size, drop_remainder=True)
                       .map(_packed))
        else:
            batches = (chunks.rebatch(batch_size, drop_remainder=True)
                       .map(lambda serialized: _packed(*_decode(serialized, self.spec)),
                            num_parallel_calls=tf.data.AUTOTUNE))
        return batches.prefetch(tf.data.AUTOTUNE).with_options(pipeline_options())

    def _check_one_batch(self, files: list[str], batch_size: int) -> None:
        # An epoch without a whole batch would loop over the files forever.
        held = int(tf.data.TFRecordDataset(files).take(batch_size).reduce(
            tf.constant(0, tf.int64), lambda count, _: count + 1))
        if held < batch_size:
            raise RecordsError.single(
                self.key, f"an input pipeline's {len(files)} files hold {held} records, fewer "
                          f"than one per-replica batch ({batch_size}); write more records")


def count_records(files: list[str]) -> int:
    """How many records `files` hold (read, not parsed: one pass over them)."""
    return sum(count_each(files).values())


def count_each(files: list[str]) -> dict[str, int]:
    """The records of each of `files`, read (not parsed) in parallel."""
    with concurrent.futures.ThreadPoolExecutor(min(len(files), MAX_PARALLEL_FILES)) as pool:
        return dict(zip(files, pool.map(records_in, files), strict=True))


def records_in(path: str) -> int:
    """How many records the TFRecord file `path` holds, from its framing alone (each
    record: uint64 length, uint32 CRC of it, the data, uint32 CRC of the data;
    tensorflow.org/tutorials/load_data/tfrecord, "TFRecord files in Python").

    Plain reads through tf.io.gfile, no TensorFlow op: it may run in a thread beside
    training (tf.data ops started in a thread while the strategy built its input
    iterator failed under TF 2.20 with OutOfRangeError).
    """
    count, header, skip = 0, b"", 0
    with tf.io.gfile.GFile(path, "rb") as file:
        while chunk := file.read(COUNT_READ_BYTES):
            at = 0
            while at < len(chunk):
                if skip:
                    passed = min(skip, len(chunk) - at)
                    at, skip = at + passed, skip - passed
                    continue
                piece = chunk[at:at + RECORD_HEADER_BYTES - len(header)]
                header, at = header + piece, at + len(piece)
                if len(header) == RECORD_HEADER_BYTES:
                    (length,) = struct.unpack("<Q", header[:8])
                    count, header, skip = count + 1, b"", length + RECORD_FOOTER_BYTES
    return count


@dataclasses.dataclass(frozen=True)
class RecordIndex:
    """The record counts of data files, kept as JSON in `directory` (the checkpointDir):
    written once, so a resume reads it instead of every file."""

    directory: str
    NAME = "record_counts.json"
    _lock = threading.Lock()  # the pipelines of one process share the file

    @property
    def path(self) -> str:
        return self.directory.rstrip("/") + "/" + self.NAME

    def records(self, files: list[str]) -> int:
        """How many records `files` hold: from the index, counting (once) what it lacks."""
        with self._lock:
            known = self._read()
            missing = [path for path in files if path not in known]
            if missing:
                known = {**known, **count_each(missing)}
                self._write(known)
        return sum(known[path] for path in files)

    def count_in_background(self, files: list[str]) -> threading.Thread | None:
        """Count what the index lacks in a thread (a fresh start, while it trains)."""
        with self._lock:
            if all(path in self._read() for path in files):
                return None
        thread = threading.Thread(target=self.records, args=(files,), daemon=True,
                                  name="record-index")
        thread.start()
        return thread

    def _read(self) -> dict[str, int]:
        try:
            with tf.io.gfile.GFile(self.path) as file:
                counts = json.load(file)["counts"]
        except (tf.errors.NotFoundError, ValueError, KeyError, TypeError):
            return {}  # absent, or torn by a kill: counted again
        return {str(path): int(count) for path, count in counts.items()}

    def _write(self, counts: dict[str, int]) -> None:
        tf.io.gfile.makedirs(self.directory)
        partial = f"{self.path}.partial"
        with tf.io.gfile.GFile(partial, "w") as file:
            json.dump({"counts": counts}, file, sort_keys=True)
        tf.io.gfile.rename(partial, self.path, overwrite=True)


def epoch_windows(files: list[str], spec: ModelSpec, batch_size: int, record_format: str,
                  seed: int, start_epoch: int = 0, first_window: int = 0) -> tf.data.Dataset:
    """(epoch, window index, serialized records) for every window of every epoch from
    `start_epoch` (its windows from `first_window`); windows hold `window_batches`
    batches of records, an epoch's last window what is left."""
    paths = tf.constant(files)
    size = chunk_records(spec, record_format)
    records = window_batches(spec, batch_size, record_format) * batch_size
    buffer_size = GCS_READ_BUFFER_BYTES if files[0].startswith("gs://") else None

    def epoch(number: tf.Tensor) -> tf.data.Dataset:
        order = tf.random.experimental.stateless_shuffle(paths, _seed(seed, number))
        chunks = tf.data.Dataset.from_tensor_slices(order).interleave(
            lambda path: tf.data.TFRecordDataset(path, buffer_size=buffer_size).batch(size),
            cycle_length=min(len(files), MAX_PARALLEL_FILES),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        skip = tf.where(tf.equal(number, start_epoch), tf.constant(first_window, tf.int64),
                        tf.constant(0, tf.int64))
        windows = chunks.rebatch(records, drop_remainder=False).skip(skip)
        return windows.enumerate(start=skip).map(lambda index, window: (number, index, window))

    return tf.data.Dataset.range(start_epoch, sys.maxsize).flat_map(epoch)


def window_order(count: tf.Tensor, batch_size: int, seed: int, epoch: tf.Tensor,
                 index: tf.Tensor, skip: tf.Tensor) -> tf.Tensor:
    """A window's record indices permuted by (seed, epoch, index), as [batches, batch_size]
    for its whole batches, the first `skip` batches left out."""
    shuffled = tf.random.experimental.stateless_shuffle(tf.range(count),
                                                        _seed(seed, epoch, index))
    batches = count // batch_size
    order = tf.reshape(shuffled[:batches * batch_size], [batches, batch_size])
    return order[skip:]


def raw_batches(windows: tf.data.Dataset, spec: ModelSpec, batch_size: int, seed: int,
                skipped: Callable) -> tf.data.Dataset:
    """Packed raw batches: each window parsed at once, each batch gathered from it."""

    def parse(epoch, index, serialized):
        images, labels = _decode(serialized, spec)
        order = window_order(tf.shape(labels)[0], batch_size, seed, epoch, index,
                             skipped(epoch, index))
        return images, labels, order

    def batches_of(images: tf.Tensor, labels: tf.Tensor, order: tf.Tensor) -> tf.data.Dataset:
        # Gathering each batch straight from the window copies the pixels once; a
        # shuffled copy of the whole window, then unbatched, copied them twice.
        return tf.data.Dataset.from_tensor_slices(order).map(
            lambda picks: _packed(tf.gather(images, picks), tf.gather(labels, picks)))

    return (windows.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            .flat_map(batches_of))


def imagenet_batches(windows: tf.data.Dataset, spec: ModelSpec, batch_size: int, seed: int,
                     skipped: Callable) -> tf.data.Dataset:
    """Packed batches of ImageNet records: each window's records permuted, then decoded
    and preprocessed one by one in parallel."""

    def permuted(epoch, index, serialized):
        order = window_order(tf.shape(serialized)[0], batch_size, seed, epoch, index,
                             skipped(epoch, index))
        return tf.gather(serialized, tf.reshape(order, [-1]))

    return (windows.map(permuted).unbatch()
            .map(lambda record: parse_imagenet(record, spec, training=True),
                 num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            .batch(batch_size, drop_remainder=True)
            .map(_packed))


def parse_imagenet(serialized: tf.Tensor, spec: ModelSpec,
                   *, training: bool) -> tuple[tf.Tensor, tf.Tensor]:
    """One ImageNet Example as uint8 pixels `spec.image_shape` and its int32 label, from 0."""
    parsed = tf.io.parse_single_example(serialized, _IMAGENET_FEATURES)
    height, width, channels = spec.image_shape
    jpeg = parsed[IMAGENET_IMAGE]
    if training:
        boxes = tf.stack([parsed[key].values for key in _BOX_KEYS], axis=-1)[tf.newaxis]
        image = _decode_crop_and_flip(jpeg, boxes, channels)
        image = tf.image.resize(image, [height, width], method="bilinear")
    else:
        image = tf.image.decode_jpeg(jpeg, channels=channels)
        image = _aspect_preserving_resize(image, round(min(height, width) * EVAL_RESIZE_RATIO))
        image = _central_crop(image, height, width)
    # Back to uint8 (rounded): a quarter of the bytes to pack and send.
    image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
    image = tf.ensure_shape(image, spec.image_shape)
    return image, tf.cast(parsed[IMAGENET_LABEL], tf.int32) - 1


def _decode_crop_and_flip(jpeg: tf.Tensor, boxes: tf.Tensor, channels: int) -> tf.Tensor:
    """tensorflow/models imagenet_preprocessing.py, _decode_crop_and_flip: the fused
    decode-and-crop op decodes only the sampled window."""
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        tf.image.extract_jpeg_shape(jpeg), bounding_boxes=boxes,
        min_object_covered=CROP_MIN_OBJECT_COVERED, aspect_ratio_range=CROP_ASPECT_RATIO_RANGE,
        area_range=CROP_AREA_RANGE, max_attempts=CROP_MAX_ATTEMPTS,
        use_image_if_no_bounding_boxes=True)
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    cropped = tf.image.decode_and_crop_jpeg(jpeg, window, channels=channels)
    return tf.image.random_flip_left_right(cropped)


def _aspect_preserving_resize(image: tf.Tensor, short_side: int) -> tf.Tensor:
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    scale = short_side / tf.reduce_min(shape)
    # At least `short_side` on both sides, whatever the rounding, so the crop fits.
    size = tf.maximum(tf.cast(shape * scale, tf.int32), short_side)
    return tf.image.resize(image, size, method="bilinear")


def _central_crop(image: tf.Tensor, height: int, width: int) -> tf.Tensor:
    shape = tf.shape(image)
    top, left = (shape[0] - height) // 2, (shape[1] - width) // 2
    return tf.slice(image, [top, left, 0], [height, width, -1])


def read_chunks(files: list[str], spec: ModelSpec, num_shards: int = 1, index: int = 0,
                *, training: bool = True, record_format: str = "raw") -> tf.data.Dataset:
    """Serialized records of this pipeline's share of `files`, as vectors of up to
    `chunk_records` records from one file; for training, files are shuffled and
    repeated (the bench's floor; the job's training stream is `epoch_windows`)."""
    paths = tf.data.Dataset.from_tensor_slices(files).shard(num_shards, index)
    own = -(-(len(files) - index) // num_shards)
    if training:
        paths = paths.shuffle(own, reshuffle_each_iteration=True).repeat()
    buffer_size = GCS_READ_BUFFER_BYTES if files[0].startswith("gs://") else None
    size = chunk_records(spec, record_format)
    return paths.interleave(
        lambda path: tf.data.TFRecordDataset(path, buffer_size=buffer_size).batch(size),
        cycle_length=min(own, MAX_PARALLEL_FILES),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)


def chunk_records(spec: ModelSpec, record_format: str = "raw") -> int:
    """Records per chunk: about `CHUNK_BYTES` of records, at least one record."""
    return max(1, min(MAX_CHUNK_RECORDS, CHUNK_BYTES // _record_bytes(spec, record_format)))


def window_batches(spec: ModelSpec, batch_size: int, record_format: str = "raw") -> int:
    """How many batches one shuffle window holds (at least one)."""
    records = min(MAX_SHUFFLE_WINDOW_RECORDS,
                  SHUFFLE_WINDOW_BYTES // _record_bytes(spec, record_format))
    return max(1, records // batch_size)


def parse_batch(serialized: tf.Tensor, spec: ModelSpec) -> tuple[tf.Tensor, tf.Tensor]:
    """A batch of serialized raw Examples as float32 pixels [B, H, W, C] and int32 labels."""
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


def _decode(serialized: tf.Tensor, spec: ModelSpec) -> tuple[tf.Tensor, tf.Tensor]:
    parsed = tf.io.parse_example(serialized, _FEATURES)
    # fixed_length keeps the batch's shape static, which TPUs need.
    pixels = tf.io.decode_raw(parsed["image"], tf.uint8, fixed_length=spec.pixel_count)
    return tf.reshape(pixels, [-1, *spec.image_shape]), tf.cast(parsed["label"], tf.int32)


def _packed(images: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    return pack_pixels(images), labels


def _seed(*parts) -> tf.Tensor:
    """A stateless RNG seed (two int64s) from the job seed and stream coordinates."""
    mixed = tf.constant(0, tf.int64)
    for part in parts[1:]:
        mixed = mixed * 1_000_003 + tf.cast(part, tf.int64)
    return tf.stack([tf.constant(parts[0], tf.int64), mixed])


def pipeline_options() -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = True  # the order is part of the resume contract
    options.autotune.enabled = True
    options.autotune.ram_budget = int(_physical_memory() * RAM_BUDGET_FRACTION)
    return options


def _record_bytes(spec: ModelSpec | BertSpec, record_format: str) -> int:
    if record_format == "bert_pretraining":
        return bert_data.record_bytes(spec)
    return IMAGENET_RECORD_BYTES if record_format == "imagenet" else spec.pixel_count



def _names(names: list[str]) -> str:
    return " or ".join(f"'{name}'" for name in names)


def _physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
