"""Published BERT checkpoints: a tensorflow/models BertEncoderV2 checkpoint and a
google-research/bert TF1 checkpoint, both of random weights, converted by
`convert-checkpoint`, give tensorflow/models' own encoder's outputs; `initCheckpoint`
starts a job from one; a checkpoint that does not fit is one exit-65 error naming it.

The reference is tf-models-official 2.18.0 (installed with --no-deps beside
tensorflow-cpu, with gin-config and scipy, which official.nlp.modeling imports):
its BertEncoderV2 for the TF2 checkpoint, and for the TF1 one its own converter
(official/nlp/tools/tf2_bert_encoder_checkpoint_converter.py) into its BertEncoder.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from tpu_training import __main__ as cli
from tpu_training import bert_checkpoint, exits, models, synth, train
from tpu_training.config import JobConfig, JobConfigError
from tpu_training.tf_env import keras, tf


@pytest.fixture(autouse=True, scope="module")
def _replicas_first(strategy):
    """The CPU split into replicas before this file's first TensorFlow op (conftest.py),
    so a test file after it in the same process can still make the strategy."""


LAYERS, HIDDEN, HEADS, VOCAB = 2, 128, 2, 256  # bert_tiny's layers and width
INPUT_NAMES = ("input_word_ids", "input_mask", "input_type_ids")


def official():
    """tensorflow/models' NLP modeling library, the reference. A plain import: where it is
    missing the test fails naming it (scripts/setup.sh checks it imports in both training
    environments, so a missing dependency of it stops setup first)."""
    import official.nlp.modeling

    return official.nlp.modeling


def randomise(variables, seed: int) -> None:
    """Every weight random (biases and LayerNorm too), so a misplaced one shows."""
    rng = np.random.default_rng(seed)
    for variable in variables:
        scale = 0.5 if "gamma" in variable.name else 0.05
        centre = 1.0 if "gamma" in variable.name else 0.0
        variable.assign(rng.normal(centre, scale, variable.shape).astype(np.float32))


def sample_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    ids = rng.integers(1, VOCAB, size=(3, 11)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[0, 8:] = 0
    mask[2, 5:] = 0
    types = np.zeros_like(ids)
    types[:, 6:] = 1
    return {"input_word_ids": ids, "input_mask": mask, "input_type_ids": types}


def converted_outputs(source: str, out: str) -> dict[str, np.ndarray]:
    assert cli.main(["convert-checkpoint", source, "--model", "bert_tiny", "--out", out]) == 0
    encoder = tf.saved_model.load(out)
    outputs = encoder({k: tf.constant(v) for k, v in sample_inputs().items()}, training=False)
    return {key: outputs[key].numpy() for key in ("pooled_output", "sequence_output")}


def assert_close(ours: dict, theirs: dict) -> None:
    for key in ("pooled_output", "sequence_output"):
        np.testing.assert_allclose(ours[key], theirs[key], atol=1e-4, rtol=0, err_msg=key)
    assert np.abs(theirs["sequence_output"]).max() > 0.1  # not trivially equal


def test_a_model_garden_bert_encoder_v2_checkpoint_converts_to_its_outputs(tmp_path):
    nlp = official()
    keras.mixed_precision.set_global_policy("float32")
    encoder = nlp.networks.BertEncoderV2(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=LAYERS, num_attention_heads=HEADS,
        intermediate_size=4 * HIDDEN, max_sequence_length=512, type_vocab_size=2)
    encoder({k: tf.constant(v) for k, v in sample_inputs().items()})
    randomise(encoder.variables, seed=1)
    source = tf.train.Checkpoint(encoder=encoder).save(str(tmp_path / "tf2" / "ckpt"))
    theirs = encoder({k: tf.constant(v) for k, v in sample_inputs().items()}, training=False)
    ours = converted_outputs(source, str(tmp_path / "export"))
    assert_close(ours, {key: theirs[key].numpy() for key in ours})


def write_tf1_checkpoint(path: str, seed: int, *, extra: dict | None = None,
                         drop: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """A google-research/bert pre-training checkpoint: its variables named as modeling.py
    and run_pretraining.py name them, Adam's slots and global_step beside them."""
    rng = np.random.default_rng(seed)
    shape = bert_checkpoint.Shape(LAYERS, HIDDEN, VOCAB)
    values = {}
    for name, dims in bert_checkpoint.published_shapes(shape).items():
        centre = 1.0 if name.endswith("gamma") else 0.0
        values[name] = rng.normal(centre, 0.5 if centre else 0.05, dims).astype(np.float32)
    values = {name: value for name, value in values.items() if name not in drop}
    values.update(extra or {})
    with tf.Graph().as_default():
        variables = [tf.compat.v1.get_variable(name, initializer=value)
                     for name, value in values.items()]
        variables.append(tf.compat.v1.get_variable(
            "bert/pooler/dense/kernel/adam_m", initializer=np.zeros((HIDDEN, HIDDEN), np.float32)))
        variables.append(tf.compat.v1.train.get_or_create_global_step())
        saver = tf.compat.v1.train.Saver(variables)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, path)
    return values


def test_a_google_research_tf1_checkpoint_converts_to_model_gardens_outputs(tmp_path):
    official()
    from official.legacy.bert import configs
    from official.nlp.tools import tf2_bert_encoder_checkpoint_converter as converter

    keras.mixed_precision.set_global_policy("float32")
    source = str(tmp_path / "tf1" / "bert_model.ckpt")
    write_tf1_checkpoint(source, seed=2)
    # tensorflow/models' own conversion of it, into its own encoder.
    config = configs.BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                num_attention_heads=HEADS, intermediate_size=4 * HIDDEN,
                                hidden_act="gelu", max_position_embeddings=512,
                                type_vocab_size=2)
    reference = str(tmp_path / "reference" / "ckpt")
    converter.convert_checkpoint(config, reference, source, checkpoint_model_name="encoder",
                                 converted_model="encoder")
    encoder = converter._create_bert_model(config)
    tf.train.Checkpoint(encoder=encoder).read(
        tf.train.latest_checkpoint(str(tmp_path / "reference"))).assert_existing_objects_matched()
    inputs = sample_inputs()
    sequence, pooled = encoder([tf.constant(inputs[name]) for name in INPUT_NAMES],
                               training=False)[:2]
    ours = converted_outputs(source, str(tmp_path / "export"))
    assert_close(ours, {"pooled_output": pooled.numpy(), "sequence_output": sequence.numpy()})


def test_a_checkpoint_that_does_not_fit_is_one_exit_65_message(tmp_path, capsys):
    source = str(tmp_path / "tf1" / "bert_model.ckpt")
    write_tf1_checkpoint(source, seed=3,
                         drop=("bert/encoder/layer_1/output/dense/bias",),
                         extra={"output_weights": np.zeros((2, HIDDEN), np.float32)})
    code = cli.main(["convert-checkpoint", source, "--model", "bert_tiny",
                     "--out", str(tmp_path / "export")])
    lines = capsys.readouterr().err.splitlines()
    assert code == exits.EXIT_DATA == 65
    (line,) = lines
    assert line.startswith("tpu_training: error: SRC: a google-research/bert (TF1) checkpoint")
    assert "missing bert/encoder/layer_1/output/dense/bias" in line
    assert "unmapped (the model has no place for) output_weights" in line
    # A size that is not the checkpoint's: every mis-shaped variable is named with both shapes.
    code = cli.main(["convert-checkpoint", source, "--model", "bert_mini",
                     "--out", str(tmp_path / "export")])
    assert code == 65
    assert (f"bert/embeddings/word_embeddings [{VOCAB}, 128] (the model needs [{VOCAB}, 256])"
            in capsys.readouterr().err)


def test_names_of_both_layouts_map_to_the_tf1_names():
    shape = bert_checkpoint.Shape(2, 128, 96)
    prefix = "model/encoder_network/"
    value = "/.ATTRIBUTES/VARIABLE_VALUE"
    names = {f"{prefix}_transformer_layers/1/_attention_layer/_key_dense/kernel{value}":
             (128, 2, 64),
             f"{prefix}_type_embedding_layer/embeddings{value}": (2, 128),
             f"{prefix}_embedding_layer/embeddings{value}": (96, 128),
             "model/masked_lm/embedding_table/.ATTRIBUTES/VARIABLE_VALUE": (96, 128),
             "model/masked_lm/output_bias.Sbias/.ATTRIBUTES/VARIABLE_VALUE": (96,),
             "optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE": (),
             "save_counter/.ATTRIBUTES/VARIABLE_VALUE": ()}
    assert bert_checkpoint.checkpoint_format(names) == "tf2"
    mapped = bert_checkpoint.map_names(names, "tf2")
    assert mapped.unmapped == ()
    assert mapped.sources == {
        "bert/encoder/layer_1/attention/self/key/kernel":
            (f"{prefix}_transformer_layers/1/_attention_layer/_key_dense/kernel{value}",
             "heads_in"),
        "bert/embeddings/token_type_embeddings":
            (f"{prefix}_type_embedding_layer/embeddings{value}", "same"),
        "bert/embeddings/word_embeddings": (f"{prefix}_embedding_layer/embeddings{value}",
                                            "same"),
        "cls/predictions/output_bias":
            ("model/masked_lm/output_bias.Sbias/.ATTRIBUTES/VARIABLE_VALUE", "same")}
    assert bert_checkpoint.vocab_size(names) == 96
    assert bert_checkpoint.source_shape((128, 128), "heads_out", shape) == (2, 64, 128)
    assert bert_checkpoint.checkpoint_format(["dense/kernel", "global_step"]) is None
    with pytest.raises(JobConfigError, match="is not a google-research/bert"):
        bert_checkpoint.plan({"dense/kernel": (2, 2)}, shape, source="initCheckpoint")


# ---- initCheckpoint: a job starts from it ------------------------------------------------

JOB = {"model": "bert_tiny", "globalBatchSize": 8, "trainSteps": 1, "stepsPerExecution": 1,
       "checkpointEverySteps": 1, "checkpointEveryMinutes": 60, "learningRate": 1e-9,
       "maxSeqLength": 16, "maxPredictionsPerSeq": 2, "vocabSize": VOCAB}


def test_init_checkpoint_starts_a_fresh_job_from_the_published_weights(strategy, tmp_path):
    spec = models.model_spec(JobConfig.from_dict({**JOB, "trainData": "x"}, resolved=False))
    data_dir = tmp_path / "data"
    synth.write_dataset(str(data_dir), spec, examples=32, shards=1)
    source = str(tmp_path / "tf1" / "bert_model.ckpt")
    values = write_tf1_checkpoint(source, seed=4)
    root = tmp_path / "job"
    config = JobConfig.from_dict({
        **JOB, "trainData": f"{data_dir}/train-*", "initCheckpoint": source,
        "checkpointDir": f"{root}/ckpt", "exportDir": f"{root}/export",
        "tensorboardDir": f"{root}/tb"})
    out = io.StringIO()
    assert train.run(config, strategy=strategy, out=out).outcome is train.Outcome.FINISHED
    lines = out.getvalue().splitlines()
    (initialised,) = [line for line in lines if " initialised_from=" in line]
    assert initialised == f"tpu_training initialised_from={source} format=tf1 variables=" \
                          f"{5 + 12 * LAYERS + 2 + 7}"
    assert lines.index(initialised) < lines.index("tpu_training resumed_from=0")
    # The recipe, once, at start (the job's learningRate is the peak as given).
    recipes = [line for line in lines if line.startswith("tpu_training recipe ")]
    assert recipes == ["tpu_training recipe optimizer=adamw peak_learning_rate=1e-09 "
                       "warmup_steps=0 decay=linear clip_norm=1 weight_decay=0.01"]
    assert lines.index(recipes[0]) < lines.index(initialised)
    # The export carries the published weights (a learning rate of 1e-9 moves them by less).
    exported = tf.saved_model.load(config.exportDir)
    words = next(v for v in exported.variables if "word_embeddings" in v.name)
    np.testing.assert_allclose(words.numpy(), values["bert/embeddings/word_embeddings"],
                               atol=1e-5)
    # Once the job has a checkpoint of its own, it restores that and reads no other.
    rerun = train.Job(config, spec, strategy, out := io.StringIO())
    assert rerun._restore() == 1
    assert out.getvalue() == ""


def test_init_checkpoint_is_a_bert_key_resolved_in_the_data_bucket():
    stack = JobConfig.from_dict({**JOB, "trainData": "d/*", "initCheckpoint":
                                 "bert/uncased_L-2_H-128_A-2/bert_model.ckpt"}, resolved=False)
    node = stack.resolve(data_root="gs://data", checkpoint_dir="gs://c/", export_dir="gs://e/",
                         tensorboard_dir="gs://t/")
    assert node.initCheckpoint == "gs://data/bert/uncased_L-2_H-128_A-2/bert_model.ckpt"
    with pytest.raises(JobConfigError) as error:
        JobConfig.from_dict({"model": "mnist_cnn", "trainData": "d/*", "globalBatchSize": 8,
                             "trainSteps": 10, "stepsPerExecution": 10,
                             "initCheckpoint": "bert/ckpt"}, resolved=False)
    assert dict(error.value.problems)["initCheckpoint"].startswith("applies to BERT models")
    with pytest.raises(JobConfigError, match="initCheckpoint: 's3://x/ckpt': the s3: scheme"):
        JobConfig.from_dict({**JOB, "trainData": "d/*", "initCheckpoint": "s3://x/ckpt"},
                            resolved=False)


def test_convert_checkpoint_is_on_the_command_line(capsys):
    with pytest.raises(SystemExit):
        cli.main(["convert-checkpoint", "--help"])
    assert "--model {bert_tiny," in capsys.readouterr().out
