"""The BERT recipe rehearses like the CNNs: records in BERT's pre-training format from
synth, a CPU-sized BERT, the user's own records with `--data`, an error printed once, and
`status --offline` saying why the last rehearsal failed instead of sending the user back
to it."""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from components.stack_config import file_config
from model.archive import REPO_ROOT
from model.pulumi_types import TPU_V2_VM
from ops.rehearse import rehearsal as rehearse
from ops.rehearse.rehearsal import REHEARSAL_BERT_SHAPE, rehearsal_job, synth_args
from ops.tpu.status import no_rehearsal
from tpu_training.config import JobConfig

README = (REPO_ROOT / "training" / "README.md").read_text()
STACK_YAML = re.search(r"```yaml\n(.*?)```", README.split("<!-- bert-stack -->")[1], re.S)[1]


def bert_config(tmp_path: Path) -> dict[str, str]:
    """training/README's BERT-Large stack, as the CLI hands it to the program."""
    shutil.copy(REPO_ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    (tmp_path / "Pulumi.bert.yaml").write_text(STACK_YAML)
    return file_config("bert", tmp_path)


def bert_job(tmp_path: Path) -> dict:
    return json.loads(bert_config(tmp_path)["tpu-stack:jobs"])["bert-large"] | {
        "checkpointDir": "gs://ckpt/ckpt/bert/", "exportDir": "gs://ckpt/export/bert/",
        "tensorboardDir": "gs://logs/tb/bert/", "trainData": "gs://data/bert/train-*.tfrecord",
        "evalData": "gs://data/bert/eval-*.tfrecord"}


def test_bert_large_rehearses_as_a_cpu_sized_bert_tiny(tmp_path: Path) -> None:
    job, changed = rehearsal_job(bert_job(tmp_path), tmp_path / "gcs")
    assert job["model"] == "bert_tiny" and changed["model"] == ("bert_large", "bert_tiny")
    assert {key: job[key] for key in REHEARSAL_BERT_SHAPE} == {
        "maxSeqLength": 32, "maxPredictionsPerSeq": 5, "vocabSize": 512}
    assert "imageSize" not in job and "widthMultiplier" not in job
    assert changed["warmupSteps"] == ("1250", "0")  # 1% of 125,000 steps, of 40: none
    config = JobConfig.from_dict(job)  # the job's own rules accept it
    assert config.recordFormat == "bert_pretraining"
    args = synth_args("trainData", job)
    assert "--image-size" not in args
    assert args[args.index("--max-seq-length") + 1] == "32"
    assert args[args.index("--vocab-size") + 1] == "512"


def test_own_records_keep_the_jobs_record_shape_and_folder(tmp_path: Path) -> None:
    job, _ = rehearsal_job(bert_job(tmp_path), tmp_path / "gcs", data=tmp_path / "mine")
    assert job["trainData"] == f"{tmp_path}/mine/train-*.tfrecord"
    assert job["evalData"] == f"{tmp_path}/mine/eval-*.tfrecord"
    assert (job["model"], job["maxSeqLength"], job["maxPredictionsPerSeq"]) == (
        "bert_tiny", 128, 20)
    assert "vocabSize" not in job  # BERT's 30522, as the stack's job


def test_a_failed_synth_is_one_error_once(tmp_path: Path) -> None:
    """Before: one synth per data key ran even after the first failed, so its error came
    twice. An image option on a BERT job is what main's rehearsal got wrong."""
    job = {"model": "bert_tiny", "imageSize": 32, "globalBatchSize": 8,
           "trainData": f"{tmp_path}/train-*.tfrecord", "evalData": f"{tmp_path}/eval-*.tfrecord"}
    with pytest.raises(rehearse.RehearsalError) as error:
        rehearse.write_datasets(job, Console(file=io.StringIO()))
    assert str(error.value).count("applies to image models, not bert_tiny") == 1


def test_missing_own_records_fail_before_boot_and_status_says_why(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "train-00000-of-00001.tfrecord").write_bytes(b"")
    code = rehearse.rehearse("bert", workdir=tmp_path / "rehearsal", console=Console(),
                             data=mine, config=bert_config(tmp_path))
    assert code == 2
    err = capsys.readouterr().err
    expected = (f"--data {mine}: no file matches eval-*.tfrecord (the file pattern of the "
                "stack's evalData)")
    assert err.count(expected) == 1
    advice = no_rehearsal("bert", tmp_path / "rehearsal")
    assert advice.startswith("the last `tpuctl rehearse --stack bert` failed before a node "
                             f"booted: node-bert: {expected}")
    assert advice.endswith("fix that, then run it again")


def test_the_readme_bert_stack_rehearses_end_to_end(tmp_path: Path) -> None:
    """A v4-32 slice: four workers boot, worker 0 trains bert_tiny on synthetic BERT
    records, saves and evaluates; the agent reports the job succeeded."""
    workdir = tmp_path / "rehearsal"
    out = tmp_path / "out.txt"
    with out.open("w") as file:
        code = rehearse.rehearse("bert", workdir=workdir, console=Console(file=file, width=200),
                                 steps=4, batch=8, config=bert_config(tmp_path))
    text = out.read_text()
    assert code == 0, text[-3000:]
    assert "model: bert_large -> bert_tiny" in text
    status = json.loads((workdir / "node-bert" / "status-objects" / "worker-0" /
                         "status.json").read_text())
    assert status["state"] == "succeeded" and int(status["step"]) == 4
    checkpoints = list((workdir / "node-bert" / "gcs").rglob("ckpt-4.index"))
    assert len(checkpoints) == 1


def test_the_readme_bert_stack_plans_without_warnings(tmp_path: Path) -> None:
    """Its no-progress deadline (150 s: five 30 s executions) once exceeded its checkpoint
    interval (a minute by default), a warning of its own."""
    from ops.plan.offline import offline_plan
    from ops.plan.report import plain

    plan = plain(offline_plan("bert", bert_config(tmp_path)).to_json())
    assert plan["warnings"] == []
    assert any(r["type"] == TPU_V2_VM for r in plan["resources"])
