"""`recordFormat: bert_pretraining`: the records google-research/bert writes.

One `tf.train.Example` per sequence pair, as `create_pretraining_data.py`
(write_instance_to_example_files) writes it and tensorflow/models
`official/nlp/data/pretrain_dataloader.py` (BertPretrainDataLoader, v1 feature names)
reads it:

| feature | type | length |
| --- | --- | --- |
| `input_ids` | int64 | maxSeqLength (0-padded) |
| `input_mask` | int64 | maxSeqLength (1 on tokens, 0 on padding) |
| `segment_ids` | int64 | maxSeqLength (0 first sentence, 1 second) |
| `masked_lm_positions` | int64 | maxPredictionsPerSeq (0-padded) |
| `masked_lm_ids` | int64 | maxPredictionsPerSeq (the original tokens; 0-padded) |
| `masked_lm_weights` | float | maxPredictionsPerSeq (1.0 real, 0.0 padding) |
| `next_sentence_labels` | int64 | 1 (0: B follows A, 1: B is random) |

A window of records is parsed at once (`tf.io.parse_example`, one op for the whole
window rather than one per record as BertPretrainDataLoader does) and int64 becomes
int32 (TPUs take no int64; the loader does the same). A record whose feature is
missing or of another length than the job's is one error naming the feature (exit 65):
the first record is checked before training, a later one when parsing fails.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from tpu_training.bert import BertSpec
from tpu_training.exits import RecordsError
from tpu_training.tf_env import tf

SEQUENCE_FEATURES = ("input_ids", "input_mask", "segment_ids")
PREDICTION_FEATURES = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
LABEL_FEATURE = "next_sentence_labels"
FEATURES = (*SEQUENCE_FEATURES, *PREDICTION_FEATURES, LABEL_FEATURE)
# A record's bytes, for chunks and windows: about 3 bytes a token id (varints below 2^21),
# 1 a mask or segment value, 4 a weight, and the Example's framing per feature.
FRAMING_BYTES = 40


def parse_spec(spec: BertSpec) -> dict[str, tf.io.FixedLenFeature]:
    lengths = {**dict.fromkeys(SEQUENCE_FEATURES, spec.seq_length),
               **dict.fromkeys(PREDICTION_FEATURES, spec.max_predictions), LABEL_FEATURE: 1}
    return {name: tf.io.FixedLenFeature(
        [length], tf.float32 if name == "masked_lm_weights" else tf.int64)
        for name, length in lengths.items()}


def record_bytes(spec: BertSpec) -> int:
    return (spec.seq_length * 5 + spec.max_predictions * 8 + 8) + FRAMING_BYTES * len(FEATURES)


def model_features(parsed: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """The parsed features under the names the model and the losses take, int32."""
    renamed = {"input_word_ids": parsed["input_ids"], "input_mask": parsed["input_mask"],
               "input_type_ids": parsed["segment_ids"],
               "masked_lm_positions": parsed["masked_lm_positions"],
               "masked_lm_ids": parsed["masked_lm_ids"],
               "masked_lm_weights": parsed["masked_lm_weights"],
               "next_sentence_labels": parsed[LABEL_FEATURE][..., 0]}
    return {name: tf.cast(value, tf.int32) if value.dtype == tf.int64 else value
            for name, value in renamed.items()}


def parse_batch(serialized: tf.Tensor, spec: BertSpec) -> dict[str, tf.Tensor]:
    return model_features(tf.io.parse_example(serialized, parse_spec(spec)))


def batches(windows: tf.data.Dataset, spec: BertSpec, batch_size: int, seed: int,
            skipped: Callable, window_order: Callable) -> tf.data.Dataset:
    """Batches of model features (1-tuples of a dict): each window parsed at once, each
    batch gathered from it in the window's order."""

    def parse(epoch, index, serialized):
        order = window_order(tf.shape(serialized)[0], batch_size, seed, epoch, index,
                             skipped(epoch, index))
        return parse_batch(serialized, spec), order

    def batches_of(features: dict[str, tf.Tensor], order: tf.Tensor) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices(order).map(
            lambda picks: ({name: tf.gather(value, picks) for name, value in features.items()},))

    return (windows.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            .flat_map(batches_of))


def eval_batches(chunks: tf.data.Dataset, spec: BertSpec, batch_size: int) -> tf.data.Dataset:
    return (chunks.rebatch(batch_size, drop_remainder=True)
            .map(lambda serialized: (parse_batch(serialized, spec),),
                 num_parallel_calls=tf.data.AUTOTUNE))


def check_record(features, path: str, spec: BertSpec, key: str) -> None:
    """One record's features against the job: present, of the job's lengths, ids in the
    vocabulary, positions in the sequence."""
    lengths = parse_spec(spec)
    for name, feature in lengths.items():
        kind = "float_list" if feature.dtype == tf.float32 else "int64_list"
        if name not in features:
            raise RecordsError.single(key, f"records in {path} have no '{name}' feature; "
                                           f"bert_pretraining records hold {', '.join(FEATURES)} "
                                           "(create_pretraining_data.py)")
        values = getattr(features[name], kind).value
        if len(values) != feature.shape[0]:
            raise RecordsError.single(key, _length_message(name, len(values), path, spec))
    ids = [*features["input_ids"].int64_list.value, *features["masked_lm_ids"].int64_list.value]
    if max(ids) >= spec.vocab_size or min(ids) < 0:
        raise RecordsError.single(key, f"records in {path} hold token ids up to {max(ids)} in "
                                       f"'input_ids'/'masked_lm_ids'; vocabSize is "
                                       f"{spec.vocab_size}")
    positions = features["masked_lm_positions"].int64_list.value
    if max(positions) >= spec.seq_length or min(positions) < 0:
        raise RecordsError.single(key, f"records in {path} have 'masked_lm_positions' up to "
                                       f"{max(positions)}, outside maxSeqLength "
                                       f"({spec.seq_length})")


def _length_message(name: str, length: int | None, where: str, spec: BertSpec) -> str:
    setting, expected = (("maxPredictionsPerSeq", spec.max_predictions)
                         if name in PREDICTION_FEATURES else
                         ("maxSeqLength", spec.seq_length) if name in SEQUENCE_FEATURES
                         else ("one label", 1))
    held = "" if length is None else f"{length} values of "
    longer = "longer than" if length is not None and length > expected else "not of"
    return (f"records in {where} hold {held}'{name}', {longer} {setting} ({expected}); "
            f"write the records with the job's {setting} or set it to theirs")


# What tf.io.parse_example says of a record that does not fit the spec
# (tensorflow/core/util/example_proto_fast_parsing.cc): "Key: <name>, Index: 0.
# Number of int64 values != expected. Values size: 130 but output shape: [128]", and
# "Feature: <name> (data type: int64) is required but could not be found."
_PARSE_ERROR = re.compile(r"(?:Key|Feature): (\w+)[ ,.(].*?(?:Values size: (\d+))?",
                          re.DOTALL)
_PARSE_SIGNS = ("Values size:", "is required but could not be found", "Can't parse serialized")


def records_error(error: tf.errors.OpError, spec: BertSpec, key: str) -> RecordsError | None:
    """The RecordsError naming the feature of a parse failure met while training, or None
    when `error` is no such failure."""
    message = error.message or ""
    match = _PARSE_ERROR.search(message)
    if not any(sign in message for sign in _PARSE_SIGNS) or not match or \
            match[1] not in FEATURES:
        return None
    name = match[1]
    if "could not be found" in message:
        return RecordsError.single(key, f"a record has no '{name}' feature; bert_pretraining "
                                        f"records hold {', '.join(FEATURES)}")
    size = re.search(r"Values size: (\d+)", message)
    return RecordsError.single(key, _length_message(
        name, int(size[1]) if size else None, "a record", spec))
