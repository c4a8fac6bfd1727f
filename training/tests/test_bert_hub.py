"""The BERT export is a TF Hub Transformer encoder: `hub.load(path)(inputs)` gives the four
outputs, `hub.KerasLayer(path, trainable=True)` fine-tunes in a small Keras model, and
`serving_default` is TF Hub's BERT signature (tensorflow.org/hub/common_saved_model_apis/
text, "Transformer encoders")."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from tpu_training import bert, models
from tpu_training.config import JobConfig
from tpu_training.tf_env import keras, tf

# The reference, installed by scripts/setup.sh (which checks it imports): imported, never
# skipped, so a missing one fails naming it; after tf_env, which picks Keras 2 first.
hub = importlib.import_module("tensorflow_hub")


@pytest.fixture(autouse=True, scope="module")
def _replicas_first(strategy):
    """The CPU split into replicas before this file's first TensorFlow op (conftest.py),
    so a test file after it in the same process can still make the strategy."""


SHAPE = {"maxSeqLength": 16, "maxPredictionsPerSeq": 2, "vocabSize": 64}
JOB = {"model": "bert_tiny", "trainData": "x", "globalBatchSize": 8, "trainSteps": 10,
       "stepsPerExecution": 1, "checkpointEverySteps": 1, **SHAPE}


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> str:
    keras.mixed_precision.set_global_policy("float32")
    spec = models.model_spec(JobConfig.from_dict(JOB, resolved=False))
    task = bert.BertTask(spec)
    directory = str(tmp_path_factory.mktemp("hub") / "export")
    task.export(task.build_model(), directory)
    return directory


def encoder_inputs(batch: int, length: int, seed: int = 0) -> dict[str, tf.Tensor]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, SHAPE["vocabSize"], size=(batch, length)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[:, length - 2:] = 0
    return {"input_word_ids": tf.constant(ids), "input_mask": tf.constant(mask),
            "input_type_ids": tf.constant((np.arange(length) >= length // 2).astype(np.int32)
                                          * np.ones_like(ids))}


def test_the_loaded_root_is_callable_and_returns_the_four_outputs(export):
    encoder = hub.load(export)
    for batch, length in ((2, 7), (3, 12)):  # dynamic batch and length
        outputs = encoder(encoder_inputs(batch, length), training=False)
        assert set(outputs) == {"pooled_output", "sequence_output", "default",
                                "encoder_outputs"}
        assert outputs["pooled_output"].shape == (batch, 128)
        assert outputs["sequence_output"].shape == (batch, length, 128)
        np.testing.assert_array_equal(outputs["default"], outputs["pooled_output"])
        assert len(outputs["encoder_outputs"]) == 2  # one per layer of bert_tiny
        np.testing.assert_array_equal(outputs["encoder_outputs"][-1],
                                      outputs["sequence_output"])
    assert len(encoder.trainable_variables) > 0
    assert len(encoder.variables) >= len(encoder.trainable_variables)
    # Dropout is on only when training.
    inputs = encoder_inputs(2, 7)
    eval_a, eval_b = (encoder(inputs, training=False)["sequence_output"] for _ in range(2))
    np.testing.assert_array_equal(eval_a, eval_b)
    trained = encoder(inputs, training=True)["sequence_output"]
    assert not np.allclose(trained, eval_a)


def test_serving_default_is_unchanged(export):
    serve = tf.saved_model.load(export).signatures["serving_default"]
    _, inputs = serve.structured_input_signature
    assert {name: (spec.dtype, spec.shape.as_list()) for name, spec in inputs.items()} == {
        name: (tf.int32, [None, None]) for name in bert.ENCODER_INPUTS}
    given = encoder_inputs(2, 7)
    outputs = serve(**given)
    assert set(outputs) == {"pooled_output", "sequence_output"}
    called = hub.load(export)(given, training=False)
    np.testing.assert_allclose(outputs["pooled_output"], called["pooled_output"], atol=1e-6)


def test_a_trainable_keras_layer_fine_tunes_in_a_small_model(export):
    layer = hub.KerasLayer(export, trainable=True)
    inputs = {name: keras.Input(shape=(None,), dtype=tf.int32, name=name)
              for name in bert.ENCODER_INPUTS}
    pooled = layer(inputs)["pooled_output"]
    classifier = keras.Model(inputs, keras.layers.Dense(2)(pooled))
    classifier.compile(keras.optimizers.Adam(1e-3),
                       keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    given = encoder_inputs(16, 8, seed=1)
    labels = (given["input_word_ids"].numpy()[:, 1] % 2).astype(np.int32)  # learnable
    word_embeddings = next(v for v in layer.trainable_variables
                           if "word_embeddings" in v.name)
    before = word_embeddings.numpy().copy()
    history = classifier.fit(given, labels, epochs=15, batch_size=16, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.5 * losses[0]
    assert not np.allclose(word_embeddings.numpy(), before)  # the encoder itself trained
    assert len(layer.trainable_weights) == len(hub.load(export).trainable_variables)
