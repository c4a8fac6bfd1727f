"""`checkpointEvery: auto`: the job's checkpoint_interval line read into the agent's
status (`checkpointInterval`: the interval in use and why)."""

from __future__ import annotations

from node_agent import job_lines

LINE = ("tpu_training checkpoint_interval seconds=587.9 save_cost=2.000 mtbf=86400 "
        "reason=young_daly")


def test_the_interval_line_is_read_into_a_status_field() -> None:
    run = job_lines.JobRun()
    assert run.read(LINE + "\n") == "interval"  # not a save: the agent publishes it alone
    assert run.checkpoint_interval == {"seconds": 587.9, "saveCost": 2.0, "mtbf": 86400.0,
                                       "reason": "young_daly"}
    # A torn line keeps the interval there is.
    assert run.read("tpu_training checkpoint_interval seconds=12.0") is None
    assert run.checkpoint_interval["seconds"] == 587.9
