"""The pack warns on a team's TPU node with neither maxRuntime nor idleStop (issue 36),
as a warning: `tpuctl plan` shows it and does not fail."""

from __future__ import annotations

import copy
import json

from components.stack_config import file_config
from ops.plan.offline import offline_plan
from policy.evaluate import evaluate, load_config


def test_a_team_node_without_limits_is_an_advisory_warning() -> None:
    config = dict(file_config("platform"))
    teams = json.loads(config["tpu-stack:teams"])
    clean = evaluate(offline_plan("platform", config).to_json(), load_config())
    assert [v for v in clean if v.policy == "tpu-team-node-limits"] == []  # both set limits

    bare = copy.deepcopy(teams)
    for node in bare["nlp"]["nodes"]:
        node.pop("maxRuntime", None)
        node.pop("idleStop", None)
    config["tpu-stack:teams"] = json.dumps(bare)
    warned = [v for v in evaluate(offline_plan("platform", config).to_json(), load_config())
              if v.policy == "tpu-team-node-limits"]
    assert len(warned) == 2 and all(v.advisory for v in warned)
    assert warned[0].message.startswith("TPU node ") and "of team nlp has neither maxRuntime " \
        "nor idleStop" in warned[0].message
    assert "advisory" in warned[0].to_json()


def test_an_advisory_violation_does_not_fail_the_plan(monkeypatch, capsys) -> None:
    from ops.commands import plan as command
    from policy.evaluate import Violation

    result = offline_plan("dev")
    monkeypatch.setattr(command, "evaluate", lambda *_: [
        Violation("tpu-team-node-limits", "warned", None, advisory=True)])
    assert command.print_report(result, "table", None) == 0
    assert "tpu-team-node-limits (advisory) (stack): warned" in capsys.readouterr().out
    monkeypatch.setattr(command, "evaluate", lambda *_: [Violation("x", "blocked", None)])
    assert command.print_report(result, "table", None) == 1
