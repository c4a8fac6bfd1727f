"""Rules on alerts (components/monitoring.py): every team of a platform names a
notification channel; a stack's own `tpu-stack:alerts` is optional (without it, its
dashboard and no alert policy); windows and thresholds GCP accepts."""

from __future__ import annotations

import re

from model.settings.schema import (
    NAMESPACE,
    AlertsSettings,
    NodeSettings,
    StackSettings,
    duration_seconds,
)
from model.settings.suggest import Problems

ALERTS_KEY = f"{NAMESPACE}:alerts"
# cloud.google.com/pubsub/docs/create-topic: a topic id is 3-255 characters, starting with
# a letter; the channel's `topic` label is the full name (cloud.google.com/monitoring/
# support/notification-options, "Pub/Sub").
TOPIC_RE = re.compile(r"^projects/[a-z][a-z0-9-]{4,28}[a-z0-9]/topics/[A-Za-z][\w.~+%-]{2,254}$")
EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
# An alert condition's duration (AlertPolicy Condition.MetricThreshold.duration): whole
# minutes here, at most a day (unconfirmed: the API's own upper bound is not in the
# stored reference; a day is the longest window this stack asks for).
MAX_WINDOW_SECONDS = 86400


def alerts_problems(s: StackSettings) -> Problems:
    if s.is_team_stack and s.alerts is not None:
        yield (ALERTS_KEY, "a team stack's alerts are its platform's: set "
                           f"{NAMESPACE}:teams.{s.team}.alerts in the platform stack")
        return
    if s.alerts is not None:
        yield from _settings_problems(ALERTS_KEY, s.alerts, required=False)
    for name, team in s.teams.items():
        yield from _settings_problems(f"{NAMESPACE}:teams.{name}.alerts", team.alerts,
                                      required=True)


def _settings_problems(key: str, alerts: AlertsSettings | None, required: bool) -> Problems:
    if alerts is None or not alerts.has_channel:
        if required:
            yield (f"{key}.email", "is required: a team's alerts need a notification "
                                   f"channel, {key}.email (an address) or {key}.pubsubTopic "
                                   "(projects/<project>/topics/<topic>)")
        if alerts is None:
            return
    if alerts.email and not EMAIL_RE.match(alerts.email):
        yield (f"{key}.email", f"{alerts.email!r} is not an email address")
    if alerts.pubsub_topic and not TOPIC_RE.match(alerts.pubsub_topic):
        yield (f"{key}.pubsubTopic", f"{alerts.pubsub_topic!r} is not a topic's full name: "
                                     "projects/<project>/topics/<topic>")
    window = duration_seconds(alerts.goodput_window)
    if window is None or window % 60 or window > MAX_WINDOW_SECONDS:
        yield (f"{key}.goodputWindow", f"{alerts.goodput_window!r}: whole minutes up to a "
                                       "day, e.g. 30m, 1h, 6h")
    if alerts.idle_minutes is not None and alerts.idle_minutes * 60 > MAX_WINDOW_SECONDS:
        yield (f"{key}.idleMinutes", "at most 1440 (a day)")


def idle_minutes(alerts: AlertsSettings | None, nodes: list[NodeSettings]) -> int:
    """How long a TPU may idle before the alert: `idleMinutes`, else the shortest
    `idleStop` of the nodes (whole minutes, at least 1), else an hour (issue 46)."""
    if alerts is not None and alerts.idle_minutes is not None:
        return alerts.idle_minutes
    stops = [n.idle_stop_seconds for n in nodes if n.idle_stop_seconds]
    return min(MAX_WINDOW_SECONDS, max(60, min(stops))) // 60 if stops else 60
