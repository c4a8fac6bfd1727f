"""Dashboards and alerts as code (issue 46): the platform plan declares a fleet dashboard
and one per team; every tile's filter names a documented metric on its documented
resource; the JSON parses as the Dashboard API's message; idle, hung, goodput and budget
alert policies per team, each routed to a channel of its project; a team without a
channel is refused naming the key to set."""

from __future__ import annotations

import copy
import json
import re
from datetime import datetime, timezone
from typing import Any

import pytest
from google.cloud.monitoring_dashboard_v1.types import Dashboard
from google.protobuf.json_format import ParseError

from components.stack_config import file_config
from model import monitoring as m
from model import spend
from model.archive import REPO_ROOT
from model.settings.load import load_settings
from model.settings.schema import SettingsError
from ops.plan.mock_engine import ProgramRun, run_program
from tests.repo_stacks import repo_stacks

DASHBOARD = "gcp:monitoring/dashboard:Dashboard"
POLICY = "gcp:monitoring/alertPolicy:AlertPolicy"
CHANNEL = "gcp:monitoring/notificationChannel:NotificationChannel"
LOG_METRIC = "gcp:logging/metric:Metric"
SCOPE = "gcp:monitoring/monitoredProject:MonitoredProject"
HOST, NLP, VISION = "acme-ml-shared", "acme-ml-shared-nlp", "acme-ml-shared-vision"


@pytest.fixture(scope="module")
def runs() -> dict[str, ProgramRun]:
    return {stack: run_program(file_config(stack), stack) for stack in repo_stacks()}


def by_name(run: ProgramRun, kind: str) -> dict[str, dict[str, Any]]:
    return {r.name: r.inputs for r in run.of_type(kind)}


def dashboards(run: ProgramRun) -> dict[str, dict[str, Any]]:
    return {name: json.loads(inputs["dashboardJson"])
            for name, inputs in by_name(run, DASHBOARD).items()}


def test_the_platform_declares_a_fleet_dashboard_and_one_per_team(runs) -> None:
    platform = by_name(runs["platform"], DASHBOARD)
    assert {name: inputs["project"] for name, inputs in platform.items()} == {
        "fleet-dashboard": HOST, "nlp-dashboard": NLP, "vision-dashboard": VISION}
    # The fleet sees each team's project (its metrics scope).
    assert {(i["metricsScope"], i["name"]) for i in by_name(runs["platform"], SCOPE).values()} \
        == {(HOST, NLP), (HOST, VISION)}


def test_a_team_s_dashboard_is_scoped_to_its_own_nodes(runs) -> None:
    """Its project's TPU workers: every node there is the team's, declared by the
    platform (platform-nlp-…) or by the team's own stack (team-vision-vision-…)."""
    boards = dashboards(runs["platform"])
    for team, project in (("nlp", NLP), ("vision", VISION)):
        filters = m.tile_filters(boards[f"{team}-dashboard"])
        tpu = [f for f in filters if f'resource.type="{m.TPU_WORKER}"' in f]
        assert tpu and all(f'resource.label."project_id"="{project}"' in f for f in tpu)
        assert not any("project_id" in f for f in filters if m.WORKLOAD in f)
    assert not any("project_id" in f for f in m.tile_filters(boards["fleet-dashboard"]))
    node_ids = {r.inputs["name"] for r in runs["team-vision"].of_type("gcp:tpu/v2Vm:V2Vm")}
    assert node_ids == {"team-vision-vision-trainer", "team-vision-vision-eval"}


def test_every_tile_names_a_documented_metric_on_its_documented_resource(runs) -> None:
    checked = 0
    for stack, run in runs.items():
        declared = {f"{m.USER_METRIC_PREFIX}{i['name']}": i for i in by_name(run, LOG_METRIC)
                    .values()}
        for name, board in dashboards(run).items():
            for text in m.tile_filters(board):
                metric_type, resource = m.filter_types(text)
                documented = m.documented(metric_type or "")
                if documented is None:  # one of the stack's own log-based metrics
                    assert metric_type in declared, (stack, name, text)
                    continue
                assert resource == documented.resource, (stack, name, text)
                checked += 1
    assert checked >= 3 * len(m.node_charts())


def test_the_dashboard_json_parses_as_the_dashboard_api_message(runs) -> None:
    parsed = 0
    for run in runs.values():
        for inputs in by_name(run, DASHBOARD).values():
            message = Dashboard.from_json(inputs["dashboardJson"], ignore_unknown_fields=False)
            assert message.mosaic_layout.tiles, message.display_name
            parsed += 1
    assert parsed == 5  # platform: fleet, nlp, vision; prod; dev
    broken = m.dashboard("x", m.node_charts())
    broken["mosaicLayout"]["tiles"][0]["widget"]["xyChart"]["dataSets"][0]["plot"] = "LINE"
    with pytest.raises(ParseError):
        Dashboard.from_json(json.dumps(broken), ignore_unknown_fields=False)


def policies_of(run: ProgramRun) -> dict[str, dict[str, Any]]:
    return by_name(run, POLICY)


def test_each_team_has_idle_hung_goodput_and_budget_alerts_routed_to_its_channel(runs) -> None:
    run = runs["platform"]
    channels = {r.urn: r.inputs for r in run.of_type(CHANNEL)}
    assert {c["labels"]["email_address"] for c in channels.values()} == {
        "ml-nlp@acme.example", "ml-vision@acme.example", "ml-platform@acme.example"}
    every = run.of_type(POLICY)
    # The shipped platform runs the controller: every team with a budget gets a runout
    # alert (vision's is its hourly ceiling for a month), and the stack one for the
    # controller itself (tests/infra/test_monitoring_controller.py).
    policies = [p for p in every if p.name != "controller-not-running"]
    assert len(every) == len(policies) + 1
    assert sorted(p.name for p in policies) == [
        "nlp-budget-runout", "nlp-goodput", "nlp-job-hung", "nlp-tpu-idle",
        "vision-budget-runout", "vision-goodput", "vision-job-hung", "vision-tpu-idle"]
    for policy in policies:
        # One channel (its name is known once created: the plan shows the dependency),
        # the team's own address, in the policy's own project.
        assert len(policy.inputs["notificationChannels"]) == 1, policy.name
        [channel] = [channels[urn] for urn in policy.dependencies if urn in channels]
        team = policy.name.split("-", 1)[0]
        assert channel["labels"]["email_address"] == f"ml-{team}@acme.example"
        assert channel["project"] == policy.inputs["project"], policy.name
        expected = HOST if policy.name.endswith("budget-runout") else \
            {"nlp": NLP, "vision": VISION}[team]
        assert policy.inputs["project"] == expected, policy.name


def threshold(policy: dict[str, Any]) -> dict[str, Any]:
    [condition] = policy["conditions"]
    return condition["conditionThreshold"]


def test_thresholds_and_windows_come_from_settings(runs) -> None:
    policies = policies_of(runs["platform"])
    idle = threshold(policies["nlp-tpu-idle"])
    assert (idle["comparison"], idle["thresholdValue"]) == ("COMPARISON_LT", 5)
    assert idle["duration"] == "1800s"  # nlp's shortest idleStop: 30m
    assert "accelerator/duty_cycle" in idle["filter"] and f'"{NLP}"' in idle["filter"]
    assert threshold(policies["vision-tpu-idle"])["duration"] == "3600s"  # no idleStop: 1 h
    goodput = threshold(policies["nlp-goodput"])
    assert (goodput["thresholdValue"], goodput["duration"]) == (0.6, "7200s")
    assert "workload/total_elapsed_time" in goodput["denominatorFilter"]
    assert threshold(policies["vision-goodput"])["thresholdValue"] == 0.5  # the default
    budget = threshold(policies["nlp-budget-runout"])
    assert 'metric.label."team"="nlp"' in budget["filter"]
    assert policies["nlp-budget-runout"]["conditions"][0]["displayName"] == \
        "Budget runs out within 24 h"
    for policy in (p for name, p in policies.items() if name != "controller-not-running"):
        # every threshold alert's filter names a documented metric (the controller's
        # absence condition: tests/infra/test_monitoring_controller.py)
        for text in (threshold(policy)["filter"], threshold(policy).get("denominatorFilter")):
            metric_type, resource = m.filter_types(text or 'metric.type="x"')
            known = m.documented(metric_type or "")
            assert (known is None and metric_type.startswith(m.USER_METRIC_PREFIX)) or \
                (known is not None and resource == known.resource) or text is None


def test_log_metrics_count_what_the_agent_and_the_budget_function_write(runs) -> None:
    metrics = by_name(runs["platform"], LOG_METRIC)
    assert {(i["project"], i["name"]) for i in metrics.values()} == {
        (NLP, "platform-job-hung"), (VISION, "platform-job-hung"),
        (HOST, "platform-budget-runout"), (HOST, "platform-team-spend"),
        (HOST, "platform-controller-runs")}  # the shipped platform runs the controller
    agent = "\n".join(p.read_text() for p in (REPO_ROOT / "node_agent").glob("*.py"))
    assert f'print(f"{m.AGENT_PREFIX}{{message}}"' in agent  # common.log's prefix
    for line in m.HUNG_LINES:  # the agent still writes each line the metric counts
        assert re.search(rf'note\(f?"{re.escape(line)}', agent), line
    message = spend.BudgetMessage("b", "A", "nlp", 100.0, 1000.0,
                                  datetime(2026, 12, 1, 8, tzinfo=timezone.utc), None, "USD")
    decision = spend.decide(message, 150.5, 50.0, 24)
    assert decision.act  # 150.5 + 50 x 24 > 1000: the runout line
    assert re.match(m.SPEND_PATTERN, decision.reason).group(1) == "150.50"
    main = (REPO_ROOT / "functions/budget_stop/main.py").read_text()
    assert 'log("budget", team=config.team, budget=message.budget_id, act=decision.act,' in main


def test_a_single_team_stack_alerts_with_its_own_channel_or_not_at_all(runs) -> None:
    prod = policies_of(runs["prod"])
    assert sorted(prod) == ["stack-goodput", "stack-job-hung", "stack-tpu-idle"]
    assert {p["project"] for p in prod.values()} == {"acme-ml-prod"}
    assert [c["labels"] for c in by_name(runs["prod"], CHANNEL).values()] == [
        {"email_address": "ml-research@acme.example"}]
    assert policies_of(runs["dev"]) == {} and by_name(runs["dev"], CHANNEL) == {}
    # A team stack declares none: its platform declares its team's.
    assert not by_name(runs["team-vision"], DASHBOARD) and not policies_of(runs["team-vision"])


def platform_config(**changes: Any) -> dict[str, str]:
    config = file_config("platform")
    teams = json.loads(config["tpu-stack:teams"])
    for team, alerts in changes.items():
        if alerts is None:
            teams[team].pop("alerts")
        else:
            teams[team]["alerts"] = alerts
    return {**config, "tpu-stack:teams": json.dumps(teams)}


def problems(config: dict[str, str]) -> list[tuple[str, str]]:
    with pytest.raises(SettingsError) as error:
        load_settings(config, "platform")
    return error.value.problems


def test_a_team_without_a_channel_is_refused_with_the_key_to_set() -> None:
    [(key, message)] = problems(platform_config(vision=None))
    assert key == "tpu-stack:teams.vision.alerts.email"
    assert "tpu-stack:teams.vision.alerts.pubsubTopic" in message
    [(key, _)] = problems(platform_config(nlp={"goodputTarget": 0.9}))
    assert key == "tpu-stack:teams.nlp.alerts.email"


def test_bad_alert_settings_are_refused_each_naming_its_key() -> None:
    found = dict(problems(platform_config(vision={
        "email": "not-an-address", "goodputWindow": "90s", "idleMinutes": 5000})))
    assert set(found) == {"tpu-stack:teams.vision.alerts.email",
                          "tpu-stack:teams.vision.alerts.goodputWindow",
                          "tpu-stack:teams.vision.alerts.idleMinutes"}
    topic = problems(platform_config(vision={"pubsubTopic": "alerts"}))
    assert [key for key, _ in topic] == ["tpu-stack:teams.vision.alerts.pubsubTopic"]


def test_a_pubsub_channel_is_declared_from_its_topic() -> None:
    config = platform_config(vision={"pubsubTopic": "projects/acme-ml-ops/topics/tpu-alerts"})
    run = run_program(config, "platform")
    vision = by_name(run, CHANNEL)["vision-alerts-channel"]
    assert (vision["type"], vision["labels"]) == (
        "pubsub", {"topic": "projects/acme-ml-ops/topics/tpu-alerts"})


def test_a_team_stack_may_not_set_alerts_of_its_own() -> None:
    config = copy.deepcopy(file_config("team-vision"))
    config["tpu-stack:alerts"] = json.dumps({"email": "x@acme.example"})
    with pytest.raises(SettingsError) as error:
        load_settings(config, "team-vision")
    assert [key for key, _ in error.value.problems] == ["tpu-stack:alerts"]


def test_tiles_fill_the_mosaic_without_overlapping() -> None:
    charts = [*m.node_charts(), *m.goodput_charts(), m.hung_chart("x"), m.spend_chart("y")]
    tiles = m.dashboard("x", charts)["mosaicLayout"]["tiles"]
    cells = [(t["xPos"] + dx, t["yPos"] + dy) for t in tiles
             for dx in range(t["width"]) for dy in range(t["height"])]
    assert len(cells) == len(set(cells)) == len(charts) * m.TILE_WIDTH * m.TILE_HEIGHT
    assert max(x for x, _ in cells) < m.COLUMNS
    assert [t["widget"]["title"] for t in tiles] == [c.title for c in charts]


def test_a_platform_s_own_alerts_watch_no_nodes_it_has_not_and_route_its_controller(
        runs) -> None:
    """The shipped platform sets `tpu-stack:alerts` and declares no node of its own (its
    teams' are under teams.<t>.nodes): no idle, hung or goodput policy watches an empty
    project; its channel gets the controller's policy alone, so a team added or removed
    never touches it."""
    run = runs["platform"]
    policies = policies_of(run)
    assert not [name for name in policies if name.startswith("stack-")]
    assert "stack-dashboard" not in by_name(run, DASHBOARD)
    channels = {r.urn: r.inputs for r in run.of_type(CHANNEL)}
    [controller] = [p for p in run.of_type(POLICY) if p.name == "controller-not-running"]
    routed = [channels[urn] for urn in controller.dependencies if urn in channels]
    assert [c["labels"]["email_address"] for c in routed] == ["ml-platform@acme.example"]
    assert routed[0]["project"] == HOST


def test_a_single_team_stack_s_scope_matches_its_node_ids() -> None:
    naming = load_settings(file_config("prod"), "prod").naming
    scope = m.node_scope(naming.node_prefix())[m.TPU_WORKER]
    assert scope == 'resource.label."node_id"=monitoring.regex.full_match("prod-.*")'
    pattern = re.search(r'full_match\("([^"]+)"\)', scope).group(1)
    assert re.fullmatch(pattern, naming.tpu_node("pod"))
    long = naming.log_metric("job-hung", "t" * 20)
    assert len(naming.log_metric("x" * 200)) == 100 and long.startswith("prod-tttt")
