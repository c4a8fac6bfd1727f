"""Fixtures for the job's tests: real TensorFlow on CPU, split into two replicas.

test_config.py needs only the standard library; the other files need TensorFlow
and are not collected where it is missing (the infra venv runs test_config.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

REPLICAS = 2
# Every job in these tests, in-process or a subprocess, runs on 2 logical CPUs.
os.environ["TPU_STACK_STRATEGY"] = "cpu"
os.environ["TPU_STACK_CPU_REPLICAS"] = str(REPLICAS)

if importlib.util.find_spec("tensorflow") is None:
    collect_ignore = [path.name for path in Path(__file__).parent.glob("test_*.py")
                      if path.name != "test_config.py"]

# A job small enough for a 2-core machine: the seed's MNIST CNN at 1/8 width.
SMALL_MNIST_JOB = {"model": "mnist_cnn", "globalBatchSize": 16, "trainSteps": 60,
                   "stepsPerExecution": 5, "checkpointEverySteps": 20,
                   "widthMultiplier": 0.125, "learningRate": 0.4,
                   "checkpointEveryMinutes": 60}  # saves by steps only: deterministic


@pytest.fixture(scope="session")
def strategy():
    """The 2-replica MirroredStrategy; created before any other TensorFlow op runs."""
    from tpu_training.strategy import make_strategy

    made = make_strategy("cpu", REPLICAS)
    assert made.num_replicas_in_sync == REPLICAS
    return made


@pytest.fixture(scope="session", autouse=True)
def _cpu_split_first(request):
    """Every process (each pytest-xdist worker too) splits the CPU into replicas before
    its first test: a TensorFlow op of a test run before the strategy is made would fix
    the CPU at one device, whatever order the worker takes its tests in."""
    if importlib.util.find_spec("tensorflow") is not None:
        request.getfixturevalue("strategy")


@pytest.fixture(scope="session")
def mnist_data(strategy, tmp_path_factory) -> str:
    """A 16-shard synthetic MNIST dataset; its glob."""
    from tpu_training import models, synth
    from tpu_training.config import JobConfig

    spec = models.model_spec(JobConfig.from_dict(
        {**SMALL_MNIST_JOB, "trainData": "x"}, resolved=False))
    out = tmp_path_factory.mktemp("mnist")
    return synth.write_dataset(str(out), spec, examples=1024, shards=16).pattern


@pytest.fixture(scope="session")
def make_job(mnist_data):
    """A factory of resolved small MNIST jobs with every location under a root."""

    def make(root: Path | str, **overrides) -> dict:
        root = str(root).rstrip("/")
        return {**SMALL_MNIST_JOB, "trainData": mnist_data, "checkpointDir": f"{root}/ckpt",
                "exportDir": f"{root}/export", "tensorboardDir": f"{root}/tb", **overrides}

    return make


@pytest.fixture
def job(tmp_path, make_job):
    """Small MNIST jobs with their locations under `tmp_path`."""
    return lambda **overrides: make_job(tmp_path, **overrides)


@pytest.fixture
def job_file(tmp_path, job):
    """A factory of job config files, as the node agent writes them."""

    def write(**overrides) -> Path:
        path = tmp_path / "job.json"
        path.write_text(json.dumps(job(**overrides)))
        return path

    return write


# The tests TensorFlow 2.20 (the newest supported) runs too, marked `tf_version`:
# scripts/test.sh runs every test on TensorFlow 2.18 (the TPU image's) and these on 2.20
# (training/README.md, "Tests and benchmarks"). Two kinds. Those whose outcome can change
# with the TensorFlow version: tf-keras model building and fitting, optimizers and mixed
# precision, checkpoint and SavedModel formats, tf.data, tf.image and tf.io, the
# strategy. And the job's core claims, end to end on the newest version (issue 47): the
# SIGTERM save and the resume, BERT checkpoint conversion against tensorflow/models and
# the TF Hub export against tensorflow-hub, the signal handlers put back, the output
# lines. The rest test the job's own process (the hang dump, the input-wait probe, the
# command line, goodput and config arithmetic) through the same TensorFlow calls.
TF_VERSION_MODULES = {
    "test_environment.py",      # one TensorFlow, its own tf-keras
    "test_training_job.py",     # fit, checkpoints (async too), export, precision
    "test_bert.py",             # tf-keras layers, AdamW and LAMB, bfloat16, the export
    "test_input_pipeline.py",   # tf.data sharding and batching
    "test_imagenet.py",         # tf.image decoding, ResNet preprocessing
    "test_resume.py",           # the checkpointed input position, restored
    "test_checkpoint_size.py",  # the size table against real checkpoints
    "test_strategy.py",         # the cluster resolver and strategy fallbacks
    "test_record_index.py",     # tf.io.gfile reads
    "test_preemption.py",       # SIGTERM saves and exits 75, the rerun resumes; SIGKILL
    "test_bert_checkpoint.py",  # conversion, against tf-models-official's encoder
    "test_bert_hub.py",         # the export, loaded by tensorflow-hub
    "test_signal_handlers.py",  # handlers a library replaced are put back
    "test_job_output.py",       # the progress lines, one write each; the orphaned output
}


# Tests whose outcome depends on the CPU they get, marked `alone`: scripts/test.sh runs
# them after the others, with no other test beside them (on two xdist workers the other
# worker's job took the CPU they measure or budget).
ALONE_MODULES = {
    "test_perf.py",  # the input pipeline's share of the time against compute
    "test_cli.py",   # a TPU retry whose first attempt must fit a 3 s budget
}


# Files whose tests train for tens of seconds or wait on a job's subprocess: they start
# first, so pytest-xdist's workers end together (started last, in pytest's alphabetical
# order, one worker trained them alone while the other idled).
LONG_MODULES = {"test_imagenet.py", "test_bert.py", "test_bert_checkpoint.py",
                "test_job_output.py", "test_preemption.py", "test_resume.py",
                "test_signal_handlers.py", "test_goodput_recording.py"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in TF_VERSION_MODULES:
            item.add_marker(pytest.mark.tf_version)
        if item.path.name in ALONE_MODULES:
            item.add_marker(pytest.mark.alone)
    items.sort(key=lambda item: item.path.name not in LONG_MODULES)  # stable
