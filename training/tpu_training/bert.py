"""BERT: the encoder, its pre-training heads and losses, AdamW and LAMB.

The layout follows google-research/bert `modeling.py` (BertModel: word, position and
token-type embeddings summed and layer-normalised; L transformer layers of H/64-head
self-attention and a 4H GELU feed-forward layer, each with a residual connection and
layer normalisation, epsilon 1e-12; a tanh pooler on the first token; weights drawn
from a normal truncated at 0.02) and tensorflow/models `official/nlp/modeling`
(networks/bert_encoder.py BertEncoderV2, its inputs `input_word_ids`, `input_mask`,
`input_type_ids` and outputs `sequence_output`, `pooled_output`, the convention TF
Hub's BERT encoders share; models/bert_pretrainer.py BertPretrainerV2 and
layers/masked_lm.py MaskedLM: the masked positions gathered, a GELU dense layer,
layer normalisation, logits against the word embeddings plus a bias). The
next-sentence head is run_pretraining.py's: one dense layer on the pooled output.

Losses and accuracies are run_pretraining.py's and official/nlp/tasks/masked_lm.py's:
masked-LM cross-entropy averaged over `masked_lm_weights`, next-sentence
cross-entropy averaged over examples, their sum the training loss.

Query, key and value are one fused projection (3H); the checkpoint layout is this
package's own. google-research/bert's TF1 checkpoints and tensorflow/models' TF2 encoder
checkpoints are read by tpu_training.bert_checkpoint (`initCheckpoint`).
"""

from __future__ import annotations

import dataclasses
import math

from tpu_training import bert_checkpoint
from tpu_training import config as schema
from tpu_training.config import JobConfig
from tpu_training.exits import CheckpointError
from tpu_training.tf_env import keras, tf

INITIALIZER_RANGE = 0.02  # modeling.py BertConfig.initializer_range
LAYER_NORM_EPSILON = 1e-12  # modeling.py layer_norm: epsilon=1e-12
DROPOUT_RATE = 0.1  # hidden_dropout_prob and attention_probs_dropout_prob
# optimization.py AdamWeightDecayOptimizer: weight_decay_rate 0.01, beta_1 0.9,
# beta_2 0.999, epsilon 1e-6, no decay on LayerNorm and bias; gradients clipped to a
# global norm of 1.0 (create_optimizer); the rates, warm-up, decay and clipping are
# config.recipe's. tf_keras' AdamW, used here, also corrects the moments' bias, which
# that optimizer does not; its decay is decoupled the same way (the weight times the
# rate times the learning rate).
ADAM_BETAS = (0.9, 0.999)
ADAM_EPSILON = 1e-6
# google-research/bert names its LayerNorm variables `LayerNorm` (exclude_from_weight_decay=
# ["LayerNorm", "layer_norm", "bias"]), tf_keras layers `layer_norm`: both, so a model
# with either name (tensorflow/models' masked-LM head's `.../transform/LayerNorm`) takes
# no decay on its normalisation (tf_keras matches the names case-sensitively).
NO_DECAY = ["LayerNorm", "layer_norm", "bias"]
ENCODER_INPUTS = ("input_word_ids", "input_mask", "input_type_ids")
FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions",
            "masked_lm_ids", "masked_lm_weights", "next_sentence_labels")


@dataclasses.dataclass(frozen=True)
class BertSpec:
    """What the data, the model and the optimizer need to agree on, for BERT."""

    name: str
    layers: int
    hidden: int
    heads: int
    seq_length: int
    max_predictions: int
    vocab_size: int

    @property
    def intermediate(self) -> int:
        return 4 * self.hidden


def bert_spec(config: JobConfig) -> BertSpec:
    layers, hidden, heads, sequence, predictions, vocab = schema.bert_shape(config)
    return BertSpec(config.model, layers, hidden, heads, sequence, predictions, vocab)


def _initializer() -> keras.initializers.Initializer:
    return keras.initializers.TruncatedNormal(stddev=INITIALIZER_RANGE)


def _layer_norm(name: str) -> keras.layers.LayerNormalization:
    # float32 whatever the policy, as official/nlp's layers keep it.
    return keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, dtype="float32",
                                           name=name)


def _dense(units: int, name: str, **kwargs) -> keras.layers.Dense:
    # A fresh initializer per layer: one instance reused gives equal-shaped kernels equal
    # values (tf_keras initializers warn of it).
    return keras.layers.Dense(units, kernel_initializer=_initializer(), name=name, **kwargs)


def _gelu(x: tf.Tensor) -> tf.Tensor:
    return tf.nn.gelu(x, approximate=True)  # modeling.py gelu: the tanh approximation


class Embeddings(keras.layers.Layer):
    """Word, position and token-type embeddings summed, normalised, dropped out."""

    def __init__(self, spec: BertSpec, **kwargs):
        super().__init__(**kwargs)
        self.spec = spec
        self.words = keras.layers.Embedding(spec.vocab_size, spec.hidden,
                                            embeddings_initializer=_initializer(),
                                            name="word_embeddings")
        self.types = keras.layers.Embedding(schema.BERT_TYPE_VOCAB, spec.hidden,
                                            embeddings_initializer=_initializer(),
                                            name="type_embeddings")
        self.norm = _layer_norm("embeddings_layer_norm")
        self.dropout = keras.layers.Dropout(DROPOUT_RATE)

    def build(self, input_shape):
        self.positions = self.add_weight(
            "position_embeddings", [schema.BERT_MAX_POSITIONS, self.spec.hidden],
            initializer=_initializer())
        super().build(input_shape)

    def call(self, word_ids, type_ids, training=None):
        length = tf.shape(word_ids)[1]
        positions = tf.cast(self.positions[:length], self.compute_dtype)
        summed = self.words(word_ids) + self.types(type_ids) + positions[tf.newaxis]
        return self.dropout(self.norm(summed), training=training)


class TransformerLayer(keras.layers.Layer):
    """Self-attention and feed-forward, each residual and post-normalised (modeling.py
    transformer_model)."""

    def __init__(self, spec: BertSpec, **kwargs):
        super().__init__(**kwargs)
        self.spec = spec
        self.qkv = _dense(3 * spec.hidden, "attention_qkv")
        self.attention_output = _dense(spec.hidden, "attention_output")
        self.attention_norm = _layer_norm("attention_layer_norm")
        self.intermediate = _dense(spec.intermediate, "intermediate", activation=_gelu)
        self.output_dense = _dense(spec.hidden, "output")
        self.output_norm = _layer_norm("output_layer_norm")
        self.dropout = keras.layers.Dropout(DROPOUT_RATE)

    def call(self, x, bias, training=None):
        spec = self.spec
        size = spec.hidden // spec.heads
        batch, length = tf.shape(x)[0], tf.shape(x)[1]
        qkv = tf.reshape(self.qkv(x), [batch, length, 3, spec.heads, size])
        query, key, value = tf.unstack(qkv, axis=2)
        scores = tf.einsum("bqhd,bkhd->bhqk", query, key) * (1.0 / math.sqrt(size))
        # Softmax in float32 (bfloat16 on TPU loses the mask's -10000 otherwise).
        probabilities = tf.nn.softmax(tf.cast(scores, tf.float32) + bias)
        probabilities = self.dropout(tf.cast(probabilities, x.dtype), training=training)
        context = tf.reshape(tf.einsum("bhqk,bkhd->bqhd", probabilities, value),
                             [batch, length, spec.hidden])
        attended = self.dropout(self.attention_output(context), training=training)
        x = self.attention_norm(tf.cast(x, tf.float32) + tf.cast(attended, tf.float32))
        ffn = self.dropout(self.output_dense(self.intermediate(x)), training=training)
        return self.output_norm(x + tf.cast(ffn, tf.float32))


def attention_bias(input_mask: tf.Tensor) -> tf.Tensor:
    """[B, 1, 1, S] float32: 0 where `input_mask` is 1, -10000 where it is 0 (modeling.py
    attention_layer's adder)."""
    return (1.0 - tf.cast(input_mask, tf.float32)[:, tf.newaxis, tf.newaxis, :]) * -10000.0


def build_encoder(spec: BertSpec) -> keras.Model:
    """The encoder: int32 ids, mask and types [B, S] to `sequence_output` [B, S, H] and
    `pooled_output` [B, H], float32."""
    inputs = {name: keras.Input(shape=(None,), dtype=tf.int32, name=name)
              for name in ENCODER_INPUTS}
    embeddings = Embeddings(spec, name="embeddings")
    x = embeddings(inputs["input_word_ids"], inputs["input_type_ids"])
    bias = keras.layers.Lambda(attention_bias, name="attention_bias")(inputs["input_mask"])
    layer_outputs = []
    for index in range(spec.layers):
        x = TransformerLayer(spec, name=f"transformer_layer_{index}")(x, bias)
        layer_outputs.append(x)
    first = keras.layers.Lambda(lambda sequence: sequence[:, 0], name="first_token")(x)
    pooled = _dense(spec.hidden, "pooler", activation="tanh")(first)
    outputs = {"sequence_output": x,
               "pooled_output": keras.layers.Activation("linear", dtype="float32",
                                                        name="pooled")(pooled),
               "encoder_outputs": layer_outputs}
    return keras.Model(inputs, outputs, name=f"{spec.name}_encoder")


def hub_encoder(spec: BertSpec) -> keras.Model:
    """The encoder as a TF Hub Transformer encoder (tensorflow.org/hub/common_saved_model_apis/
    text, "Transformer encoders"; tensorflow/models official/nlp/tools/export_tfhub_lib.py
    `_create_model`): the three int32 inputs to `pooled_output`, `sequence_output`,
    `default` (the pooled output again) and `encoder_outputs` (every layer's output)."""
    encoder = build_encoder(spec)
    inputs = {name: keras.Input(shape=(None,), dtype=tf.int32, name=name)
              for name in ENCODER_INPUTS}
    outputs = dict(encoder(inputs))
    outputs["default"] = outputs["pooled_output"]
    return keras.Model(inputs, outputs, name=f"{spec.name}_hub_encoder")


class MaskedLM(keras.layers.Layer):
    """Logits over the vocabulary at the masked positions, against the word embeddings."""

    def __init__(self, spec: BertSpec, embeddings: keras.layers.Embedding, **kwargs):
        super().__init__(**kwargs)
        self.spec, self.embeddings = spec, embeddings
        self.transform = _dense(spec.hidden, "transform", activation=_gelu)
        self.norm = _layer_norm("transform_layer_norm")

    def build(self, input_shape):
        self.bias = self.add_weight("output_bias", [self.spec.vocab_size], initializer="zeros")
        super().build(input_shape)

    def call(self, sequence, positions):
        picked = tf.gather(sequence, positions, batch_dims=1)
        # In the compute dtype (bfloat16 on TPU) up to the logits, which leave float32,
        # as official/nlp/layers/masked_lm.py computes them and the task casts them.
        hidden = tf.cast(self.norm(self.transform(picked)), self.compute_dtype)
        table = tf.cast(self.embeddings.embeddings, self.compute_dtype)
        # One 2-D product against the table.
        flat = tf.reshape(hidden, [-1, self.spec.hidden])
        logits = tf.matmul(flat, table, transpose_b=True) + tf.cast(self.bias, self.compute_dtype)
        logits = tf.reshape(logits, [tf.shape(picked)[0], -1, self.spec.vocab_size])
        return tf.cast(logits, tf.float32)


class Pretrainer(keras.Model):
    """The encoder with its masked-LM and next-sentence heads."""

    def __init__(self, spec: BertSpec, **kwargs):
        super().__init__(name=spec.name, **kwargs)
        self.spec = spec
        self.encoder = build_encoder(spec)
        self.masked_lm = MaskedLM(spec, self.encoder.get_layer("embeddings").words,
                                  name="masked_lm")
        self.next_sentence = _dense(2, "next_sentence", dtype="float32")

    def call(self, features, training=None):
        encoded = self.encoder({"input_word_ids": features["input_word_ids"],
                                "input_mask": features["input_mask"],
                                "input_type_ids": features["input_type_ids"]},
                               training=training)
        return {"mlm_logits": self.masked_lm(encoded["sequence_output"],
                                             features["masked_lm_positions"]),
                "nsp_logits": self.next_sentence(encoded["pooled_output"])}


def build_pretrainer(spec: BertSpec) -> Pretrainer:
    model = Pretrainer(spec)
    model(dummy_features(spec, 1))  # create every weight now, for checkpoints and copies
    return model


def published_tensors(path: str, spec: BertSpec, *, source: str
                      ) -> tuple[str, dict[str, tf.Tensor]]:
    """The variables of the google-research/bert or tensorflow/models checkpoint at `path`
    by their TF1 names and shapes, checked against `spec` (tpu_training.bert_checkpoint),
    and its layout (`tf1` or `tf2`); a CheckpointError naming `source` otherwise."""
    reader = _checkpoint_reader(path, source)
    shape = published_shape(spec)
    layout, sources = bert_checkpoint.plan(reader.get_variable_to_shape_map(), shape,
                                           source=source)
    wanted = bert_checkpoint.published_shapes(shape)
    return layout, {name: tf.reshape(reader.get_tensor(checkpoint_name), wanted[name])
                    for name, (checkpoint_name, _) in sources.items()}


def published_spec(path: str, model: str, *, source: str) -> BertSpec:
    """The spec of a `model`-sized encoder with the vocabulary of the checkpoint at `path`."""
    layers, hidden = schema.BERT_SIZES[model]
    shapes = _checkpoint_reader(path, source).get_variable_to_shape_map()
    vocab = bert_checkpoint.vocab_size(shapes) or schema.BERT_DEFAULTS["vocabSize"]
    return BertSpec(model, layers, hidden, hidden // schema.BERT_HEAD_SIZE,
                    schema.BERT_DEFAULTS["maxSeqLength"],
                    schema.BERT_DEFAULTS["maxPredictionsPerSeq"], vocab)


def export_published(path: str, spec: BertSpec, directory: str, *, source: str) -> None:
    """The TF Hub encoder export (`export_encoder`) of the published checkpoint at `path`."""
    keras.mixed_precision.set_global_policy("float32")
    model = build_pretrainer(spec)
    _, tensors = published_tensors(path, spec, source=source)
    assign_published(model, tensors)
    export_encoder(spec, model.encoder.get_weights(), directory)


def _checkpoint_reader(path: str, source: str):
    try:
        return tf.train.load_checkpoint(path)
    except (tf.errors.OpError, ValueError) as error:
        message = str(getattr(error, "message", error)).strip().split("\n")[0][:200]
        raise CheckpointError.single(source, f"cannot read the checkpoint {path}: {message}"
                                     ) from error


def published_shape(spec: BertSpec) -> bert_checkpoint.Shape:
    return bert_checkpoint.Shape(spec.layers, spec.hidden, spec.vocab_size, schema.BERT_HEAD_SIZE)


def assign_published(model: Pretrainer, tensors: dict[str, tf.Tensor]) -> int:
    """Set `model`'s variables from `tensors` (TF1 names, `published_tensors`); a head
    the tensors lack keeps its weights. Returns how many variables were set."""
    assigned = 0
    for variable, names, combine in _published_sources(model):
        if all(name in tensors for name in names):
            variable.assign(combine([tensors[name] for name in names]))
            assigned += 1
    return assigned


def _published_sources(model: Pretrainer) -> list[tuple[tf.Variable, list[str], object]]:
    """Each variable of `model`, the TF1 names it is made of, and how (query, key and
    value concatenated into the fused projection; next-sentence's [2, H] transposed)."""
    one, concat = (lambda values: values[0]), (lambda values: tf.concat(values, axis=-1))
    encoder = model.encoder
    embeddings = encoder.get_layer("embeddings")
    sources = [(embeddings.words.embeddings, ["bert/embeddings/word_embeddings"], one),
               (embeddings.types.embeddings, ["bert/embeddings/token_type_embeddings"], one),
               (embeddings.positions, ["bert/embeddings/position_embeddings"], one),
               *_norm_sources(embeddings.norm, "bert/embeddings/LayerNorm")]
    for index in range(model.spec.layers):
        layer = encoder.get_layer(f"transformer_layer_{index}")
        prefix = f"bert/encoder/layer_{index}/"
        for part in ("kernel", "bias"):
            sources.append((getattr(layer.qkv, part),
                            [f"{prefix}attention/self/{name}/{part}"
                             for name in ("query", "key", "value")], concat))
        sources += [*_dense_sources(layer.attention_output, f"{prefix}attention/output/dense"),
                    *_norm_sources(layer.attention_norm, f"{prefix}attention/output/LayerNorm"),
                    *_dense_sources(layer.intermediate, f"{prefix}intermediate/dense"),
                    *_dense_sources(layer.output_dense, f"{prefix}output/dense"),
                    *_norm_sources(layer.output_norm, f"{prefix}output/LayerNorm")]
    sources += _dense_sources(encoder.get_layer("pooler"), "bert/pooler/dense")
    heads = model.masked_lm
    sources += [*_dense_sources(heads.transform, "cls/predictions/transform/dense"),
                *_norm_sources(heads.norm, "cls/predictions/transform/LayerNorm"),
                (heads.bias, ["cls/predictions/output_bias"], one),
                (model.next_sentence.kernel, ["cls/seq_relationship/output_weights"],
                 lambda values: tf.transpose(values[0])),
                (model.next_sentence.bias, ["cls/seq_relationship/output_bias"], one)]
    return sources


def _dense_sources(layer: keras.layers.Dense, name: str) -> list:
    return [(layer.kernel, [f"{name}/kernel"], lambda values: values[0]),
            (layer.bias, [f"{name}/bias"], lambda values: values[0])]


def _norm_sources(layer: keras.layers.LayerNormalization, name: str) -> list:
    return [(layer.gamma, [f"{name}/gamma"], lambda values: values[0]),
            (layer.beta, [f"{name}/beta"], lambda values: values[0])]


def dummy_features(spec: BertSpec, batch: int) -> dict[str, tf.Tensor]:
    sequence = tf.zeros([batch, spec.seq_length], tf.int32)
    return {"input_word_ids": sequence, "input_mask": tf.ones_like(sequence),
            "input_type_ids": sequence,
            "masked_lm_positions": tf.zeros([batch, spec.max_predictions], tf.int32)}


def losses(features: dict[str, tf.Tensor], outputs: dict[str, tf.Tensor]
           ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Per example: masked-LM loss summed over its weights, those weights, and the
    next-sentence loss (the caller averages across the global batch)."""
    per_prediction = keras.losses.sparse_categorical_crossentropy(
        features["masked_lm_ids"], outputs["mlm_logits"], from_logits=True)
    weights = features["masked_lm_weights"]
    sentence = keras.losses.sparse_categorical_crossentropy(
        features["next_sentence_labels"], outputs["nsp_logits"], from_logits=True)
    return tf.reduce_sum(per_prediction * weights, axis=-1), tf.reduce_sum(weights, -1), sentence


def learning_rate(config: JobConfig) -> WarmupLinear:
    """optimization.py create_optimizer: linear warm-up from 0, then linear decay to 0 at
    trainSteps, at config.recipe's peak."""
    resolved = schema.recipe(config)
    return WarmupLinear(resolved.peak_learning_rate, resolved.warmup_steps, config.trainSteps)


class WarmupLinear(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from 0 to `peak` over `warmup_steps`, then linear decay to 0 at
    `total_steps` (optimization.py: polynomial_decay with power 1.0; under it, the rate at
    global_step is init_lr x global_step / num_warmup_steps while global_step is below
    it, 0 at the first step; `step` is the optimizer's iterations before the update)."""

    def __init__(self, peak: float, warmup_steps: int, total_steps: int):
        self.peak, self.warmup_steps, self.total_steps = peak, warmup_steps, total_steps

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        decayed = self.peak * tf.maximum(0.0, 1.0 - step / float(max(self.total_steps, 1)))
        warm = self.peak * step / float(max(self.warmup_steps, 1))
        return tf.where(step < self.warmup_steps, warm, decayed)

    def get_config(self) -> dict:
        return {"peak": self.peak, "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps}


def make_optimizer(config: JobConfig, rate) -> keras.optimizers.Optimizer:
    """AdamW as BERT trains; LAMB from `LAMB_MIN_GLOBAL_BATCH` (config.optimizer_name);
    both clip the gradients' global norm and decay the weights as config.recipe says."""
    resolved = schema.recipe(config)
    if resolved.optimizer == "lamb":
        return Lamb(rate, weight_decay=resolved.weight_decay, global_clipnorm=resolved.clip_norm)
    optimizer = keras.optimizers.AdamW(
        rate, weight_decay=resolved.weight_decay, beta_1=ADAM_BETAS[0], beta_2=ADAM_BETAS[1],
        epsilon=ADAM_EPSILON, global_clipnorm=resolved.clip_norm)
    optimizer.exclude_from_weight_decay(var_names=NO_DECAY)
    return optimizer


class Lamb(keras.optimizers.Optimizer):
    """LAMB (You et al. 2019, Algorithm 2), as tensorflow/models
    official/modeling/optimization/lamb.py computes it: Adam's bias-corrected step plus
    decoupled weight decay, scaled per variable by ||w|| / ||step|| (1 where either is
    0); LayerNorm and bias take no decay and no scaling."""

    def __init__(self, learning_rate, weight_decay: float = schema.BERT_WEIGHT_DECAY,
                 beta_1: float = ADAM_BETAS[0], beta_2: float = ADAM_BETAS[1],
                 epsilon: float = ADAM_EPSILON, name: str = "LAMB", **kwargs):
        super().__init__(name=name, **kwargs)
        self._learning_rate = self._build_learning_rate(learning_rate)
        self.lamb_decay, self.beta_1, self.beta_2, self.epsilon = (weight_decay, beta_1,
                                                                   beta_2, epsilon)

    def build(self, var_list):
        super().build(var_list)
        if getattr(self, "_built", False):
            return
        self._built = True
        self._momentums = [self.add_variable_from_reference(var, "m") for var in var_list]
        self._velocities = [self.add_variable_from_reference(var, "v") for var in var_list]

    def update_step(self, gradient, variable):
        gradient = tf.convert_to_tensor(gradient)
        index = self._index_dict[self._var_key(variable)]
        m, v = self._momentums[index], self._velocities[index]
        step = tf.cast(self.iterations + 1, variable.dtype)
        m.assign(self.beta_1 * m + (1 - self.beta_1) * gradient)
        v.assign(self.beta_2 * v + (1 - self.beta_2) * tf.square(gradient))
        m_hat = m / (1 - tf.pow(tf.cast(self.beta_1, variable.dtype), step))
        v_hat = v / (1 - tf.pow(tf.cast(self.beta_2, variable.dtype), step))
        update = m_hat / (tf.sqrt(v_hat) + self.epsilon)
        ratio = 1.0
        if not any(part in variable.name for part in NO_DECAY):
            update += self.lamb_decay * variable
            w_norm, u_norm = tf.norm(variable), tf.norm(update)
            ratio = tf.where(tf.logical_and(w_norm > 0, u_norm > 0), w_norm / u_norm, 1.0)
        variable.assign_sub(ratio * tf.cast(self.learning_rate, variable.dtype) * update)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update({"learning_rate": self._serialize_hyperparameter(self._learning_rate),
                       "weight_decay": self.lamb_decay, "beta_1": self.beta_1,
                       "beta_2": self.beta_2, "epsilon": self.epsilon})
        return config


class BertTask:
    """BERT pre-training: the pretrainer, its two losses, AdamW or LAMB, masked-LM and
    next-sentence accuracy; exported as the encoder (`input_word_ids`, `input_mask`,
    `input_type_ids` to `pooled_output` and `sequence_output`)."""

    def __init__(self, spec: BertSpec):
        self.spec = spec

    def build_model(self) -> Pretrainer:
        return build_pretrainer(self.spec)

    def optimizer(self, config: JobConfig, rate) -> keras.optimizers.Optimizer:
        return make_optimizer(config, rate)

    def loss(self, model: Pretrainer, batch: tuple, global_batch_size: int) -> tf.Tensor:
        """This replica's share of the loss: its masked-LM loss (averaged over its
        weights) plus its next-sentence loss, over the replicas in sync (as
        official/nlp/tasks/masked_lm.py and its trainer scale it)."""
        (features,) = batch
        mlm_sum, weights, sentence = losses(features, model(features, training=True))
        per_replica = (tf.math.divide_no_nan(tf.reduce_sum(mlm_sum), tf.reduce_sum(weights))
                       + tf.reduce_mean(sentence))
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        return per_replica / replicas

    def eval_metrics(self) -> dict[str, keras.metrics.Metric]:
        return {"eval_accuracy": keras.metrics.SparseCategoricalAccuracy(),
                "mlm_loss": keras.metrics.SparseCategoricalCrossentropy(from_logits=True),
                "nsp_loss": keras.metrics.SparseCategoricalCrossentropy(from_logits=True),
                "eval_nsp_accuracy": keras.metrics.SparseCategoricalAccuracy()}

    def eval_update(self, model: Pretrainer, batch: tuple, metrics: dict) -> None:
        (features,) = batch
        outputs = model(features, training=False)
        ids, weights = features["masked_lm_ids"], features["masked_lm_weights"]
        metrics["eval_accuracy"].update_state(ids, outputs["mlm_logits"], sample_weight=weights)
        metrics["mlm_loss"].update_state(ids, outputs["mlm_logits"], sample_weight=weights)
        labels = features["next_sentence_labels"]
        metrics["nsp_loss"].update_state(labels, outputs["nsp_logits"])
        metrics["eval_nsp_accuracy"].update_state(labels, outputs["nsp_logits"])

    def eval_results(self, metrics: dict) -> dict[str, float]:
        """Masked-LM accuracy, the pre-training loss (masked-LM plus next-sentence) and
        next-sentence accuracy, in the order of the job's eval line."""
        return {"eval_accuracy": float(metrics["eval_accuracy"].result()),
                "eval_loss": float(metrics["mlm_loss"].result() + metrics["nsp_loss"].result()),
                "eval_nsp_accuracy": float(metrics["eval_nsp_accuracy"].result())}

    def export(self, model: Pretrainer, directory: str) -> None:
        """A float32 copy of the encoder (the caller sets the float32 policy)."""
        export_encoder(self.spec, model.encoder.get_weights(), directory)


def export_encoder(spec: BertSpec, weights: list, directory: str) -> None:
    """Save the encoder with `weights` as a TF Hub Transformer encoder: a Keras
    SavedModel whose root is callable (`hub.load(directory)(inputs, training=...)`) and
    has `.variables` and `.trainable_variables`, so `hub.KerasLayer(directory,
    trainable=True)` fine-tunes it (export_tfhub_lib.py `export_model`: `core_model.save(
    ..., include_optimizer=False, save_format="tf")`). Its `serving_default` signature
    returns `pooled_output` and `sequence_output`, as TF Hub's BERT encoders' do."""
    encoder = hub_encoder(spec)
    encoder.set_weights(weights)
    ids = {name: tf.TensorSpec([None, None], tf.int32, name=name) for name in ENCODER_INPUTS}

    @tf.function(input_signature=list(ids.values()))
    def serve(input_word_ids, input_mask, input_type_ids) -> dict[str, tf.Tensor]:
        outputs = encoder({"input_word_ids": input_word_ids, "input_mask": input_mask,
                           "input_type_ids": input_type_ids}, training=False)
        return {"pooled_output": outputs["pooled_output"],
                "sequence_output": outputs["sequence_output"]}

    encoder.save(directory, include_optimizer=False, save_format="tf",
                 signatures={"serving_default": serve})
