"""A synthetic, learnable TFRecord dataset in the job's record schema (see `data`).

Every class has a fixed random prototype image; an example is its class's
prototype blended with noise, so labels follow the inputs and a model can learn
them. Files are sharded like a real dataset (`train-00000-of-00016.tfrecord`),
nothing is downloaded, and the same seed writes the same bytes.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tpu_training.models import ModelSpec
from tpu_training.tf_env import tf

PROTOTYPE_WEIGHT = 0.6  # the rest of each pixel is noise
CHUNK_EXAMPLES = 256


@dataclasses.dataclass(frozen=True)
class SynthResult:
    pattern: str
    files: list[str]
    examples: int


def shard_name(prefix: str, index: int, shards: int) -> str:
    return f"{prefix}-{index:05d}-of-{shards:05d}.tfrecord"


def write_dataset(out_dir: str, spec: ModelSpec, *, examples: int = 4096, shards: int = 16,
                  prefix: str = "train", seed: int = 0) -> SynthResult:
    """Write `examples` records for `spec` round-robin into `shards` files under `out_dir`."""
    tf.io.gfile.makedirs(out_dir)
    files = [f"{out_dir.rstrip('/')}/{shard_name(prefix, i, shards)}" for i in range(shards)]
    rng = np.random.default_rng(seed)
    prototypes = rng.integers(0, 256, size=(spec.num_classes, *spec.image_shape))
    writers = [tf.io.TFRecordWriter(path) for path in files]
    try:
        for start in range(0, examples, CHUNK_EXAMPLES):
            count = min(CHUNK_EXAMPLES, examples - start)
            for offset, record in enumerate(_records(rng, prototypes, count)):
                writers[(start + offset) % shards].write(record)
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
