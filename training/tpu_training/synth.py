"""A synthetic, learnable TFRecord dataset in either of the job's record formats (`data`).

Raw: every class has a fixed random prototype image; an example is its class's
prototype blended with noise, so labels follow the inputs and a model can learn
them. ImageNet: JPEG photos of varied sizes, each its class's colour blended with
noise, in exactly the schema of tensorflow/tpu `tools/datasets/imagenet_to_gcs.py`
(labels from 1) plus one bounding box, as ILSVRC's training records carry; a colour
survives the random crops and flips of training. BERT: sequence pairs in the schema of
google-research/bert `create_pretraining_data.py` (`tpu_training.bert_data`), masked
as it masks them, from a language a model can learn (`_bert_records`). Files are sharded like a real
dataset (`train-00000-of-00016.tfrecord`), nothing is downloaded, and the same seed
writes the same records.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tpu_training.bert import BertSpec
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


def write_dataset(out_dir: str, spec: ModelSpec | BertSpec, *, examples: int = 4096,
                  shards: int = 16, prefix: str = "train", seed: int = 0,
                  record_format: str = "raw") -> SynthResult:
    """Write `examples` records for `spec` round-robin into `shards` files under `out_dir`."""
    tf.io.gfile.makedirs(out_dir)
    files = [f"{out_dir.rstrip('/')}/{shard_name(prefix, i, shards)}" for i in range(shards)]
    rng = np.random.default_rng(seed)
    if isinstance(spec, BertSpec):
        # One language per vocabulary, whatever the seed: an eval set written with
        # another seed speaks the training set's language.
        language = BertLanguage.draw(np.random.default_rng(LANGUAGE_SEED), spec.vocab_size)
        chunks = (_bert_records(rng, language, spec, min(CHUNK_EXAMPLES, examples - start))
                  for start in range(0, examples, CHUNK_EXAMPLES))
    elif record_format == "imagenet":
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


# ---- BERT ------------------------------------------------------------------------------
# The special tokens of BERT's uncased WordPiece vocabulary (vocab.txt): [PAD] 0, [UNK]
# 100, [CLS] 101, [SEP] 102, [MASK] 103; words follow.
PAD_ID, CLS_ID, SEP_ID, MASK_ID = 0, 101, 102, 103
FIRST_WORD_ID = 104
MIN_BERT_VOCAB = 128
# create_pretraining_data.py: masked_lm_prob 0.15; of the masked tokens 80% become
# [MASK], 10% a random word, 10% stay; short_seq_prob 0.1; next sentence random half
# the time.
MASKED_LM_PROB = 0.15
SHORT_SEQ_PROB = 0.1
TOPIC_WORDS = 4  # each topic a cycle of this many words
LANGUAGE_SEED = 0


@dataclasses.dataclass(frozen=True)
class BertLanguage:
    """Topics, each a cycle of TOPIC_WORDS words: a sentence walks its topic's cycle, the
    next sentence continues it and a random one walks another topic's. A masked word
    follows from its neighbours, the next-sentence label from the two topics."""

    topics: np.ndarray  # [topics, TOPIC_WORDS] word ids
    vocab_size: int

    @classmethod
    def draw(cls, rng: np.random.Generator, vocab_size: int) -> BertLanguage:
        words = rng.permutation(np.arange(FIRST_WORD_ID, vocab_size))
        count = len(words) // TOPIC_WORDS
        return cls(words[:count * TOPIC_WORDS].reshape(count, TOPIC_WORDS), vocab_size)

    def sentence(self, rng: np.random.Generator, topic: int, start: int, length: int
                 ) -> list[int]:
        cycle = self.topics[topic]
        return [int(cycle[(start + i) % TOPIC_WORDS]) for i in range(length)]


def _bert_records(rng: np.random.Generator, language: BertLanguage, spec: BertSpec,
                  count: int):
    for _ in range(count):
        yield bert_example_bytes(*_bert_instance(rng, language, spec), spec)


def _bert_instance(rng: np.random.Generator, language: BertLanguage, spec: BertSpec):
    """One instance as create_pretraining_data.py builds it: [CLS] A [SEP] B [SEP], its
    segments, masked positions and labels, and the next-sentence label (1: random)."""
    room = spec.seq_length - 3
    total = room if rng.random() >= SHORT_SEQ_PROB else int(rng.integers(2, room + 1))
    length_a = int(rng.integers(1, total)) if total > 1 else 1
    length_b = max(1, total - length_a)
    topic, start = int(rng.integers(len(language.topics))), int(rng.integers(TOPIC_WORDS))
    random_next = bool(rng.random() < 0.5)
    first = language.sentence(rng, topic, start, length_a)
    if random_next:
        other = (topic + int(rng.integers(1, len(language.topics)))) % len(language.topics)
        second = language.sentence(rng, other, int(rng.integers(TOPIC_WORDS)), length_b)
    else:
        second = language.sentence(rng, topic, start + length_a, length_b)
    tokens = [CLS_ID, *first, SEP_ID, *second, SEP_ID][:spec.seq_length]
    segments = ([0] * (length_a + 2) + [1] * (length_b + 1))[:spec.seq_length]
    candidates = [i for i, token in enumerate(tokens) if token not in (CLS_ID, SEP_ID)]
    picks = min(spec.max_predictions, max(1, round(len(tokens) * MASKED_LM_PROB)))
    positions = sorted(int(i) for i in rng.choice(candidates, size=min(picks, len(candidates)),
                                                  replace=False))
    labels = [tokens[i] for i in positions]
    for i in positions:
        roll = rng.random()
        if roll < 0.8:
            tokens[i] = MASK_ID
        elif roll < 0.9:
            tokens[i] = int(rng.integers(FIRST_WORD_ID, language.vocab_size))
    return tokens, segments, positions, labels, int(random_next)


def bert_example_bytes(tokens: list[int], segments: list[int], positions: list[int],
                       labels: list[int], next_sentence: int, spec: BertSpec) -> bytes:
    """One record as create_pretraining_data.py's write_instance_to_example_files writes
    it: padded with 0 to maxSeqLength and maxPredictionsPerSeq, weights 1.0 on real
    predictions."""
    def ints(values: list[int], length: int) -> tf.train.Feature:
        padded = list(values) + [0] * (length - len(values))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=padded))

    sequence, predictions = spec.seq_length, spec.max_predictions
    weights = [1.0] * len(positions) + [0.0] * (predictions - len(positions))
    features = tf.train.Features(feature={
        "input_ids": ints(tokens, sequence),
        "input_mask": ints([1] * len(tokens), sequence),
        "segment_ids": ints(segments, sequence),
        "masked_lm_positions": ints(positions, predictions),
        "masked_lm_ids": ints(labels, predictions),
        "masked_lm_weights": tf.train.Feature(float_list=tf.train.FloatList(value=weights)),
        "next_sentence_labels": ints([next_sentence], 1),
    })
    return tf.train.Example(features=features).SerializeToString()
