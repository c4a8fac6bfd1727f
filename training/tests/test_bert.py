"""BERT pre-training: bert_tiny on synthetic records learns, evaluates, exports a serving
encoder, saves on SIGTERM and resumes in the epoch; a bad record is one error; the
schema's size tables match the real models."""

from __future__ import annotations

import io
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_preemption import Job

from tpu_training import bert, bert_data, data, exits, models, synth, train
from tpu_training import config as schema
from tpu_training.config import JobConfig, JobConfigError
from tpu_training.tf_env import keras, tf

# bert_tiny (2 layers, hidden 128) on short sequences and a small vocabulary: a 2-core
# machine trains it in seconds. The schema's defaults (128, 20, 30522) are BERT's.
SHAPE = {"maxSeqLength": 64, "maxPredictionsPerSeq": 10, "vocabSize": 256}
CHANCE = 1 / SHAPE["vocabSize"]
# learningRate is a BERT job's peak as is (config.recipe).
BERT_JOB = {"model": "bert_tiny", "globalBatchSize": 32, "trainSteps": 100,
            "stepsPerExecution": 10, "checkpointEverySteps": 50, "learningRate": 0.0035,
            "warmupSteps": 10, "checkpointEveryMinutes": 60, **SHAPE}
EVAL_LINE = re.compile(r"tpu_training eval_accuracy=(\d\.\d{6}) eval_loss=(\d+\.\d{6}) "
                       r"eval_nsp_accuracy=(\d\.\d{6})")


def spec_of(**overrides) -> bert.BertSpec:
    config = JobConfig.from_dict({**BERT_JOB, "trainData": "x", **overrides}, resolved=False)
    return models.model_spec(config)


@pytest.fixture(scope="module")
def bert_data_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bert")
    synth.write_dataset(str(out), spec_of(), examples=1024, shards=4)
    synth.write_dataset(str(out), spec_of(), examples=256, shards=2, prefix="eval", seed=1)
    return out


def resolved(root: Path | str, data_dir: Path, **overrides) -> dict:
    root = str(root).rstrip("/")
    return {**BERT_JOB, "trainData": f"{data_dir}/train-*.tfrecord",
            "checkpointDir": f"{root}/ckpt", "exportDir": f"{root}/export",
            "tensorboardDir": f"{root}/tb", **overrides}


@pytest.fixture(scope="module")
def finished(strategy, bert_data_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("bert-job")
    config = JobConfig.from_dict(resolved(root, bert_data_dir,
                                          evalData=f"{bert_data_dir}/eval-*.tfrecord"))
    out = io.StringIO()
    result = train.run(config, strategy=strategy, out=out)
    return config, result, out.getvalue().splitlines()


def test_bert_tiny_learns_both_tasks(finished):
    _, result, lines = finished
    assert result.outcome is train.Outcome.FINISHED
    # At start: ln(vocab) for the masked words plus ln(2) for the next sentence.
    assert result.losses[0] > 0.9 * (np.log(SHAPE["vocabSize"]) + np.log(2))
    assert np.mean(result.losses[-2:]) < 0.75 * result.losses[0]
    (match,) = filter(None, map(EVAL_LINE.fullmatch, lines))
    accuracy, loss, nsp = map(float, match.groups())
    assert accuracy > 20 * CHANCE  # masked-LM accuracy, many times chance
    assert loss < result.losses[0]
    assert 0 <= nsp <= 1


def test_the_eval_line_comes_before_the_completion(finished):
    config, _, lines = finished
    progress = [line for line in lines if not line.startswith(("tpu_training saved ",
                                                               "tpu_training goodput "))]
    assert EVAL_LINE.fullmatch(progress[-2])
    assert progress[-1] == f"tpu_training complete=100 export={config.exportDir}"
    marker = json.loads(Path(config.exportDir, train.COMPLETE_MARKER).read_text())
    assert set(marker) >= {"eval_accuracy", "eval_loss", "eval_nsp_accuracy"}


def test_the_export_serves_the_encoder_convention(finished):
    config, _, _ = finished
    serve = tf.saved_model.load(config.exportDir).signatures["serving_default"]
    _, inputs = serve.structured_input_signature
    assert {name: (spec.dtype, spec.shape.as_list()) for name, spec in inputs.items()} == {
        name: (tf.int32, [None, None])
        for name in ("input_word_ids", "input_mask", "input_type_ids")}
    ids = tf.constant([[synth.CLS_ID, 200, 201, synth.SEP_ID, 0, 0]], tf.int32)
    mask = tf.cast(ids > 0, tf.int32)
    outputs = serve(input_word_ids=ids, input_mask=mask, input_type_ids=tf.zeros_like(ids))
    assert set(outputs) == {"pooled_output", "sequence_output"}
    assert outputs["pooled_output"].shape == (1, 128)
    assert outputs["sequence_output"].shape == (1, 6, 128)
    assert outputs["sequence_output"].dtype == tf.float32
    # Padding is masked out: what follows the real tokens does not change them.
    other = tf.constant([[synth.CLS_ID, 200, 201, synth.SEP_ID, 7, 9]], tf.int32)
    again = serve(input_word_ids=other, input_mask=mask, input_type_ids=tf.zeros_like(ids))
    np.testing.assert_allclose(again["sequence_output"][:, :4], outputs["sequence_output"][:, :4],
                               atol=1e-5)


def test_the_tpu_precision_path_trains_in_bfloat16_and_exports_float32(
        strategy, bert_data_dir, tmp_path, monkeypatch):
    """mixed_bfloat16 as on a TPU, run on the CPU replicas (oneDNN has bfloat16 kernels)."""
    monkeypatch.setattr(train, "precision_policy", lambda _strategy: "mixed_bfloat16")
    config = JobConfig.from_dict(resolved(tmp_path, bert_data_dir, trainSteps=10))
    seen = {}
    build = bert.build_pretrainer

    def observed(spec):
        model = build(spec)
        seen["dtype"] = model.encoder.get_layer("transformer_layer_0").qkv.compute_dtype
        return model

    monkeypatch.setattr(bert, "build_pretrainer", observed)
    result = train.run(config, strategy=strategy, out=io.StringIO())
    assert result.outcome is train.Outcome.FINISHED and all(np.isfinite(result.losses))
    assert seen["dtype"] == "bfloat16"
    serve = tf.saved_model.load(config.exportDir).signatures["serving_default"]
    ids = tf.constant([[synth.CLS_ID, 200, synth.SEP_ID]], tf.int32)
    outputs = serve(input_word_ids=ids, input_mask=tf.ones_like(ids),
                    input_type_ids=tf.zeros_like(ids))
    assert outputs["pooled_output"].dtype == tf.float32


def test_the_checkpoint_table_matches_the_checkpoint_written(finished):
    config, _, lines = finished
    written = [int(re.search(r" bytes=(\d+) ", line)[1]) for line in lines
               if line.startswith("tpu_training saved ")]
    assert written and schema.checkpoint_bytes(config) == pytest.approx(written[-1], rel=0.01)


def test_the_parameter_count_is_the_models(strategy):
    for name in ("bert_tiny", "bert_mini"):
        config = JobConfig.from_dict({**BERT_JOB, "model": name, "trainData": "x"},
                                     resolved=False)
        model = bert.build_pretrainer(models.model_spec(config))
        assert model.count_params() == schema.bert_parameters(config)


# Published parameter counts: BERT-Base 110M, BERT-Large 340M (Devlin et al. 2018,
# section 3); the small models 4.4M, 11.3M, 29.1M, 41.7M (Turc et al. 2019, "Well-Read
# Students Learn Better", the sizes google-research/bert's README links).
PUBLISHED_PARAMETERS = {"bert_tiny": 4.4e6, "bert_mini": 11.3e6, "bert_small": 29.1e6,
                        "bert_medium": 41.7e6, "bert_base": 110e6, "bert_large": 340e6}


@pytest.mark.parametrize("name", schema.BERT_MODELS)
def test_the_sizes_are_the_published_ones(name):
    config = JobConfig.from_dict({"model": name, "trainData": "x", "globalBatchSize": 256,
                                  "trainSteps": 1000}, resolved=False)
    assert schema.bert_parameters(config) == pytest.approx(PUBLISHED_PARAMETERS[name], rel=0.02)


def test_the_flops_table_matches_the_model(strategy):
    """The Dense layers' kernels times the tokens each one sees, plus attention's two
    S x S x H products per layer (no kernel holds them), against the table."""
    config = JobConfig.from_dict({**BERT_JOB, "model": "bert_mini", "trainData": "x"},
                                 resolved=False)
    spec = models.model_spec(config)
    model = bert.build_pretrainer(spec)
    macs = 0
    for layer in model.submodules:
        if isinstance(layer, keras.layers.Dense):
            tokens = (spec.seq_length if "transformer_layer" in layer.kernel.name
                      else spec.max_predictions if "masked_lm" in layer.kernel.name else 1)
            macs += tokens * layer.kernel.shape.num_elements()
    macs += spec.layers * 2 * spec.seq_length**2 * spec.hidden
    macs += spec.max_predictions * spec.vocab_size * spec.hidden  # logits on the embeddings
    assert schema.train_flops_per_example(config) == pytest.approx(6 * macs, rel=0.01)


def test_the_learning_rate_warms_up_from_0_and_decays_linearly():
    config = JobConfig.from_dict({**BERT_JOB, "trainData": "x", "learningRate": None,
                                  "globalBatchSize": 1024, "warmupSteps": 8}, resolved=False)
    schedule = train.learning_rate(config, models.model_spec(config))
    peak = schema.BERT_BASE_LEARNING_RATE  # AdamW: google-research's rate, unscaled
    assert float(schedule(0)) == 0.0  # optimization.py: global_step / num_warmup_steps
    assert float(schedule(4)) == pytest.approx(peak / 2)
    assert float(schedule(8)) == pytest.approx(peak * 0.92)  # decaying from trainSteps (100)
    assert float(schedule(50)) == pytest.approx(peak * 0.5)
    assert float(schedule(100)) == 0.0


def test_large_global_batches_take_lamb(strategy):
    small = JobConfig.from_dict({**BERT_JOB, "trainData": "x"}, resolved=False)
    large = JobConfig.from_dict({**BERT_JOB, "trainData": "x", "globalBatchSize": 8192},
                                resolved=False)
    assert isinstance(bert.make_optimizer(small, 1e-3), keras.optimizers.AdamW)
    lamb = bert.make_optimizer(large, 1e-3)
    assert isinstance(lamb, bert.Lamb)
    # Both clip the gradients' global norm (optimization.py's 1.0; issue 38: LAMB did not).
    assert bert.make_optimizer(small, 1e-3).global_clipnorm == lamb.global_clipnorm == 1.0


def test_lamb_trains_and_keeps_its_moments(strategy):
    spec = spec_of()
    model = bert.build_pretrainer(spec)
    optimizer = bert.Lamb(1e-2)
    rng = np.random.default_rng(0)
    instance = [synth._bert_instance(rng, synth.BertLanguage.draw(rng, spec.vocab_size), spec)
                for _ in range(8)]
    serialized = tf.constant([synth.bert_example_bytes(*parts, spec) for parts in instance])
    batch = bert_data.parse_batch(serialized, spec)
    task = bert.BertTask(spec)
    losses = []
    for _ in range(5):
        with tf.GradientTape() as tape:
            loss = task.loss(model, (batch,), 8)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        losses.append(float(loss))
    assert losses[-1] < losses[0]
    assert len(optimizer.variables) == 2 * len(model.trainable_variables) + 1  # m, v, step


# ---- the records -----------------------------------------------------------------------

def test_synth_writes_create_pretraining_data_records(bert_data_dir):
    record = next(iter(tf.data.TFRecordDataset(
        sorted(tf.io.gfile.glob(f"{bert_data_dir}/train-*.tfrecord"))[:1])))
    features = tf.train.Example.FromString(record.numpy()).features.feature
    assert sorted(features) == sorted(bert_data.FEATURES)
    ids = list(features["input_ids"].int64_list.value)
    mask = list(features["input_mask"].int64_list.value)
    assert len(ids) == SHAPE["maxSeqLength"] and ids[0] == synth.CLS_ID
    assert ids.count(synth.SEP_ID) == 2 and mask == [int(i > 0) for i in ids]
    weights = list(features["masked_lm_weights"].float_list.value)
    positions = list(features["masked_lm_positions"].int64_list.value)
    assert len(weights) == len(positions) == SHAPE["maxPredictionsPerSeq"]
    real = [p for p, w in zip(positions, weights, strict=True) if w == 1.0]
    assert real and all(0 < p < sum(mask) for p in real)
    assert features["next_sentence_labels"].int64_list.value[0] in (0, 1)


def test_a_resumed_stream_starts_at_its_step(bert_data_dir):
    """The bert_pretraining stream is a pure function of its position, as the image ones."""
    files = data.list_files(f"{bert_data_dir}/train-*.tfrecord")
    spec = spec_of()
    dataset_fn = data.make_dataset_fn(files, spec, 16, record_format="bert_pretraining")
    context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                         num_replicas_in_sync=2)

    def ids(step: int, count: int) -> list[list[int]]:
        stream = data.starting_at(dataset_fn, step)(context).take(count)
        return [features["input_word_ids"].numpy().tolist() for (features,) in stream]

    fresh = ids(0, 80)  # 1024 records in batches of 8: an epoch is 128 batches
    assert ids(5, 70) == fresh[10:]
    assert fresh[0] != fresh[1]


def write_records(path: Path, records: list[bytes]) -> str:
    path.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path / "train-00000-of-00001.tfrecord")) as writer:
        for record in records:
            writer.write(record)
    return f"{path}/train-*.tfrecord"


def good_records(count: int, seed: int = 0, **overrides) -> list[bytes]:
    spec = spec_of(**overrides)
    rng = np.random.default_rng(seed)
    language = synth.BertLanguage.draw(rng, spec.vocab_size)
    return [synth.bert_example_bytes(*synth._bert_instance(rng, language, spec), spec)
            for _ in range(count)]


def without(record: bytes, name: str) -> bytes:
    example = tf.train.Example.FromString(record)
    del example.features.feature[name]
    return example.SerializeToString()


def run_cli(tmp_path: Path, pattern: str) -> subprocess.CompletedProcess:
    config = tmp_path / "job.json"
    config.write_text(json.dumps(resolved(tmp_path, tmp_path, trainData=pattern,
                                          trainSteps=20, stepsPerExecution=10,
                                          checkpointEverySteps=10)))
    return subprocess.run([sys.executable, "-m", "tpu_training", "run", "--config", str(config)],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("records", "feature", "words"), [
    (lambda: [without(good_records(1)[0], "masked_lm_weights"), *good_records(63)],
     "masked_lm_weights", "have no 'masked_lm_weights' feature"),
    # Written for maxSeqLength 80, read at 64.
    (lambda: good_records(64, maxSeqLength=80), "input_ids",
     "80 values of 'input_ids', longer than maxSeqLength (64)"),
], ids=["missing", "longer"])
def test_a_bad_first_record_is_one_error_naming_the_feature(strategy, tmp_path, records,
                                                            feature, words):
    pattern = write_records(tmp_path / "data", records())
    config = JobConfig.from_dict(resolved(tmp_path, tmp_path, trainData=pattern))
    with pytest.raises(exits.RecordsError) as error:
        train.run(config, strategy=strategy, out=io.StringIO())
    ((key, message),) = error.value.problems
    assert key == "trainData" and words in message, message


def test_a_bad_record_met_while_training_is_one_error_exit_65(tmp_path):
    """The first record is fine; one the pipeline parses later is not."""
    records = good_records(64)
    records[50] = without(records[50], "segment_ids")
    done = run_cli(tmp_path, write_records(tmp_path / "data", records))
    errors = [line for line in done.stderr.splitlines() if line.startswith("tpu_training:")]
    assert done.returncode == 65, done.stderr[-2000:]
    assert errors == ["tpu_training: error: trainData: a record has no 'segment_ids' "
                      f"feature; bert_pretraining records hold {', '.join(bert_data.FEATURES)}"]
    assert "Traceback" not in done.stderr


def test_the_schema_keys_of_bert():
    config = JobConfig.from_dict({"model": "bert_base", "trainData": "x",
                                  "globalBatchSize": 256, "trainSteps": 10,
                                  "stepsPerExecution": 10}, resolved=False)
    assert (config.maxSeqLength, config.maxPredictionsPerSeq, config.vocabSize,
            config.recordFormat) == (128, 20, 30522, "bert_pretraining")
    problems = {
        ("model", "mnist_cnn", "maxSeqLength", 64): "applies to BERT models",
        ("model", "bert_tiny", "recordFormat", "raw"): "reads bert_pretraining records",
        ("model", "resnet18", "recordFormat", "bert_pretraining"): "are for bert_tiny",
        ("model", "bert_tiny", "maxSeqLength", 513): "must be 2 to 512",
        ("model", "bert_tiny", "maxPredictionsPerSeq", 200): "must be 1 to maxSeqLength",
        ("model", "bert_tiny", "imageSize", 64): "applies to image models",
    }
    for (_, model, key, value), message in problems.items():
        with pytest.raises(JobConfigError) as error:
            JobConfig.from_dict({"model": model, "trainData": "x", "globalBatchSize": 8,
                                 "trainSteps": 10, "stepsPerExecution": 10, key: value},
                                resolved=False)
        assert any(k == key and message in m for k, m in error.value.problems), error.value


# ---- stop and resume, as the agent runs the job ----------------------------------------

def test_sigterm_saves_and_the_rerun_resumes_in_the_epoch(tmp_path, bert_data_dir):
    config = tmp_path / "job.json"
    config.write_text(json.dumps(resolved(tmp_path, bert_data_dir, trainSteps=100_000,
                                          stepsPerExecution=5, checkpointEverySteps=100)))
    first = Job(config, tmp_path / "stderr-1.log")
    first.wait_for_step(10)
    assert first.stop(signal.SIGTERM) == 75
    stopped = first.steps[-1]
    assert first.progress[-1] == f"tpu_training stopped_at={stopped}"
    assert first.stop_saves == [stopped]
    assert tf.train.latest_checkpoint(str(tmp_path / "ckpt")).endswith(f"ckpt-{stopped}")

    rerun = Job(config, tmp_path / "stderr-2.log")
    assert rerun.wait_for_step(1) == stopped + 5
    assert rerun.progress[0] == f"tpu_training resumed_from={stopped}"
    assert rerun.stop(signal.SIGTERM) == 75
    # The epoch goes on: an epoch is 1024 / 32 = 32 steps, the stop came inside it, and
    # the record index lets the rerun find its place (test_a_resumed_stream_... holds the
    # stream to its position).
    assert stopped < 32
    index = json.loads((tmp_path / "ckpt" / data.RecordIndex.NAME).read_text())
    assert sum(index["counts"].values()) == 1024
