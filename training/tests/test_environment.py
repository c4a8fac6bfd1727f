"""The training environment itself: one TensorFlow, and the Keras the job uses."""

from __future__ import annotations

from importlib import metadata


def tensorflow_distributions() -> list[str]:
    """Every installed distribution that ships the `tensorflow` package (tensorflow,
    tensorflow-cpu, tensorflow-tpu, tf-nightly, ... all install the same files)."""
    names = set()
    for distribution in metadata.distributions():
        files = distribution.files or []
        if any(str(file).replace("\\", "/") == "tensorflow/__init__.py" for file in files):
            names.add(distribution.metadata["Name"])
    return sorted(names)


def test_exactly_one_tensorflow_is_installed():
    # tf-keras declares `tensorflow` as its dependency; installed with it, pip puts a
    # second TensorFlow (with CUDA libraries) beside tensorflow-cpu (scripts/setup.sh).
    assert len(tensorflow_distributions()) == 1, tensorflow_distributions()


def test_tf_keras_matches_tensorflow():
    tensorflow = metadata.version(tensorflow_distributions()[0])
    assert metadata.version("tf-keras").split(".")[:2] == tensorflow.split(".")[:2]
