"""`python record_ids.py IDS_FILE run --config JOB`: the job's CLI, its model swapped for
one that appends the ids of every batch it trains on to IDS_FILE (one line per replica
and step), so a test sees what training consumed, not what the pipeline produced ahead.

A record's id is in its first two pixels (id // 256, id % 256); see test_resume.py.
The perf line's device probe is left out: it runs the model on a batch of zeros made on
the device (tpu_training.perf), which the recorder would count as consumed records.
"""

from __future__ import annotations

import sys
import threading

from tpu_training import models, perf
from tpu_training.__main__ import main
from tpu_training.tf_env import keras, tf


def recording_model_builder(path: str):
    lock = threading.Lock()

    def record(images: tf.Tensor) -> tf.Tensor:
        pixels = images.numpy().reshape(len(images), -1)
        ids = (pixels[:, 0] * 256 + pixels[:, 1]).astype(int)
        with lock, open(path, "a", encoding="utf-8") as out:
            out.write(" ".join(map(str, ids)) + "\n")
        return images

    def build(spec: models.ModelSpec) -> keras.Model:
        inputs = keras.Input(shape=spec.image_shape, name="images")

        def observed(images: tf.Tensor) -> tf.Tensor:
            seen = tf.py_function(record, [images], tf.float32)
            seen.set_shape(images.shape)
            return seen

        features = keras.layers.Flatten()(keras.layers.Lambda(observed)(inputs))
        outputs = keras.layers.Dense(spec.num_classes, activation="softmax")(features / 255)
        return keras.Model(inputs, outputs)

    return build


if __name__ == "__main__":
    models.build_model = recording_model_builder(sys.argv[1])
    perf.device_probe = lambda *_args: None  # no probe: the perf line times executions only
    sys.exit(main(sys.argv[2:]))
