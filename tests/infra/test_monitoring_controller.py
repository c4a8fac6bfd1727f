"""With `tpu-stack:controller` (issue 46): the controller's run lines counted and an alert
when none came for three intervals (a metric-absence condition), routed to the stack's
own channel or every team's; and a budget-runout alert for every team with a budget, an
alert-only one too (the controller logs its budget line each run)."""

from __future__ import annotations

import json
from typing import Any

from components.stack_config import file_config
from model import monitoring as m
from ops.plan.mock_engine import ProgramRun, run_program

POLICY = "gcp:monitoring/alertPolicy:AlertPolicy"
CHANNEL = "gcp:monitoring/notificationChannel:NotificationChannel"
LOG_METRIC = "gcp:logging/metric:Metric"
HOST = "acme-ml-shared"


def config(stack: str, interval: str | None = "5m", **extra: Any) -> dict[str, str]:
    values = dict(file_config(stack))
    if interval is not None:
        values["tpu-stack:controller"] = json.dumps({"enabled": True, "interval": interval})
    else:  # the shipped platform runs one
        values.pop("tpu-stack:controller", None)
    if stack == "platform":  # vision: a budget that only alerts
        teams = json.loads(values["tpu-stack:teams"])
        teams["vision"]["budgetUsdPerMonth"] = 5000
        values["tpu-stack:teams"] = json.dumps(teams)
    return {**values, **{f"tpu-stack:{k}": json.dumps(v) for k, v in extra.items()}}


def by_name(run: ProgramRun, kind: str) -> dict[str, Any]:
    return {r.name: r for r in run.of_type(kind)}


def absent(policy: Any) -> dict[str, Any]:
    [condition] = policy.inputs["conditions"]
    return condition["conditionAbsent"]


def test_the_controller_not_running_alert_waits_three_intervals() -> None:
    run = run_program(config("platform", "10m"), "platform")
    metric = by_name(run, LOG_METRIC)["controller-runs"].inputs
    assert (metric["project"], metric["name"]) == (HOST, "platform-controller-runs")
    assert metric["filter"] == m.CONTROLLER_RUNS.filter
    assert 'jsonPayload.message="controller run"' in metric["filter"]
    policy = by_name(run, POLICY)["controller-not-running"]
    condition = absent(policy)
    assert condition["duration"] == "1800s"  # 3 x 10 min
    assert condition["filter"] == ('metric.type="logging.googleapis.com/user/'
                                   'platform-controller-runs" resource.type="cloud_run_revision"')
    [aggregation] = condition["aggregations"]
    assert aggregation["crossSeriesReducer"] == "REDUCE_SUM"  # one series for all revisions
    assert policy.inputs["project"] == HOST


def test_without_a_channel_of_its_own_the_platform_alerts_every_team() -> None:
    values = config("platform")
    values.pop("tpu-stack:alerts")  # the shipped platform's own channel
    run = run_program(values, "platform")
    channels = {r.urn: r.inputs for r in run.of_type(CHANNEL)}
    policy = by_name(run, POLICY)["controller-not-running"]
    routed = [channels[urn] for urn in policy.dependencies if urn in channels]
    assert sorted(c["labels"]["email_address"] for c in routed) == [
        "ml-nlp@acme.example", "ml-vision@acme.example"]
    assert {c["project"] for c in routed} == {HOST}
    assert len(policy.inputs["notificationChannels"]) == 2
    assert absent(policy)["duration"] == "900s"
    # One channel per team in the host project, shared with the budget alerts.
    host = [c for c in channels.values() if c["project"] == HOST]
    assert len(host) == 2


def test_with_its_own_channel_the_stack_alone_is_alerted() -> None:
    run = run_program(config("platform", alerts={"email": "ops@acme.example"}), "platform")
    channels = {r.urn: r.inputs for r in run.of_type(CHANNEL)}
    policy = by_name(run, POLICY)["controller-not-running"]
    [routed] = [channels[urn] for urn in policy.dependencies if urn in channels]
    assert routed["labels"]["email_address"] == "ops@acme.example"
    prod = run_program(config("prod", "1m"), "prod")
    policy = by_name(prod, POLICY)["controller-not-running"]
    assert (policy.inputs["project"], absent(policy)["duration"]) == ("acme-ml-prod", "180s")
    dev = run_program(config("dev"), "dev")  # no tpu-stack:alerts: counted, not alerted
    assert "controller-runs" in by_name(dev, LOG_METRIC)
    assert "controller-not-running" not in by_name(dev, POLICY)


def test_every_team_with_a_budget_gets_a_runout_alert_with_the_controller() -> None:
    without = by_name(run_program(config("platform", None), "platform"), POLICY)
    assert "nlp-budget-runout" in without and "vision-budget-runout" not in without
    run = run_program(config("platform"), "platform")
    policies = by_name(run, POLICY)
    assert {"nlp-budget-runout", "vision-budget-runout"} <= set(policies)
    [condition] = policies["vision-budget-runout"].inputs["conditions"]
    assert 'metric.label."team"="vision"' in condition["conditionThreshold"]["filter"]
    assert policies["vision-budget-runout"].inputs["project"] == HOST
    assert "controller-not-running" not in without
