"""Cloud Monitoring facts and the dashboards and alerts tpu-stack declares from them.

The ONLY place the stack names a metric type, a monitored resource type or a resource
label: every dashboard tile and alert condition is built from `METRICS` below, each
entry citing where it is documented (docs/tpu-facts.md, "Dashboards and alerts").
Pure: components/monitoring.py turns these values into Pulumi resources.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# ---- monitored resources ---------------------------------------------------------

# A TPU VM worker: cloud.google.com/tpu/docs/troubleshooting/tpu-vm-monitoring ("TPU
# Worker resource"); its labels as google/cloud-tpu-monitoring-debugging's GCE dashboards
# and stack-trace log metric use them (gcp_resources/gce/resources/dashboard/
# logging_dashboard/log_metrics/stack_trace_counter.tf: EXTRACT(resource.labels.zone |
# node_id | worker_id)). project_id: every monitored resource's (unconfirmed as a label
# filter on this one).
TPU_WORKER = "tpu_worker"
TPU_WORKER_LABELS = ("project_id", "zone", "node_id", "worker_id")
# The resource of the five accelerator/* metrics (duty cycle, TensorCore, HBM): the TPU
# pages say "TPU Worker"; Google's own code puts another TPU metric (instance/
# interruption_count) on `tpu.googleapis.com/GceTpuWorker`, and third-party code claims
# duty_cycle is there too. The metric list (monitoring/api/metrics_gcp) was not readable:
# unconfirmed (docs/tpu-facts.md, "Dashboards and alerts"), and this is the one place to
# change if a running node shows them elsewhere.
TPU_WORKER_ACCELERATOR = TPU_WORKER
# The goodput library's resource: AI-Hypercomputer/ml-goodput-measurement
# ml_goodput_measurement/src/monitoring.py (_upload_goodput_metrics_to_gcm,
# resource_labels location, workload_id, replica_id).
WORKLOAD = "compute.googleapis.com/Workload"
WORKLOAD_LABELS = ("location", "workload_id", "replica_id")
# A Cloud Run functions (2nd gen) function's logs, where the budget-stop function
# prints its decisions (functions/budget_stop/main.py `log`). Unconfirmed here: read from
# memory of cloud.google.com/functions/docs/monitoring/logging, not from a stored page.
CLOUD_RUN_REVISION = "cloud_run_revision"
ANY_RESOURCE = ""  # a log-based metric on whatever resource its entries carry

USER_METRIC_PREFIX = "logging.googleapis.com/user/"

TPU_VM_DOC = "cloud.google.com/tpu/docs/troubleshooting/tpu-vm-monitoring"
GOODPUT_SOURCE = ("AI-Hypercomputer/ml-goodput-measurement "
                  "ml_goodput_measurement/src/monitoring.py")


@dataclass(frozen=True)
class Metric:
    """A metric type, the monitored resource it is written on, and where that is said."""

    type: str
    resource: str
    unit: str
    source: str
    confirmed: bool = True  # False: the type is documented but a detail is not (note)
    note: str = ""


def _tpu(name: str, unit: str, note: str = "", resource: str = TPU_WORKER) -> Metric:
    return Metric(f"tpu.googleapis.com/{name}", resource, unit, TPU_VM_DOC,
                  confirmed=not note, note=note)


def _accelerator(name: str, unit: str) -> Metric:
    return _tpu(f"accelerator/{name}", unit, _ACCELERATOR_NOTE, TPU_WORKER_ACCELERATOR)


def _workload(name: str, unit: str) -> Metric:
    return Metric(f"compute.googleapis.com/workload/{name}", WORKLOAD, unit, GOODPUT_SOURCE)


_ACCELERATOR_NOTE = ("its monitored resource (tpu_worker or GceTpuWorker), unit and the "
                    "generations reporting it are not in a stored source (docs/tpu-facts.md)")

# The TPU VM metrics (tpu-vm-monitoring lists all ten; cloud-tpu-monitoring-debugging's
# GCE dashboards filter cpu, memory, network and idle_duration on resource tpu_worker).
METRICS: dict[str, Metric] = {
    "duty_cycle": _accelerator("duty_cycle", "%"),
    "tensorcore_utilization": _accelerator("tensorcore_utilization", "%"),
    "memory_used": _accelerator("memory_used", "By"),
    "memory_total": _accelerator("memory_total", "By"),
    "memory_bandwidth_utilization": _accelerator("memory_bandwidth_utilization", "%"),
    "idle_duration": _tpu("tpu/tensorcore/idle_duration", "s"),
    "cpu_utilization": _tpu("cpu/utilization", "%"),
    "memory_usage": _tpu("memory/usage", "By"),
    "network_received": _tpu("network/received_bytes_count", "By"),
    "network_sent": _tpu("network/sent_bytes_count", "By"),
    # What the goodput library's GoodputMonitor uploads (a `goodputRecording` job starts
    # it: training/tpu_training/goodput_recording.py): labels goodput_source /
    # badput_source, accelerator_type.
    "goodput_time": _workload("goodput_time", "s"),
    "badput_time": _workload("badput_time", "s"),
    "disruptions": _workload("disruptions", "1"),
    "max_productive_steps": _workload("max_productive_steps", "1"),
    "step_time_deviation": _workload("step_time_deviation", "s"),
    "total_elapsed_time": _workload("total_elapsed_time", "s"),
}

# ---- the stack's own log-based metrics -----------------------------------------------

# The node agent's lines (node_agent/common.py `log`: "tpu-stack-agent: " + message on
# stderr, so journald): a hang it stopped (node_agent/job.py `stop_hung`) and the
# restart after it (node_agent/agent.py `_after_hang`). tests/infra/test_monitoring.py
# checks the agent still writes them.
AGENT_PREFIX = "tpu-stack-agent: "
HUNG_LINES = ("no progress for", "hung job stopped")
# The budget-stop function's decision line: {"message": "budget", "team", "act", "reason"}
# (functions/budget_stop/main.py `handle`); `act` is true at the budget or when the burn
# rate reaches it within budgetHorizonHours (spend.decide), and `reason` starts
# "spend <usd> ..." (spend.decide), the meter's figure charted per team.
BUDGET_LINE = "budget"
SPEND_PATTERN = r"spend ([0-9]+\.?[0-9]*)"
# The controller's lines (functions/controller/main.py, one JSON object a line on stdout,
# as the budget-stop function's `log`): one per run, `{"message": "controller run", ...}`,
# and, each run, per team with a budget, the budget line above with the same `team`,
# `act` and `reason` (ops/controller/spend_lines.py), `"source": "controller"`.
# tests/controller/test_controller_lines.py checks the function writes them.
CONTROLLER_RUN_LINE = "controller run"
CONTROLLER_SOURCE = "controller"


@dataclass(frozen=True)
class LogMetric:
    """A log-based metric the stack declares (gcp.logging.Metric)."""

    logical: str  # naming: Naming.log_metric(logical, team)
    filter: str
    description: str
    resource: str
    labels: dict[str, str] = field(default_factory=dict)  # label → extractor
    value_extractor: str | None = None  # a distribution of this value; None: a count


def _hung_filter() -> str:
    lines = " OR ".join(f'textPayload:"{AGENT_PREFIX}{line}"' for line in HUNG_LINES)
    return f"({lines})"


# Where journald lines of a TPU VM land in Cloud Logging, and under which log name and
# resource, is unconfirmed (docs/tpu-facts.md): the filter names no log and no resource.
HUNG = LogMetric(
    "job-hung", _hung_filter(),
    "tpu-stack node agent: a job hung (no progress past its deadline) or restarted after one",
    ANY_RESOURCE)
BUDGET_RUNOUT = LogMetric(
    "budget-runout",
    f'resource.type="{CLOUD_RUN_REVISION}" jsonPayload.message="{BUDGET_LINE}" '
    f"jsonPayload.act=true",
    "tpu-stack budget-stop function or controller: a team's spend reached its budget or "
    "reaches it within budgetHorizonHours at the meter's burn rate",
    CLOUD_RUN_REVISION, {"team": "EXTRACT(jsonPayload.team)"})
SPEND = LogMetric(
    "team-spend",
    f'resource.type="{CLOUD_RUN_REVISION}" jsonPayload.message="{BUDGET_LINE}"',
    "tpu-stack budget-stop function or controller: a team's month-to-date spend (USD, the "
    "larger of the reported cost and the meter) at each notification or controller run",
    CLOUD_RUN_REVISION, {"team": "EXTRACT(jsonPayload.team)"},
    value_extractor=f'REGEXP_EXTRACT(jsonPayload.reason, "{SPEND_PATTERN}")')

CONTROLLER_RUNS = LogMetric(
    "controller-runs",
    f'resource.type="{CLOUD_RUN_REVISION}" jsonPayload.message="{CONTROLLER_RUN_LINE}"',
    "tpu-stack controller: one per run (Cloud Scheduler calls it every interval)",
    CLOUD_RUN_REVISION)


def user_metric(metric_id: str, resource: str) -> Metric:
    """The metric type Cloud Logging gives a log-based metric `metric_id`."""
    return Metric(f"{USER_METRIC_PREFIX}{metric_id}", resource, "1",
                  "cloud.google.com/logging/docs/logs-based-metrics")


def documented(metric_type: str) -> Metric | None:
    """The documented metric of `metric_type`; a log-based metric of the stack's own
    (logging.googleapis.com/user/...) is documented by its LogMetric."""
    for metric in METRICS.values():
        if metric.type == metric_type:
            return metric
    return None


# ---- dashboards -------------------------------------------------------------------

COLUMNS = 48  # mosaicLayout grid (Dashboard API MosaicLayout.columns, at most 48)
TILE_WIDTH, TILE_HEIGHT = 24, 16


@dataclass(frozen=True)
class Chart:
    """One tile: a metric, how each series is aligned and how series are combined."""

    title: str
    metric: Metric
    aligner: str = "ALIGN_MEAN"
    reducer: str = "REDUCE_MEAN"
    group_by: tuple[str, ...] = ()
    denominator: Metric | None = None  # a ratio chart: metric / denominator
    y_label: str = ""


NODE = ('resource.label."project_id"', 'resource.label."node_id"')
WORKLOAD_ID = ('resource.label."workload_id"',)


def node_charts() -> list[Chart]:
    """What a TPU node does: duty cycle, TensorCore utilisation, HBM, idle time."""
    m = METRICS
    return [
        Chart("TPU duty cycle (%) by project and node", m["duty_cycle"], group_by=NODE,
              y_label="%"),
        Chart("TensorCore utilisation (%) by project and node", m["tensorcore_utilization"],
              group_by=NODE, y_label="%"),
        Chart("HBM used / total by project and node", m["memory_used"], reducer="REDUCE_SUM",
              group_by=NODE, denominator=m["memory_total"], y_label="fraction"),
        Chart("HBM bandwidth utilisation (%) by node", m["memory_bandwidth_utilization"],
              group_by=NODE, y_label="%"),
        Chart("TensorCore idle duration (s) by node", m["idle_duration"], aligner="ALIGN_MAX",
              reducer="REDUCE_MAX", group_by=NODE, y_label="s"),
    ]


def goodput_charts() -> list[Chart]:
    """What the jobs made of their time, as the goodput library uploads it."""
    m = METRICS
    # ALIGN_NEXT_OLDER: as the library's own "Goodput Monitoring" dashboard aligns them
    # (ml_goodput_measurement/dashboards/goodput_dashboard.json).
    return [
        Chart("Goodput / elapsed time by workload", m["goodput_time"],
              aligner="ALIGN_NEXT_OLDER", reducer="REDUCE_SUM", group_by=WORKLOAD_ID,
              denominator=m["total_elapsed_time"], y_label="fraction"),
        Chart("Badput time (s) by source", m["badput_time"], aligner="ALIGN_NEXT_OLDER",
              reducer="REDUCE_SUM", group_by=('metric.label."badput_source"',), y_label="s"),
        Chart("Step-time deviation (s) by workload", m["step_time_deviation"],
              aligner="ALIGN_NEXT_OLDER", reducer="REDUCE_MAX", group_by=WORKLOAD_ID,
              y_label="s"),
        Chart("Disruptions by workload", m["disruptions"], aligner="ALIGN_NEXT_OLDER",
              reducer="REDUCE_SUM", group_by=WORKLOAD_ID),
    ]


def hung_chart(metric_id: str) -> Chart:
    return Chart("Hung or restarted jobs", user_metric(metric_id, HUNG.resource),
                 aligner="ALIGN_SUM", reducer="REDUCE_SUM")


def spend_chart(metric_id: str) -> Chart:
    """Spend per team: the meter's figure on each budget line (the budget-stop function's
    at a notification, the controller's each run): teams with budget lines only
    (components/monitoring.py budget_line_teams)."""
    return Chart("Month-to-date spend (USD) per team with a budget",
                 user_metric(metric_id, SPEND.resource), aligner="ALIGN_PERCENTILE_99",
                 reducer="REDUCE_MAX", group_by=('metric.label."team"',), y_label="USD")


Scope = dict[str, str]  # monitored resource type → one more filter term on it


def metric_filter(metric: Metric, scope: Scope | None = None) -> str:
    """A time-series filter: the metric type, its resource type, and the scope's term
    for that resource type (if any)."""
    terms = [f'metric.type="{metric.type}"']
    if metric.resource:
        terms.append(f'resource.type="{metric.resource}"')
    if scope and metric.resource in scope:
        terms.append(scope[metric.resource])
    return " ".join(terms)


def node_scope(node_prefix: str) -> Scope:
    """TPU workers of nodes whose id starts with `node_prefix` (as Google's own TPU
    dashboards scope theirs: monitoring.regex.full_match on resource.label.node_id).
    Goodput series are the project's own: a team's project holds its workloads only."""
    return {TPU_WORKER: f'resource.label."node_id"=monitoring.regex.full_match('
                        f'"{node_prefix}.*")'}


def project_scope(project: str, resources: tuple[str, ...] = (TPU_WORKER, WORKLOAD)) -> Scope:
    """Series of `project` alone, in a metrics scope that sees others: a team's TPU
    workers (every node in a team's project is the team's, whichever stack declared it:
    the platform names them `<platform>-<team>-…`, a team stack `<its stack>-<team>-…`),
    or the platform's own nodes and workloads beside its teams' (project_id on the
    Workload resource: unconfirmed, docs/tpu-facts.md)."""
    term = f'resource.label."project_id"="{project}"'
    return {resource: term for resource in resources}


def _aggregation(chart: Chart) -> dict[str, Any]:
    aggregation: dict[str, Any] = {"alignmentPeriod": "60s", "perSeriesAligner": chart.aligner,
                                   "crossSeriesReducer": chart.reducer}
    if chart.group_by:
        aggregation["groupByFields"] = list(chart.group_by)
    return aggregation


def _query(chart: Chart, scope: Scope | None) -> dict[str, Any]:
    if chart.denominator is None:
        return {"timeSeriesFilter": {"filter": metric_filter(chart.metric, scope),
                                     "aggregation": _aggregation(chart)}}
    return {"timeSeriesFilterRatio": {
        "numerator": {"filter": metric_filter(chart.metric, scope),
                      "aggregation": _aggregation(chart)},
        "denominator": {"filter": metric_filter(chart.denominator, scope),
                        "aggregation": _aggregation(chart)}}}


def _tile(index: int, chart: Chart, scope: Scope | None) -> dict[str, Any]:
    per_row = COLUMNS // TILE_WIDTH
    return {
        "xPos": (index % per_row) * TILE_WIDTH, "yPos": (index // per_row) * TILE_HEIGHT,
        "width": TILE_WIDTH, "height": TILE_HEIGHT,
        "widget": {"title": chart.title, "xyChart": {
            "dataSets": [{"timeSeriesQuery": _query(chart, scope), "plotType": "LINE",
                          "minAlignmentPeriod": "60s"}],
            "yAxis": {"label": chart.y_label, "scale": "LINEAR"}}},
    }


# A dashboard filter on the TPU workers' node_id (Dashboard API DashboardFilter: no
# templateVariable, so it applies to every widget whose resource has the label), which
# `tpuctl status` sets per node in the console link (model/naming.py dashboard_url), as
# google/cloud-tpu-monitoring-debugging's GCE dashboard filters on worker_id
# (gcp_resources/gce/resources/dashboard/monitoring_dashboard/dashboard_json/main.json).
NODE_FILTER = {"labelKey": "node_id", "filterType": "RESOURCE_LABEL"}


def dashboard_name(project: str, dashboard_id: str) -> str:
    """The Dashboard API's resource name, `projects/<p>/dashboards/<id>`."""
    return f"projects/{project}/dashboards/{dashboard_id}"


def dashboard(display_name: str, charts: list[Chart], scope: Scope | None = None,
              name: str | None = None) -> dict[str, Any]:
    """A Dashboard API message (monitoring.dashboard.v1.Dashboard, JSON): one tile per
    chart in a two-column mosaic, every TPU filter narrowed by `scope`; `name` fixes its
    id (dashboard_name), so its console link is known offline."""
    message: dict[str, Any] = {
        "displayName": display_name, "dashboardFilters": [NODE_FILTER],
        "mosaicLayout": {"columns": COLUMNS,
                         "tiles": [_tile(i, c, scope) for i, c in enumerate(charts)]}}
    return message if name is None else {"name": name, **message}


def dashboard_json(display_name: str, charts: list[Chart],
                   scope: Scope | None = None, name: str | None = None) -> str:
    return json.dumps(dashboard(display_name, charts, scope, name), sort_keys=True)


def tile_filters(message: dict[str, Any]) -> list[str]:
    """Every filter of a dashboard message's tiles (numerators and denominators too)."""
    filters = []
    for tile in message["mosaicLayout"]["tiles"]:
        for data_set in tile["widget"]["xyChart"]["dataSets"]:
            query = data_set["timeSeriesQuery"]
            if "timeSeriesFilter" in query:
                filters.append(query["timeSeriesFilter"]["filter"])
            else:
                ratio = query["timeSeriesFilterRatio"]
                filters += [ratio["numerator"]["filter"], ratio["denominator"]["filter"]]
    return filters


# ---- alert conditions -----------------------------------------------------------

IDLE_PERCENT = 5.0  # duty cycle under this is idle (issue 46)
DEFAULT_IDLE_MINUTES = 60
ALIGNMENT_SECONDS = 300


@dataclass(frozen=True)
class Condition:
    """One metric-threshold condition (AlertPolicy.conditions[].conditionThreshold)."""

    display_name: str
    filter: str
    comparison: str
    threshold: float
    duration_seconds: int
    aligner: str
    reducer: str
    group_by: tuple[str, ...] = ()
    denominator_filter: str | None = None


def idle_condition(minutes: int, scope: Scope) -> Condition:
    """Each node's mean duty cycle under IDLE_PERCENT for `minutes`."""
    return Condition(f"TPU duty cycle under {IDLE_PERCENT:g}% for {minutes} min",
                     metric_filter(METRICS["duty_cycle"], scope), "COMPARISON_LT",
                     IDLE_PERCENT, minutes * 60, "ALIGN_MEAN", "REDUCE_MEAN", NODE)


def hung_condition(metric_id: str) -> Condition:
    """Any hang or restart line in the last alignment period."""
    return Condition("A job hung or restarted", metric_filter(user_metric(metric_id, "")),
                     "COMPARISON_GT", 0, 0, "ALIGN_SUM", "REDUCE_SUM")


def goodput_condition(target: float, window_seconds: int, scope: Scope) -> Condition:
    """Each workload's goodput over elapsed time under `target` for the window."""
    return Condition(f"Goodput under {target:.0%} for {window_seconds // 60} min",
                     metric_filter(METRICS["goodput_time"], scope), "COMPARISON_LT", target,
                     window_seconds, "ALIGN_NEXT_OLDER", "REDUCE_SUM", WORKLOAD_ID,
                     denominator_filter=metric_filter(METRICS["total_elapsed_time"], scope))


def budget_condition(metric_id: str, team_label: str, horizon_hours: float) -> Condition:
    """A budget-stop decision to act for `team_label`: the budget is spent, or is within
    `horizon_hours` at the meter's burn rate."""
    return Condition(f"Budget runs out within {horizon_hours:g} h",
                     f'{metric_filter(user_metric(metric_id, BUDGET_RUNOUT.resource))} '
                     f'metric.label."team"="{team_label}"',
                     "COMPARISON_GT", 0, 0, "ALIGN_SUM", "REDUCE_SUM")


@dataclass(frozen=True)
class Absence:
    """One metric-absence condition (AlertPolicy.conditions[].conditionAbsent)."""

    display_name: str
    filter: str
    duration_seconds: int


# MetricAbsence.duration: "only values that are a multiple of a minute--e.g. 60s, 120s,
# or 300s--are supported" (pulumi-gcp monitoring/_inputs.py
# AlertPolicyConditionConditionAbsentArgs.duration, from the API's reference); an upper
# bound is not in a stored source. The controller's intervals are whole minutes (1m-1h).
ABSENT_INTERVALS = 3


def controller_absent_condition(metric_id: str, interval_seconds: int) -> Absence:
    """No controller run line for three intervals: Cloud Scheduler or the function stopped
    (`tpuctl status` warns at the same age: ops/controller/run.py last_run_lines)."""
    seconds = ABSENT_INTERVALS * interval_seconds
    return Absence(f"The controller has not run for {seconds // 60} min",
                   metric_filter(user_metric(metric_id, CONTROLLER_RUNS.resource)), seconds)


def condition_filters(conditions: list[Condition]) -> list[str]:
    return [f for c in conditions for f in (c.filter, c.denominator_filter) if f]


_TYPE = re.compile(r'metric\.type="([^"]+)"')
_RESOURCE = re.compile(r'resource\.type="([^"]+)"')


def filter_types(text: str) -> tuple[str | None, str | None]:
    """(metric type, resource type) a filter names."""
    metric, resource = _TYPE.search(text), _RESOURCE.search(text)
    return (metric.group(1) if metric else None, resource.group(1) if resource else None)
