"""A synthetic, learnable TFRecord dataset in either of the job's record formats (`data`).

Raw: every class has a fixed random prototype image; an example is its class's
prototype blended with noise, so labels follow the inputs and a model can learn
them. ImageNet: JPEG photos of varied sizes, each its class's colour blended with
noise, in exactly the schema of tensorflow/tpu `tools/datasets/imagenet_to_gcs.py`
(labels from 1) plus one bounding box, as ILSVRC's training records carry; a colour
survives the random crops and flips of training. Files are sharded like a real
dataset (`train-00000-of-00016.tfrecord`), nothing is downloaded, and the same seed
writes the same records.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tpu_training.models import ModelSpec
from tpu_training.tf_env import tf

PROTOTYPE_WEIGHT = 0.6  # the rest of each pixel is noise
CHUNK_EXAMPLES = 256
# ImageNet photos: each side drawn from this range times imageSize (ILSVRC's vary
# around 400 x 350 for a 224 crop).
IMAGENET_SIDE_RANGE = (0.75, 2.0)
JPEG_QUALITY = 90


@dataclasses.dataclass(frozen=True)
class SynthResult:
    pattern: str
    files: list[str]
    examples: int


def shard_name(prefix: str, index: int, shards: int) -> str:
    return f"{prefix}-{index:05d}-of-{shards:05d}.tfrecord"


def write_dataset(out_dir: str, spec: ModelSpec, *, examples: int = 4096, shards: int = 16,
                  prefix: str = "train", seed: int = 0,
                  record_format: str = "raw") -> SynthResult:
    """Write `examples` records for `spec` round-robin into `shards` files under `out_dir`."""
    tf.io.gfile.makedirs(out_dir)
    files = [f"{out_dir.rstrip('/')}/{shard_name(prefix, i, shards)}" for i in range(shards)]
    rng = np.random.default_rng(seed)
    if record_format == "imagenet":
        colours = rng.integers(0, 256, size=(spec.num_classes, 3))
        chunks = (_imagenet_records(rng, colours, spec, start, min(CHUNK_EXAMPLES,
                                                                   examples - start))
                  for start in range(0, examples, CHUNK_EXAMPLES))
    else:
        prototypes = rng.integers(0, 256, size=(spec.num_classes, *spec.image_shape))
        chunks = (_records(rng, prototypes, min(CHUNK_EXAMPLES, examples - start))
                  for start in range(0, examples, CHUNK_EXAMPLES))
    writers = [tf.io.TFRecordWriter(path) for path in files]
    try:
        index = 0
        for chunk in chunks:
            for record in chunk:
                writers[index % shards].write(record)
                index += 1
    finally:
        for writer in writers:
            writer.close()
    return SynthResult(f"{out_dir.rstrip('/')}/{prefix}-*.tfrecord", files, examples)


def _records(rng: np.random.Generator, prototypes: np.ndarray, count: int):
    labels = rng.integers(0, len(prototypes), size=count)
    noise = rng.integers(0, 256, size=(count, *prototypes.shape[1:]))
    images = (PROTOTYPE_WEIGHT * prototypes[labels] + (1 - PROTOTYPE_WEIGHT) * noise)
    for image, label in zip(images.astype(np.uint8), labels, strict=True):
        yield example_bytes(image, int(label))


def example_bytes(image: np.ndarray, label: int) -> bytes:
    """One record of the job's schema."""
    features = tf.train.Features(feature={
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    })
    return tf.train.Example(features=features).SerializeToString()


def _imagenet_records(rng: np.random.Generator, colours: np.ndarray, spec: ModelSpec,
                      start: int, count: int):
    low, high = (round(spec.image_shape[0] * side) for side in IMAGENET_SIDE_RANGE)
    for index in range(start, start + count):
        label = int(rng.integers(0, len(colours)))
        height, width = (int(side) for side in rng.integers(low, high + 1, size=2))
        noise = rng.integers(0, 256, size=(height, width, 3))
        image = (PROTOTYPE_WEIGHT * colours[label] + (1 - PROTOTYPE_WEIGHT) * noise)
        jpeg = tf.io.encode_jpeg(image.astype(np.uint8), quality=JPEG_QUALITY).numpy()
        # The object: half the photo's side or more, anywhere: [[ymin, ymax], [xmin, xmax]].
        sides = rng.uniform(0.5, 1, size=2)
        starts = rng.uniform(0, 1 - sides)
        box = np.stack([starts, starts + sides], axis=1)
        yield imagenet_example_bytes(jpeg, label + 1, height, width, box, f"synth_{index:08d}")


def imagenet_example_bytes(jpeg: bytes, label: int, height: int, width: int,
                           box: np.ndarray, name: str) -> bytes:
    """One record in imagenet_to_gcs.py's schema (`label` from 1), with one bounding box
    [[ymin, ymax], [xmin, xmax]] in the fields tensorflow/models' ResNet input reads."""
    def ints(value: int) -> tf.train.Feature:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    def text(value: bytes) -> tf.train.Feature:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    def floats(value: float) -> tf.train.Feature:
        return tf.train.Feature(float_list=tf.train.FloatList(value=[value]))

    synset = f"n{label:08d}".encode()
    features = tf.train.Features(feature={
        "image/height": ints(height), "image/width": ints(width),
        "image/colorspace": text(b"RGB"), "image/channels": ints(3),
        "image/class/label": ints(label), "image/class/synset": text(synset),
        "image/format": text(b"JPEG"), "image/filename": text(f"{name}.JPEG".encode()),
        "image/encoded": text(jpeg),
        "image/object/bbox/ymin": floats(box[0][0]), "image/object/bbox/ymax": floats(box[0][1]),
        "image/object/bbox/xmin": floats(box[1][0]), "image/object/bbox/xmax": floats(box[1][1]),
        "image/object/bbox/label": ints(label),
    })
    return tf.train.Example(features=features).SerializeToString()
