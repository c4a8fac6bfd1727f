"""The preview knows BERT: training/README's pod-slice stack loads as a stack file, a
batch that cannot fit a replica's HBM is refused naming the chip's HBM, and the sizes
the preview's estimates use are BERT's."""

from __future__ import annotations

import re
import shutil

import pytest

from components.stack_config import file_config, load_yaml
from model import catalog
from model.archive import REPO_ROOT
from model.settings.load import load_settings
from model.settings.schema import SettingsError
from model.stop_save import step_seconds
from tests.infra.stack_fixtures import as_cli, config, job, node
from tpu_training.config import JobConfig, train_device_bytes

README = (REPO_ROOT / "training" / "README.md").read_text()
STACK = README.split("<!-- bert-stack -->")[1].split("<!-- /bert-stack -->")[0]
STACK_YAML = re.search(r"```yaml\n(.*?)```", STACK, re.S)[1]
JOB_KEY = "tpu-stack:jobs.bert-large.globalBatchSize"


@pytest.fixture
def bert_stack(tmp_path):
    """The README's stack as a stack file beside the project's Pulumi.yaml; `load(**job)`
    reads it as the CLI would, the job's keys changed."""
    shutil.copy(REPO_ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")

    def load(**changes):
        data = load_yaml(STACK_YAML)
        data["config"]["tpu-stack:jobs"]["bert-large"].update(changes)
        (tmp_path / "Pulumi.bert.yaml").write_text(_dump(data))
        return load_settings(file_config("bert", tmp_path), "bert")

    return load


def _dump(data: dict) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False)


def test_the_readme_stack_trains_bert_large_on_a_pod_slice(bert_stack):
    settings = bert_stack()
    ((node_settings, job_config),) = settings.node_jobs
    assert node_settings.tpu.multi_host and node_settings.tpu.hosts == 4
    assert node_settings.tpu.accelerator_type == "v4-32"
    assert (job_config.model, job_config.recordFormat, job_config.maxSeqLength,
            job_config.vocabSize) == ("bert_large", "bert_pretraining", 128, 30522)
    # google-research/bert's example count: 1 M steps of 256 examples.
    assert job_config.trainSteps * job_config.globalBatchSize == 1_000_000 * 256


def test_a_batch_that_cannot_fit_the_hbm_is_refused_naming_it(bert_stack):
    with pytest.raises(SettingsError) as error:
        bert_stack(globalBatchSize=8192)
    ((key, message),) = error.value.problems
    assert key == JOB_KEY
    assert "a v4 chip has 32 GiB" in message and "512 examples per replica" in message
    # The README quotes the preview's message word for word.
    assert f"{key}: {message}" in README
    most = int(re.search(r"at most (\d+)", message)[1])
    assert 2048 < most < 8192 and most % 16 == 0
    bert_stack(globalBatchSize=most)  # the advice is itself accepted


def test_a_longer_sequence_needs_a_smaller_batch(bert_stack):
    bert_stack(globalBatchSize=512, maxSeqLength=512, maxPredictionsPerSeq=76)
    with pytest.raises(SettingsError) as error:
        bert_stack(maxSeqLength=512, maxPredictionsPerSeq=76)
    assert error.value.problems[0][0] == JOB_KEY


def test_two_replicas_a_chip_share_its_hbm():
    """v3 runs a replica per TensorCore, two a chip: each has half the chip's 32 GiB."""
    bert = job(model="bert_base", globalBatchSize=8 * 1024, trainSteps=1000)
    data = config(tpu_stack_nodes=[node(zone="us-central1-a", acceleratorType="v3-8")],
                  tpu_stack_jobs={"mnist": bert})
    with pytest.raises(SettingsError) as error:
        load_settings(as_cli(data), "test")
    ((key, message),) = error.value.problems
    assert key == "tpu-stack:jobs.mnist.globalBatchSize"
    assert "a v3 chip has 32 GiB (16 GiB per replica, 2 per chip" in message


def test_image_models_get_no_hbm_estimate():
    resnet = JobConfig.from_dict({"model": "resnet50", "trainData": "x", "globalBatchSize": 8,
                                  "trainSteps": 10, "stepsPerExecution": 10}, resolved=False)
    assert train_device_bytes(resnet, 8) is None


def test_google_research_berts_tpu_recipe_fits():
    """run_pretraining.py's README example: BERT-Base, batch 32 at 128 tokens (and its
    512-token phase at 256 on a v3-8, 32 a replica)."""
    base = JobConfig.from_dict({"model": "bert_base", "trainData": "x", "globalBatchSize": 256,
                                "trainSteps": 1000, "maxSeqLength": 512,
                                "maxPredictionsPerSeq": 76}, resolved=False)
    v3 = catalog.generation("v3")
    assert train_device_bytes(base, 256 // 8) < v3.hbm_gib_per_chip * 2**30 / 2


def test_the_step_estimate_uses_berts_flops(bert_stack):
    settings = bert_stack()
    ((node_settings, job_config),) = settings.node_jobs
    # 6 x forward multiply-adds x 2048 examples over 16 v4 chips at the assumed 30%.
    seconds = step_seconds(node_settings, job_config)
    flops = 2048 * 6 * 40.1e9  # bert_large at 128 tokens: ~40 G multiply-adds forward
    assert seconds == pytest.approx(flops / (16 * 275e12 * 0.3), rel=0.05)
