"""Examples/s of the job's BERT pre-training against tensorflow/models', on CPU, in one run.

Both train the same model size (BERT-Tiny by default: 2 layers, hidden 128, 2 heads,
feed-forward 512, vocabulary 30522, 128 tokens, 20 predictions) on the same
synthetic records (`tpu_training.synth`, create_pretraining_data.py's schema), with the
same optimizer (tf_keras AdamW, weight decay 0.01, global norm clipped to 1), batch and
steps per execution (a `tf.range` loop in one tf.function), on TensorFlow's default
strategy. What differs is what is compared:

- ours: `tpu_training.train.Job` (the job's model, loss and step) fed by
  `tpu_training.data.make_dataset_fn` (the job's input pipeline for bert_pretraining);
- tensorflow/models (`tf-models-official`): `official.nlp.modeling.networks.BertEncoderV2`
  and `models.BertPretrainerV2` (tasks/masked_lm.py's `build_losses`, which the loss
  copies), fed by `official.nlp.data.pretrain_dataloader.BertPretrainDataLoader`.

Like for like, and asserted before timing (`assert_like_for_like`): the same GELU (the
tanh approximation, google-research/bert modeling.py's) in the feed-forward layers and
the masked-LM head; the same heads (the masked-LM head, and run_pretraining.py's one
dense layer on the pooled output for the next sentence, not a ClassificationHead with
its own pooler); the same number of weights; the same optimizer excluding the same
variables from weight decay (LayerNorm and biases: none decayed on either side, as many
decayed on each, counted in weights: our query, key and value are one kernel).

The two are timed in turns; each keeps its best round (a shared machine only slows a
run down). It prints both rates and their ratio (ours / tensorflow/models).

tf-models-official requires the full `tensorflow` package, which must not land beside
tensorflow-cpu in the job's venvs, so it runs in an environment of its own, with
tensorflow-cpu and the model garden installed without its dependencies:

    python3.11 -m venv .venv/bench
    .venv/bench/bin/pip install tensorflow-cpu==2.18.1 gin-config pyyaml immutabledict \\
        psutil py-cpuinfo six scipy pandas tensorflow-datasets sentencepiece
    .venv/bench/bin/pip install --no-deps tf-keras==2.18.0 tf-models-official==2.18.0
    .venv/bench/bin/pip install protobuf==5.29.6 "googleapis-common-protos<1.70" \
        "tensorflow-metadata<1.17"   # 1.17 is generated for protobuf 6 (2026-12-04)
    PYTHONPATH=training .venv/bench/bin/python bench/bert_pretraining.py [--steps 60]
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time
from collections.abc import Callable

from tpu_training import bert, data, models, synth, train
from tpu_training.config import JobConfig
from tpu_training.tf_env import keras, tf

EXAMPLES, SHARDS = 2048, 8


def job_config(model: str, batch: int, per_execution: int, root: str) -> JobConfig:
    return JobConfig.from_dict({
        "model": model, "trainData": f"{root}/data/train-*.tfrecord", "trainSteps": 10**6,
        "globalBatchSize": batch, "stepsPerExecution": per_execution,
        "checkpointEverySteps": per_execution, "checkpointDir": f"{root}/ckpt",
        "exportDir": f"{root}/export", "tensorboardDir": f"{root}/tb"})


def input_rates(config: JobConfig, written: synth.SynthResult, batches: int = 300
                ) -> dict[str, float]:
    """Examples/s of the two input pipelines alone (one host, one pipeline), best of 3."""
    from official.nlp.data import pretrain_dataloader

    spec, context = bert.bert_spec(config), tf.distribute.InputContext()
    params = pretrain_dataloader.BertPretrainDataConfig(
        input_path=written.pattern, global_batch_size=config.globalBatchSize,
        is_training=True, seq_length=spec.seq_length,
        max_predictions_per_seq=spec.max_predictions, use_next_sentence_label=True)
    iterators = {
        "ours": iter(data.make_dataset_fn(written.files, spec, config.globalBatchSize,
                                          record_format=config.recordFormat)(context)),
        "tensorflow/models": iter(pretrain_dataloader.BertPretrainDataLoader(params)
                                  .load(context))}
    best = dict.fromkeys(iterators, 0.0)
    for round_ in range(4):
        for name, iterator in iterators.items():
            started = time.perf_counter()
            for _ in range(batches):
                next(iterator)
            if round_:  # the first round fills the pipelines
                rate = batches * config.globalBatchSize / (time.perf_counter() - started)
                best[name] = max(best[name], rate)
    return best


def ours(config: JobConfig, files: list[str], strategy) -> Callable[[int], None]:
    """The job's step and input: `run(executions)`."""
    spec = models.model_spec(config)
    job = train.Job(config, spec, strategy, io.StringIO())
    dataset_fn = data.make_dataset_fn(files, spec, config.globalBatchSize,
                                      record_format=config.recordFormat)
    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    train_steps = job.train_steps_fn()
    steps = tf.constant(config.stepsPerExecution)

    def run(executions: int) -> None:
        for _ in range(executions):
            train_steps(iterator, steps)
        float(job.loss_metric.result())

    layer = job.model.encoder.get_layer("transformer_layer_0")
    run.side = Side(job.model.trainable_variables, job.optimizer,
                    [layer.intermediate.activation, job.model.masked_lm.transform.activation])
    return run


def model_garden(config: JobConfig, pattern: str, strategy) -> Callable[[int], None]:
    """tensorflow/models' encoder, pretrainer, loss and data loader: `run(executions)`."""
    from official.nlp.data import pretrain_dataloader
    from official.nlp.modeling import models, networks

    spec = bert.bert_spec(config)
    params = pretrain_dataloader.BertPretrainDataConfig(
        input_path=pattern, global_batch_size=config.globalBatchSize, is_training=True,
        seq_length=spec.seq_length, max_predictions_per_seq=spec.max_predictions,
        use_next_sentence_label=True)
    dataset = strategy.distribute_datasets_from_function(
        lambda context: pretrain_dataloader.BertPretrainDataLoader(params).load(context))
    with strategy.scope():
        encoder = networks.BertEncoderV2(
            vocab_size=spec.vocab_size, hidden_size=spec.hidden, num_layers=spec.layers,
            num_attention_heads=spec.heads, inner_dim=spec.intermediate,
            max_sequence_length=512, type_vocab_size=2)
        model = models.BertPretrainerV2(encoder_network=encoder, mlm_activation=tanh_gelu)
        next_sentence = keras.layers.Dense(2, name="next_sentence")  # run_pretraining.py's
        optimizer = bert.make_optimizer(config, bert.learning_rate(config))
        loss_metric = keras.metrics.Mean()
    model(model.inputs)
    next_sentence.build([None, spec.hidden])
    variables = [*model.trainable_variables, *next_sentence.trainable_variables]

    def step_fn(features: dict[str, tf.Tensor]) -> None:
        with tf.GradientTape() as tape:
            outputs = model(features, training=True)
            nsp_logits = next_sentence(outputs["pooled_output"])
            # official/nlp/tasks/masked_lm.py, MaskedLMTask.build_losses.
            per_prediction = keras.losses.sparse_categorical_crossentropy(
                features["masked_lm_ids"], tf.cast(outputs["mlm_logits"], tf.float32),
                from_logits=True)
            weights = features["masked_lm_weights"]
            mlm = tf.math.divide_no_nan(tf.reduce_sum(per_prediction * weights),
                                        tf.reduce_sum(weights))
            sentence = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                features["next_sentence_labels"],
                tf.cast(nsp_logits, tf.float32), from_logits=True))
            loss = (mlm + sentence) / strategy.num_replicas_in_sync
        gradients = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(gradients, variables, strict=True))
        loss_metric.update_state(loss)

    @tf.function
    def train_steps(iterator, num_steps: tf.Tensor) -> None:
        for _ in tf.range(num_steps):
            strategy.run(step_fn, args=(next(iterator),))

    iterator = iter(dataset)
    steps = tf.constant(config.stepsPerExecution)

    def run(executions: int) -> None:
        for _ in range(executions):
            train_steps(iterator, steps)
        float(loss_metric.result())

    run.side = Side(variables, optimizer, [encoder._transformer_layers[0]._inner_activation,
                                           model.masked_lm.activation])
    return run


def tanh_gelu(x: tf.Tensor) -> tf.Tensor:
    """GELU's tanh approximation, as google-research/bert modeling.py and the job use."""
    return tf.nn.gelu(x, approximate=True)


class Side:
    """What one side trains: its variables, its optimizer and its activations."""

    def __init__(self, variables: list, optimizer, activations: list):
        self.variables, self.optimizer, self.activations = variables, optimizer, activations

    def decayed(self) -> dict[str, int]:
        """The weights the optimizer decays: name to size."""
        return {v.name: v.shape.num_elements() for v in self.variables
                if self.optimizer._use_weight_decay(v)}


def assert_like_for_like(ours_side: Side, theirs: Side) -> None:
    """Same activation, heads (weights) and weight-decay exclusions on both sides."""
    probe = tf.linspace(-3.0, 3.0, 13)
    for activation in (*ours_side.activations, *theirs.activations):
        tf.debugging.assert_near(activation(probe), tanh_gelu(probe), atol=1e-6)
    weights = [sum(v.shape.num_elements() for v in side.variables)
               for side in (ours_side, theirs)]
    assert weights[0] == weights[1], f"weights: ours {weights[0]}, theirs {weights[1]}"
    decayed = [side.decayed() for side in (ours_side, theirs)]
    for names in decayed:
        wrong = [n for n in names if "norm" in n.lower() or "bias" in n.lower()]
        assert not wrong, f"decayed LayerNorm or bias: {wrong}"
    # As many weights decayed (query, key and value are one fused kernel on our side).
    sizes = [sum(names.values()) for names in decayed]
    assert sizes[0] == sizes[1], f"decayed weights: ours {sizes[0]}, theirs {sizes[1]}"


def measure(run: Callable[[int], None], examples: int, executions: int) -> tuple[float, float]:
    """Examples per second, and this process's CPU milliseconds per example (on a shared
    machine the CPU time varies less than the wall time)."""
    started, cpu = time.perf_counter(), time.process_time()
    run(executions)
    return (examples / (time.perf_counter() - started),
            1000 * (time.process_time() - cpu) / examples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="bert_tiny")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--per-execution", type=int, default=10)
    parser.add_argument("--steps", type=int, default=60, help="per round and side")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    strategy = tf.distribute.get_strategy()
    with tempfile.TemporaryDirectory() as root:
        config = job_config(args.model, args.batch, args.per_execution, root)
        written = synth.write_dataset(f"{root}/data", bert.bert_spec(config),
                                      examples=EXAMPLES, shards=SHARDS)
        inputs = input_rates(config, written)
        sides = {"ours": ours(config, written.files, strategy),
                 "tensorflow/models": model_garden(config, written.pattern, strategy)}
        assert_like_for_like(sides["ours"].side, sides["tensorflow/models"].side)
        executions = max(1, args.steps // args.per_execution)
        examples = executions * args.per_execution * args.batch
        best, cpu = dict.fromkeys(sides, 0.0), {name: [] for name in sides}
        for run in sides.values():
            run(2)  # trace, compile, fill the pipelines
        for round_ in range(args.rounds):
            # Alternate which side goes first, so neither always follows the other.
            for name in (list(sides) if round_ % 2 == 0 else list(sides)[::-1]):
                rate, ms = measure(sides[name], examples, executions)
                best[name] = max(best[name], rate)
                cpu[name].append(ms)
    spec = bert.bert_spec(config)
    print(f"{args.model} (L={spec.layers} H={spec.hidden} S={spec.seq_length} "
          f"P={spec.max_predictions} V={spec.vocab_size}), batch {args.batch}, "
          f"{args.per_execution} steps per execution, {tf.__version__} CPU, best of "
          f"{args.rounds} rounds of {executions * args.per_execution} steps:")
    for name, rate in best.items():
        print(f"  {name:18s} {rate:8.1f} examples/s   {min(cpu[name]):6.2f} CPU ms/example")
    models_side = "tensorflow/models"
    print(f"  ratio ours / tensorflow/models: {best['ours'] / best[models_side]:.2f}x "
          f"examples/s, {min(cpu[models_side]) / min(cpu['ours']):.2f}x CPU per example")
    print(f"  input pipelines alone: ours {inputs['ours']:.0f}, tensorflow/models "
          f"{inputs[models_side]:.0f} examples/s, "
          f"{inputs['ours'] / inputs[models_side]:.2f}x")


if __name__ == "__main__":
    main()
