"""`checkpointEvery: auto`: Young/Daly's interval, sqrt(2 x save cost x MTBF), from the
save the job measured and the node's mean time between disruptions; at least a write."""

from __future__ import annotations

import io
import math
import re

import pytest

from tpu_training import train
from tpu_training.config import JobConfig, JobConfigError, checkpoint_interval

INTERVAL_LINE = re.compile(r"tpu_training checkpoint_interval seconds=(\d+\.\d) "
                           r"save_cost=(\d+\.\d{3}) mtbf=(\d+) reason=(young_daly|write_bound)")


def test_young_dalys_interval_and_its_floor():
    # A save that costs training 2 s on a node disrupted once a day: sqrt(2 x 2 x 86400).
    chosen = checkpoint_interval(2.0, 86_400, write_seconds=30.0)
    assert chosen.seconds == pytest.approx(587.88, abs=0.01)
    assert chosen.reason == "young_daly"
    assert chosen.line() == ("checkpoint_interval seconds=587.9 save_cost=2.000 mtbf=86400 "
                             "reason=young_daly")
    # An asynchronous save costs training milliseconds, but its write takes longer than
    # the optimum: never save before the last save is written.
    quick = checkpoint_interval(0.002, 86_400, write_seconds=40.0)
    assert (quick.seconds, quick.reason) == (40.0, "write_bound")


def test_auto_is_the_only_word():
    base = {"model": "mnist_cnn", "trainData": "x", "globalBatchSize": 8, "trainSteps": 10,
            "stepsPerExecution": 10, "checkpointEverySteps": 10}
    assert JobConfig.from_dict({**base, "checkpointEvery": "auto"},
                               resolved=False).checkpointEvery == "auto"
    with pytest.raises(JobConfigError) as error:
        JobConfig.from_dict({**base, "checkpointEvery": "hourly"}, resolved=False)
    assert error.value.problems[0][0] == "checkpointEvery"
    assert "must be 'auto'" in error.value.problems[0][1]
    resolved = JobConfig.from_dict({**base, "checkpointEvery": "auto"}, resolved=False
                                   ).resolve(data_root="gs://d", checkpoint_dir="gs://c",
                                             export_dir="gs://e", tensorboard_dir="gs://t",
                                             mtbf_seconds=86_400)
    assert JobConfig.from_dict(resolved.to_dict()) == resolved  # the node reads it back
    with pytest.raises(JobConfigError, match="mtbfSeconds: unknown key"):
        JobConfig.from_dict({**base, "mtbfSeconds": 60}, resolved=False)  # the node's only


def test_the_job_chooses_and_prints_its_interval(strategy, job):
    config = JobConfig.from_dict({**job(trainSteps=40, checkpointEverySteps=20),
                                  "checkpointEvery": "auto", "mtbfSeconds": 3600.0})
    out = io.StringIO()
    train.run(config, strategy=strategy, out=out)
    lines = out.getvalue().splitlines()
    chosen = [INTERVAL_LINE.fullmatch(line) for line in lines
              if line.startswith("tpu_training checkpoint_interval ")]
    assert chosen and all(chosen), lines
    first = chosen[0]
    # It follows the first interval save's line, from that save's own figures.
    saved = next(line for line in lines if line.startswith("tpu_training saved step=20 "))
    assert lines.index(saved) < lines.index(first[0])
    blocked = float(re.search(r" blocked=(\d+\.\d+)", saved)[1])
    written = float(re.search(r" seconds=(\d+\.\d+)", saved)[1])
    assert float(first[2]) == pytest.approx(blocked, abs=1e-3)
    assert int(first[3]) == 3600
    # sqrt(2 x cost x MTBF) from the cost as printed (to 3 decimals), or the write.
    cost = float(first[2])
    low = max(math.sqrt(2 * max(cost - 0.0005, 0) * 3600), written)
    high = max(math.sqrt(2 * (cost + 0.0005) * 3600), written)
    assert low - 0.05 <= float(first[1]) <= high + 0.05, (first[0], written)
