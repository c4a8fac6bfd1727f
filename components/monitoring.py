"""StackMonitoring: the dashboards, log-based metrics, notification channels and alert
policies of a stack (issue 46), from the pure definitions in model/monitoring.py.

- a single-team stack: its own dashboard and, with `tpu-stack:alerts`, its alerts, in
  its project;
- a platform stack: the fleet dashboard in the host project, which adds every team's
  project to its metrics scope (gcp.monitoring.MonitoredProject), the spend and
  budget-runout metrics over the budget lines there (budget_line_teams: the budget-stop
  function's teams and, with the controller, every team with a budget), and in each
  team's own project its dashboard (its nodes only), channel, job-hung metric and alert
  policies;
- a team stack: nothing (its platform declares its team's);
- with `tpu-stack:controller`, the controller's run metric and a policy when it has not
  run for three intervals, in the project it runs in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_gcp as gcp

from components.controller import INTERVAL_SECONDS
from model import function_accounts, meter
from model import monitoring as m
from model.naming import label_value
from model.settings.rules.alerts import idle_minutes
from model.settings.schema import AlertsSettings, NodeSettings, StackSettings, duration_seconds

TYPE = "tpu-stack:index:Monitoring"
Threshold = gcp.monitoring.AlertPolicyConditionConditionThresholdArgs
Aggregation = gcp.monitoring.AlertPolicyConditionConditionThresholdAggregationArgs


@dataclass(frozen=True)
class Watched:
    """One project's dashboard and alerts."""

    key: str  # prefix of the Pulumi names: a team, or "stack"
    team: str | None  # the team in GCP names; None: the stack's own
    project_id: pulumi.Input[str]
    title: str
    scope: m.Scope
    dashboard: str  # its Dashboard API name (model/naming.py dashboard_id)
    alerts: AlertsSettings | None
    nodes: list[NodeSettings]
    depends_on: list[pulumi.Resource] = field(default_factory=list)


@dataclass
class MonitoringArgs:
    settings: StackSettings
    host_project_id: pulumi.Input[str]
    host_depends_on: list[pulumi.Resource]
    # team → (its project id, what its monitoring waits for: the project's APIs)
    team_projects: dict[str, tuple[pulumi.Input[str], list[pulumi.Resource]]] = field(
        default_factory=dict)


class StackMonitoring(pulumi.ComponentResource):
    dashboards: dict[str, gcp.monitoring.Dashboard]
    policies: dict[str, list[gcp.monitoring.AlertPolicy]]

    def __init__(self, name: str, args: MonitoringArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        self.args, self.dashboards, self.policies = args, {}, {}
        self.channels: dict[str, gcp.monitoring.NotificationChannel] = {}
        s = args.settings
        self.hung_id = s.naming.log_metric(m.HUNG.logical)  # one type in every project
        if s.teams:
            self._fleet()
        own = s.alerts if s.alerts is not None and s.alerts.has_channel else None
        # A platform's own nodes (none: the teams' are under teams.<t>.nodes): with their
        # alerts only.
        if not s.teams or (own is not None and s.nodes):
            scope = (m.project_scope(s.gcp_project) if s.teams
                     else m.node_scope(s.naming.node_prefix()))
            board = s.naming.own_dashboard_id() if s.teams else s.naming.dashboard_id()
            self._watch(Watched("stack", None, args.host_project_id,
                                f"tpu-stack {s.stack}", scope,
                                m.dashboard_name(s.gcp_project, board), own, s.nodes,
                                args.host_depends_on))
        for team, (project_id, after) in args.team_projects.items():
            spec, project = s.teams[team], s.naming.team_project(team)
            self._watch(Watched(team, team, project_id, f"tpu-stack {s.stack}: team {team}",
                                m.project_scope(project, (m.TPU_WORKER,)),
                                m.dashboard_name(project, s.naming.dashboard_id(team)),
                                spec.alerts, spec.nodes, after))
        if function_accounts.controller_enabled(s):
            self._controller_alert()
        self.register_outputs({})

    def _child(self, depends_on: list[pulumi.Resource]) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, depends_on=depends_on)

    # ---- the platform's fleet view ------------------------------------------------

    def _fleet(self) -> None:
        args, s = self.args, self.args.settings
        opts = self._child(args.host_depends_on)
        for team, (project_id, after) in args.team_projects.items():
            # The host project's metrics scope sees each team's project (pulumi.com/registry/
            # packages/gcp/api-docs/monitoring/monitoredproject, "Monitoring Monitored
            # Project Basic": metrics_scope the scoping project's id, name the monitored one's).
            gcp.monitoring.MonitoredProject(
                f"{team}-metrics-scope", metrics_scope=args.host_project_id,
                name=project_id, opts=self._child([*args.host_depends_on, *after]))
        charts = [*m.node_charts(), *m.goodput_charts(), m.hung_chart(self.hung_id)]
        budgeted = budget_line_teams(s)
        if budgeted:
            spend_id = s.naming.log_metric(m.SPEND.logical)
            self._log_metric("fleet-spend", m.SPEND, spend_id, args.host_project_id, opts)
            charts.append(m.spend_chart(spend_id))
            self._budget_alerts(budgeted, opts)
        self.dashboards["fleet"] = gcp.monitoring.Dashboard(
            "fleet-dashboard", project=args.host_project_id,
            dashboard_json=m.dashboard_json(
                f"tpu-stack {s.stack}: fleet", charts,
                name=m.dashboard_name(s.gcp_project, s.naming.dashboard_id())),
            opts=_fixed_id(opts))

    def _budget_alerts(self, teams: list[str], opts: pulumi.ResourceOptions) -> None:
        """Per team whose budget lines are logged (budget_line_teams), in the host project
        where the budget-stop function and the controller log: a budget that runs out
        within budgetHorizonHours, to a channel of the team's there (an alert policy
        names channels of its own project)."""
        args, s = self.args, self.args.settings
        runout_id = s.naming.log_metric(m.BUDGET_RUNOUT.logical)
        metric = self._log_metric("fleet-budget-runout", m.BUDGET_RUNOUT, runout_id,
                                  args.host_project_id, opts)
        for team in teams:
            spec = s.teams[team]
            channel = self._host_channel(team, opts)
            if channel is None:
                continue
            condition = m.budget_condition(runout_id, label_value(team),
                                           spec.budget_horizon_hours)
            self._policy(f"{team}-budget-runout", args.host_project_id, team,
                         condition, channel, self._child([metric]))

    # ---- one project's dashboard and alerts ----------------------------------------

    def _watch(self, w: Watched) -> None:
        s = self.args.settings
        opts = self._child(w.depends_on)
        hung = self._log_metric(f"{w.key}-job-hung", m.HUNG, self.hung_id, w.project_id, opts)
        charts = [*m.node_charts(), *m.goodput_charts(), m.hung_chart(self.hung_id)]
        self.dashboards[w.key] = gcp.monitoring.Dashboard(
            f"{w.key}-dashboard", project=w.project_id,
            dashboard_json=m.dashboard_json(w.title, charts, w.scope, w.dashboard),
            opts=_fixed_id(opts))
        channel = self._channel(w.key, w.team or s.team, w.project_id, w.alerts, opts)
        if channel is None:  # a single-team stack without tpu-stack:alerts: no policies
            return
        self.channels[w.key] = channel
        assert w.alerts is not None
        window = duration_seconds(w.alerts.goodput_window) or 3600
        conditions = {
            "tpu-idle": m.idle_condition(idle_minutes(w.alerts, w.nodes), w.scope),
            "job-hung": m.hung_condition(self.hung_id),
            "goodput": m.goodput_condition(w.alerts.goodput_target, window, w.scope),
        }
        self.policies[w.key] = [
            self._policy(f"{w.key}-{what}", w.project_id, w.team or s.team, condition,
                         channel, self._child([*w.depends_on, hung]))
            for what, condition in conditions.items()]

    # ---- the controller not running ------------------------------------------------

    def _controller_alert(self) -> None:
        """The controller's run lines, counted in the project it runs in (the host), and a
        policy when none came for three intervals: to the stack's own channel
        (`tpu-stack:alerts`), else to every team's channel there."""
        args, s = self.args, self.args.settings
        assert s.controller is not None
        opts = self._child(args.host_depends_on)
        metric_id = s.naming.log_metric(m.CONTROLLER_RUNS.logical)
        metric = self._log_metric("controller-runs", m.CONTROLLER_RUNS, metric_id,
                                  args.host_project_id, opts)
        own = self.channels.get("stack") or self._channel(
            "stack", s.team, args.host_project_id, s.alerts, opts)
        channels = [own] if own is not None else [
            channel for team in sorted(s.teams)
            if (channel := self._host_channel(team, opts)) is not None]
        if not channels:  # a single-team stack without tpu-stack:alerts
            return
        condition = m.controller_absent_condition(metric_id,
                                                  INTERVAL_SECONDS[s.controller.interval])
        self.policies["controller"] = [gcp.monitoring.AlertPolicy(
            "controller-not-running", project=args.host_project_id, combiner="OR",
            display_name=f"tpu-stack {s.stack}: {condition.display_name}",
            conditions=[gcp.monitoring.AlertPolicyConditionArgs(
                display_name=condition.display_name,
                condition_absent=_absent(condition))],
            notification_channels=[channel.name for channel in channels],
            user_labels=self._labels(s.team),
            documentation=gcp.monitoring.AlertPolicyDocumentationArgs(
                content=f"tpu-stack {s.stack}: no controller run line for "
                        f"{condition.duration_seconds // 60} min. `tpuctl status --stack "
                        f"{s.stack}` shows its last run; check its Cloud Scheduler job and "
                        f"function logs.", mime_type="text/markdown"),
            opts=self._child([*args.host_depends_on, metric]))]

    def _host_channel(self, team: str, opts: pulumi.ResourceOptions
                      ) -> gcp.monitoring.NotificationChannel | None:
        """The team's channel in the host project (one, whichever alert needs it)."""
        key = f"{team}-host"
        if key not in self.channels:
            channel = self._channel(key, team, self.args.host_project_id,
                                    self.args.settings.teams[team].alerts, opts)
            if channel is None:
                return None
            self.channels[key] = channel
        return self.channels[key]

    def _log_metric(self, name: str, spec: m.LogMetric, metric_id: str,
                    project_id: pulumi.Input[str],
                    opts: pulumi.ResourceOptions) -> gcp.logging.Metric:
        labels = [gcp.logging.MetricMetricDescriptorLabelArgs(key=key, value_type="STRING")
                  for key in spec.labels]
        distribution = spec.value_extractor is not None
        return gcp.logging.Metric(
            name, project=project_id, name=metric_id, filter=spec.filter,
            description=spec.description, label_extractors=spec.labels or None,
            value_extractor=spec.value_extractor,
            metric_descriptor=gcp.logging.MetricMetricDescriptorArgs(
                metric_kind="DELTA", value_type="DISTRIBUTION" if distribution else "INT64",
                unit="1", labels=labels or None),
            # USD from 1 to about 1.6 M in 40 buckets of x1.45.
            bucket_options=gcp.logging.MetricBucketOptionsArgs(
                exponential_buckets=gcp.logging.MetricBucketOptionsExponentialBucketsArgs(
                    num_finite_buckets=40, growth_factor=1.45, scale=1)) if distribution
            else None,
            opts=opts)

    def _channel(self, key: str, team: str, project_id: pulumi.Input[str],
                 alerts: AlertsSettings | None,
                 opts: pulumi.ResourceOptions) -> gcp.monitoring.NotificationChannel | None:
        """The team's notification channel: an email address, else a Pub/Sub topic
        (cloud.google.com/monitoring/support/notification-options: types `email`, label
        email_address; `pubsub`, label topic; Cloud Monitoring's service agent needs
        pubsub.publisher on the topic, which the topic's owner grants)."""
        if alerts is None or not alerts.has_channel:
            return None
        kind, labels = (("email", {"email_address": alerts.email}) if alerts.email
                        else ("pubsub", {"topic": alerts.pubsub_topic or ""}))
        return gcp.monitoring.NotificationChannel(
            f"{key}-alerts-channel", project=project_id, type=kind, labels=labels,
            display_name=f"tpu-stack {self.args.settings.stack} {team} alerts"[:100],
            user_labels=self._labels(team), opts=opts)

    def _labels(self, team: str) -> dict[str, str]:
        return self.args.settings.naming.labels("monitoring", team)

    def _policy(self, name: str, project_id: pulumi.Input[str], team: str,
                condition: m.Condition, channel: gcp.monitoring.NotificationChannel,
                opts: pulumi.ResourceOptions) -> gcp.monitoring.AlertPolicy:
        stack = self.args.settings.stack
        return gcp.monitoring.AlertPolicy(
            name, project=project_id, combiner="OR",
            display_name=f"tpu-stack {stack} {team}: {condition.display_name}",
            conditions=[gcp.monitoring.AlertPolicyConditionArgs(
                display_name=condition.display_name,
                condition_threshold=_threshold(condition))],
            notification_channels=[channel.name], user_labels=self._labels(team),
            documentation=gcp.monitoring.AlertPolicyDocumentationArgs(
                content=f"tpu-stack {stack}, team {team}: {condition.display_name}. "
                        f"`tpuctl status --stack {stack}` shows the node and its job.",
                mime_type="text/markdown"),
            opts=opts)


def _fixed_id(opts: pulumi.ResourceOptions) -> pulumi.ResourceOptions:
    """A dashboard keeps its fixed id (its `name`): a change is a delete, then a create at
    the same id (two at once would collide), which also moves a dashboard made before
    the ids were fixed (a generated id) to its fixed one."""
    return pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
        replace_on_changes=["dashboardJson"], delete_before_replace=True))


def budget_line_teams(settings: StackSettings) -> list[str]:
    """Teams whose budget lines are logged: `budgetAction: stop` (the budget-stop function
    at each notification) and, with the controller, every team with a budget (each run:
    ops/controller/spend_lines.py)."""
    controller = function_accounts.controller_enabled(settings)
    budgeted = meter.team_budgets(settings) if controller else {}
    return sorted(team for team, spec in settings.teams.items()
                  if spec.budget_action == "stop" or team in budgeted)


def _absent(condition: m.Absence) -> gcp.monitoring.AlertPolicyConditionConditionAbsentArgs:
    """Absent for the duration, all the function's revisions summed into one series (a
    new revision starts a new series; an old one going quiet is no absence)."""
    return gcp.monitoring.AlertPolicyConditionConditionAbsentArgs(
        filter=condition.filter, duration=f"{condition.duration_seconds}s",
        aggregations=[gcp.monitoring.AlertPolicyConditionConditionAbsentAggregationArgs(
            alignment_period="60s", per_series_aligner="ALIGN_SUM",  # under 3 x 1m
            cross_series_reducer="REDUCE_SUM")])


def _aggregation(condition: m.Condition) -> Aggregation:
    return Aggregation(
        alignment_period=f"{m.ALIGNMENT_SECONDS}s", per_series_aligner=condition.aligner,
        cross_series_reducer=condition.reducer,
        group_by_fields=list(condition.group_by) or None)


def _threshold(condition: m.Condition) -> Threshold:
    ratio = condition.denominator_filter is not None
    return Threshold(
        filter=condition.filter, comparison=condition.comparison,
        threshold_value=condition.threshold, duration=f"{condition.duration_seconds}s",
        aggregations=[_aggregation(condition)],
        denominator_filter=condition.denominator_filter,
        denominator_aggregations=[_aggregation(condition)] if ratio else None)
