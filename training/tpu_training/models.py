"""The models a job can train, by the names in `config.MODEL_NAMES`.

`model_spec` gives the spec of any of them, `task_for` what trains, evaluates and exports
it: `ImageTask` here for the image models, `tpu_training.bert.BertTask` for BERT.

Every image model takes float32 pixel values in [0, 255] of shape `image_shape`,
rescales them itself (so the exported SavedModel takes the pixels the records
hold) and ends in a float32 softmax, whatever the compute dtype: under
`mixed_bfloat16` the trunk runs in bfloat16 and the output stays float32
(tensorflow.org/guide/mixed_precision).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

from tpu_training import bert
from tpu_training.config import IMAGE_BASE_LEARNING_RATE, JobConfig
from tpu_training.tf_env import keras, tf

DEFAULT_IMAGE_SIZE = 224
MNIST_SHAPE = (28, 28, 1)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What the data, the model and the optimizer need to agree on."""

    name: str
    image_shape: tuple[int, int, int]
    num_classes: int
    base_learning_rate: float  # for a global batch of 256; scaled linearly with it
    width: float = 1.0  # multiplies every layer's filters and units

    @property
    def pixel_count(self) -> int:
        height, width, channels = self.image_shape
        return height * width * channels


# Pixels leave the pipeline packed four to an int32 word and the step unpacks them on
# the device: TPUs take no uint8 (tensorflow/tensorflow issue 37426), and a cast to
# float32 on the host writes four bytes a pixel, the pipeline's largest cost after
# reading large images (bench/input_pipeline.py), and sends them all to the TPU.
PIXELS_PER_WORD = 4
# tf.bitcast keeps the bytes in memory order: a word's first pixel is its low byte
# on a little-endian host.
_BYTE_SHIFTS = [0, 8, 16, 24] if sys.byteorder == "little" else [24, 16, 8, 0]


def model_pixels(images: tf.Tensor, spec: ModelSpec) -> tf.Tensor:
    """What the model takes, float32 [B, H, W, C], from a batch's pixels: this pipeline's
    packed words, unpacked where the step runs (on the TPU), or pixels of any number type
    (a `dataset_fn` passed to `train.run`)."""
    if images.dtype != tf.int32 or images.shape.rank != 2:
        return tf.cast(images, tf.float32)
    shifts = tf.constant(_BYTE_SHIFTS, tf.int32)
    pixels = tf.bitwise.bitwise_and(tf.bitwise.right_shift(images[..., tf.newaxis], shifts), 0xFF)
    pixels = tf.reshape(pixels, [-1, images.shape[-1] * PIXELS_PER_WORD])[:, :spec.pixel_count]
    return tf.cast(tf.reshape(pixels, [-1, *spec.image_shape]), tf.float32)


def model_spec(config: JobConfig) -> ModelSpec | bert.BertSpec:
    if config.is_bert:
        return bert.bert_spec(config)
    width = config.widthMultiplier or 1.0
    if config.model == "mnist_cnn":
        return ModelSpec(config.model, MNIST_SHAPE, config.numClasses or 10,
                         IMAGE_BASE_LEARNING_RATE, width)
    size = config.imageSize or DEFAULT_IMAGE_SIZE
    return ModelSpec(config.model, (size, size, 3), config.numClasses or 1000,
                     IMAGE_BASE_LEARNING_RATE, width)


def build_model(spec: ModelSpec) -> keras.Model:
    """The model `spec` names, in the global Keras dtype policy."""
    inputs = keras.Input(shape=spec.image_shape, name="images")
    features = keras.layers.Rescaling(1 / 255)(inputs)
    features = _TRUNKS[spec.name](features, lambda units: max(1, round(units * spec.width)))
    outputs = keras.layers.Dense(spec.num_classes, activation="softmax", dtype="float32",
                                 name="probabilities")(features)
    return keras.Model(inputs, outputs, name=spec.name)


Width = Callable[[int], int]  # a layer's filters or units, scaled by the width multiplier


def _mnist_cnn(x, width: Width):
    """The MNIST model of TensorFlow's TPU guide (tensorflow.org/guide/tpu)."""
    x = keras.layers.Conv2D(width(256), 3, activation="relu")(x)
    x = keras.layers.Conv2D(width(256), 3, activation="relu")(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(width(256), activation="relu")(x)
    return keras.layers.Dense(width(128), activation="relu")(x)


def _resnet(block: Callable, blocks_per_stage: tuple[int, ...]) -> Callable:
    """ResNet v1.5 (He et al. 2015; stride on the 3x3 conv as in tf.keras.applications)."""

    def trunk(x, width: Width):
        x = _conv_bn(x, width(64), 7, strides=2)
        x = keras.layers.MaxPooling2D(3, strides=2, padding="same")(x)
        for stage, blocks in enumerate(blocks_per_stage):
            filters = width(64 * 2**stage)
            for index in range(blocks):
                strides = 2 if stage > 0 and index == 0 else 1
                x = block(x, filters, strides)
        return keras.layers.GlobalAveragePooling2D()(x)

    return trunk


def _basic_block(x, filters: int, strides: int):
    shortcut = _shortcut(x, filters, strides)
    y = _conv_bn(x, filters, 3, strides=strides)
    y = _conv_bn(y, filters, 3, relu=False)
    return keras.layers.ReLU()(keras.layers.Add()([shortcut, y]))


def _bottleneck_block(x, filters: int, strides: int):
    shortcut = _shortcut(x, 4 * filters, strides)
    y = _conv_bn(x, filters, 1)
    y = _conv_bn(y, filters, 3, strides=strides)
    y = _conv_bn(y, 4 * filters, 1, relu=False)
    return keras.layers.ReLU()(keras.layers.Add()([shortcut, y]))


def _shortcut(x, filters: int, strides: int):
    if strides == 1 and x.shape[-1] == filters:
        return x
    return _conv_bn(x, filters, 1, strides=strides, relu=False)


def _conv_bn(x, filters: int, kernel: int, *, strides: int = 1, relu: bool = True):
    x = keras.layers.Conv2D(filters, kernel, strides=strides, padding="same", use_bias=False,
                            kernel_initializer="he_normal")(x)
    x = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(x)
    return keras.layers.ReLU()(x) if relu else x


_TRUNKS: dict[str, Callable] = {
    "mnist_cnn": _mnist_cnn,
    "resnet18": _resnet(_basic_block, (2, 2, 2, 2)),
    "resnet50": _resnet(_bottleneck_block, (3, 4, 6, 3)),
}


def task_for(spec: ModelSpec | bert.BertSpec) -> ImageTask | bert.BertTask:
    """What trains, evaluates and exports the model of `spec`."""
    return bert.BertTask(spec) if isinstance(spec, bert.BertSpec) else ImageTask(spec)


class ImageTask:
    """An image classifier: pixels and labels in, softmax cross-entropy, SGD with Nesterov
    momentum, accuracy; exported as `images` to `probabilities` and `classes`."""

    def __init__(self, spec: ModelSpec):
        self.spec = spec

    def build_model(self) -> keras.Model:
        return build_model(self.spec)

    def optimizer(self, _config: JobConfig, rate) -> keras.optimizers.Optimizer:
        return keras.optimizers.SGD(rate, momentum=0.9, nesterov=True)

    def loss(self, model: keras.Model, batch: tuple, global_batch_size: int) -> tf.Tensor:
        """This replica's share of the global batch's mean loss."""
        images, labels = batch
        probabilities = model(model_pixels(images, self.spec), training=True)
        per_example = keras.losses.sparse_categorical_crossentropy(labels, probabilities)
        return tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)

    def eval_metrics(self) -> dict[str, keras.metrics.Metric]:
        return {"eval_accuracy": keras.metrics.SparseCategoricalAccuracy(),
                "eval_loss": keras.metrics.SparseCategoricalCrossentropy()}

    def eval_update(self, model: keras.Model, batch: tuple, metrics: dict) -> None:
        images, labels = batch
        probabilities = model(model_pixels(images, self.spec), training=False)
        for metric in metrics.values():
            metric.update_state(labels, probabilities)

    def eval_results(self, metrics: dict) -> dict[str, float]:
        return {name: float(metric.result()) for name, metric in metrics.items()}

    def export(self, model: keras.Model, directory: str) -> None:
        """A float32 copy of the model (the caller sets the float32 policy)."""
        serving = build_model(self.spec)
        serving.set_weights(model.get_weights())

        @tf.function(input_signature=[
            tf.TensorSpec([None, *self.spec.image_shape], tf.float32, name="images")])
        def serve(images: tf.Tensor) -> dict[str, tf.Tensor]:
            probabilities = serving(images, training=False)
            return {"probabilities": probabilities,
                    "classes": tf.argmax(probabilities, axis=-1, output_type=tf.int32)}

        serving.save(directory, include_optimizer=False, save_format="tf",
                     signatures={"serving_default": serve})
