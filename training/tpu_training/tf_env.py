"""TensorFlow and Keras 2, imported the one way the job supports.

Every module that needs TensorFlow imports it from here, so `TF_USE_LEGACY_KERAS`
is set before TensorFlow loads. Google's own TF-on-TPU CI and Model Garden train
with Keras 2 (`tf_keras`): Keras 3 `fit` with `steps_per_execution > 1` fails
under multi-replica strategies (keras-team/keras issue 19246; docs/tpu-facts.md).
"""

from __future__ import annotations

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # C++ info and warning chatter

import tensorflow as tf

try:
    import tf_keras as keras
except ImportError as error:  # pragma: no cover - depends on the machine
    raise ImportError(
        f"tpu_training needs tf-keras {tf.__version__.rsplit('.', 1)[0]}.* next to "
        f"TensorFlow {tf.__version__}; the package archive carries it (training/wheels.lock)"
    ) from error

__all__ = ["keras", "tf"]
