"""What a team's TPUs cost, and whether a budget stop is due: pure, standard library only.

The budget-stop function (main.py beside this file; the folder is its whole deployed
source) and the stack's meter (components/meter.py) both use it, so the figure a user
reads in `tpuctl status --team` is the one the function acts on.

Prices come as a table the stack makes from components/catalog.py (`prices.json` in the
function's source, components/budget_stop.py `price_table`): per accelerator-type prefix
(`v2`, `v5litepod`, ...), USD per hour of one unit of the number in the type's name
(a TensorCore for v2-v4 and v5p, a chip for v5e and v6e), on-demand and spot.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

SECONDS_PER_HOUR = 3600.0
# Node states (google-cloud-tpu Node.State names) the meter counts as billing: a TPU
# bills from creation until deletion, except while STOPPED (a single host) and once
# PREEMPTED or TERMINATED (whether a PREEMPTED spot node bills is unconfirmed: counted
# not billing here).
BILLED_STATES = frozenset({"CREATING", "READY", "RESTARTING", "REPAIRING", "STARTING",
                           "STOPPING", "UPDATING"})
PriceTable = Mapping[str, Mapping[str, float | None]]


@dataclass(frozen=True)
class MeteredNode:
    """A node as the meter sees it: its shape, its rate and when it started billing."""

    name: str
    accelerator_type: str
    spot: bool
    created: datetime


def hourly_usd(prices: PriceTable, accelerator_type: str, spot: bool) -> float | None:
    """The slice's list price per hour, or None where the table has none."""
    prefix, _, count = accelerator_type.rpartition("-")
    entry = prices.get(prefix)
    if entry is None or not count.isdigit():
        return None
    per_unit = entry.get("spot" if spot else "onDemand")
    return None if per_unit is None else per_unit * int(count)


def hours_between(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds() / SECONDS_PER_HOUR)


def meter_usd(prices: PriceTable, nodes: Iterable[MeteredNode], since: datetime,
              now: datetime) -> float:
    """Each node's hourly price times the hours it has run since `since` (the budget
    interval's start), summed. A node the table cannot price counts 0 (and is named by
    `unpriced`)."""
    total = 0.0
    for node in nodes:
        hourly = hourly_usd(prices, node.accelerator_type, node.spot) or 0.0
        total += hourly * hours_between(max(node.created, since), now)
    return total


def burn_usd_per_hour(prices: PriceTable, nodes: Iterable[MeteredNode]) -> float:
    """What the nodes cost per hour now."""
    return sum(hourly_usd(prices, n.accelerator_type, n.spot) or 0.0 for n in nodes)


def unpriced(prices: PriceTable, nodes: Iterable[MeteredNode]) -> list[str]:
    return [n.name for n in nodes if hourly_usd(prices, n.accelerator_type, n.spot) is None]


def hours_left(budget_usd: float, spent_usd: float, burn: float) -> float | None:
    """Hours until `budget_usd` is spent at `burn` USD/h; 0 when spent, None at no burn."""
    if spent_usd >= budget_usd:
        return 0.0
    return None if burn <= 0 else (budget_usd - spent_usd) / burn


class MessageError(ValueError):
    """A Pub/Sub message that is not a Cloud Billing budget notification."""


@dataclass(frozen=True)
class BudgetMessage:
    """A Cloud Billing budget notification (schemaVersion 1.0). Its data is JSON with
    `budgetDisplayName`, `costAmount`, `costIntervalStart`, `budgetAmount`,
    `budgetAmountType`, `currencyCode` and, once a threshold is crossed,
    `alertThresholdExceeded`; its attributes `billingAccountId`, `budgetId` and
    `schemaVersion` (cloud.google.com/billing/docs/how-to/budgets-programmatic-notifications,
    "Notification format"; docs/tpu-facts.md, "Budgets"). Notifications come several times
    a day whether or not a threshold was crossed, so duplicates are the rule."""

    budget_id: str
    billing_account: str
    display_name: str
    cost_usd: float
    budget_usd: float
    interval_start: datetime
    threshold_exceeded: float | None
    currency: str

    @classmethod
    def from_pubsub(cls, message: Mapping[str, object]) -> BudgetMessage:
        """From a Pub/Sub message (`data` base64, `attributes`), as a CloudEvent's
        `data["message"]` carries it."""
        attributes = message.get("attributes") or {}
        if not isinstance(attributes, Mapping):
            raise MessageError("attributes is not an object")
        try:
            data = json.loads(base64.b64decode(str(message.get("data") or ""), validate=True))
        except (binascii.Error, ValueError) as error:
            raise MessageError(f"data is not base64 JSON: {error}") from None
        if not isinstance(data, dict):
            raise MessageError("data is not a JSON object")
        missing = [k for k in ("costAmount", "budgetAmount", "costIntervalStart") if k not in data]
        missing += [k for k in ("budgetId",) if not attributes.get(k)]
        if missing:
            raise MessageError(f"not a budget notification: no {', '.join(missing)}")
        exceeded = data.get("alertThresholdExceeded")
        try:
            return cls(
                budget_id=str(attributes["budgetId"]),
                billing_account=str(attributes.get("billingAccountId") or ""),
                display_name=str(data.get("budgetDisplayName") or ""),
                cost_usd=float(data["costAmount"]),
                budget_usd=float(data["budgetAmount"]),
                interval_start=parse_time(str(data["costIntervalStart"])),
                threshold_exceeded=None if exceeded is None else float(exceeded),
                currency=str(data.get("currencyCode") or "USD"),
            )
        except (TypeError, ValueError) as error:
            raise MessageError(f"not a budget notification: {error}") from None


def parse_time(text: str) -> datetime:
    """RFC 3339 (`2026-12-01T08:00:00Z`), always timezone-aware."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class Decision:
    act: bool
    reason: str
    spend_usd: float  # the larger of the reported cost and the meter
    projected_usd: float  # spend plus the burn rate over the horizon


def decide(message: BudgetMessage, meter: float, burn: float, horizon_hours: float,
           stop_at: float = 1.0) -> Decision:
    """Stop when the larger of the reported cost and the meter reaches `stop_at` of the
    budget (billing data lags by hours), or when spending at `burn` USD/h for
    `horizon_hours` more would."""
    limit = message.budget_usd * stop_at
    spend = max(message.cost_usd, meter)
    projected = spend + burn * horizon_hours
    figures = (f"reported {message.cost_usd:.2f}, metered {meter:.2f}, burn {burn:.2f}/h; "
               f"stop at {limit:.2f} {message.currency}")
    if spend >= limit:
        return Decision(True, f"spend {spend:.2f} reached the budget's stop ({figures})",
                        spend, projected)
    if projected >= limit:
        return Decision(True, f"spend {spend:.2f} is projected to reach the budget's stop "
                              f"within {horizon_hours:g} h ({figures})", spend, projected)
    return Decision(False, f"spend {spend:.2f} under the budget's stop ({figures})", spend,
                    projected)


def marker_name(team: str, message: BudgetMessage, stop_at: float) -> str:
    """The create-only object that records a stop: one per (budget, interval, threshold)."""
    start = message.interval_start.astimezone(timezone.utc).strftime("%Y-%m-%dT%H%M%SZ")
    return f"budget-stop/{team}/{message.budget_id}/{start}/at-{stop_at:g}.json"
