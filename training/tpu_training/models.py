"""The models a job can train, by the names in `config.MODEL_NAMES`.

Every model takes float32 pixel values in [0, 255] of shape `image_shape`,
rescales them itself (so the exported SavedModel takes the pixels the records
hold) and ends in a float32 softmax, whatever the compute dtype: under
`mixed_bfloat16` the trunk runs in bfloat16 and the output stays float32
(tensorflow.org/guide/mixed_precision).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tpu_training.config import JobConfig
from tpu_training.tf_env import keras

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


def model_spec(config: JobConfig) -> ModelSpec:
    width = config.widthMultiplier or 1.0
    if config.model == "mnist_cnn":
        return ModelSpec(config.model, MNIST_SHAPE, config.numClasses or 10, 0.1, width)
    size = config.imageSize or DEFAULT_IMAGE_SIZE
    # 0.1 per 256 examples: Goyal et al. 2017, "Accurate, Large Minibatch SGD".
    return ModelSpec(config.model, (size, size, 3), config.numClasses or 1000, 0.1, width)


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
