"""A team held after its budget stopped its TPUs (docs/design.md, "Budgets that stop TPUs").

The budget-stop function records each stop with a create-only marker object,
`budget-stop/<team>/<budget>/<interval start>/at-<threshold>.json`, in the platform's
artifacts bucket (model/spend.py marker_name). The platform program
lists those markers at every preview and up (`read_markers`, the pulumi-gcp invoke
gcp.storage.get_bucket_objects) and leaves a held team's nodes out of the program, so
neither the next `pulumi up` nor the heal workflow's `pulumi up --refresh` recreates
what the stop deleted. The hold ends at the next budget interval (a calendar month after
the stopped interval's start: Cloud Billing budgets are monthly here, components/teams.py
TeamBudget), or when `teams.<team>.liftBudgetHold` names the stopped interval ("YYYY-MM").

Everything but `read_markers` is pure.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone

MARKER_PREFIX = "budget-stop/"
_MARKER_RE = re.compile(r"^budget-stop/(?P<team>[^/]+)/(?P<budget>[^/]+)/"
                        r"(?P<start>\d{4}-\d{2}-\d{2}T\d{6}Z)/at-[^/]+\.json$")
INTERVAL_RE = re.compile(r"^\d{4}-(0[1-9]|1[0-2])$")  # liftBudgetHold: "YYYY-MM"


def marker_prefix(team: str) -> str:
    """Where the function's markers of `team` live in the artifacts bucket."""
    return f"{MARKER_PREFIX}{team}/"


@dataclass(frozen=True)
class BudgetHold:
    team: str
    marker: str  # the object that records the stop
    interval: str  # "YYYY-MM" of the stopped interval's start: what liftBudgetHold names
    until: datetime  # the next interval's start: the hold ends there

    def warning(self, nodes: Iterable[str]) -> str:
        held = ", ".join(nodes) or "none"
        return (f"team {self.team} is held: its budget stopped its TPUs in interval "
                f"{self.interval} (gs marker {self.marker}); its nodes ({held}) are left out "
                f"until {self.until:%Y-%m-%dT%H:%MZ} or until tpu-stack:teams.{self.team}"
                f".liftBudgetHold is {self.interval!r}")


def _next_month(start: datetime) -> datetime:
    year, month = (start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1)
    return start.replace(year=year, month=month)


def budget_hold(team: str, marker_names: Iterable[str], now: datetime,
                lifted: str | None = None) -> BudgetHold | None:
    """The hold on `team` at `now`: the newest stop whose interval has not ended and
    was not lifted; None when there is none. Names that are not markers are ignored."""
    holds = []
    for name in marker_names:
        match = _MARKER_RE.match(name)
        if not match or match["team"] != team:
            continue
        start = datetime.strptime(match["start"], "%Y-%m-%dT%H%M%SZ").replace(
            tzinfo=timezone.utc)
        # The interval starts on the 1st (at Pacific midnight: costIntervalStart is UTC,
        # e.g. 08:00Z), so the month of its UTC start names it.
        hold = BudgetHold(team, name, f"{start:%Y-%m}", _next_month(start))
        if start <= now < hold.until and hold.interval != lifted:
            holds.append(hold)
    return max(holds, key=lambda h: h.until, default=None)


# ---- the janitor's deletions past maxRuntime ------------------------------------------

JANITOR_PREFIX = "janitor/"


def settings_digest(node_settings_json: str) -> str:
    """A node's settings as the stack file gives them (NodeSettings JSON, by alias),
    hashed: a janitor's deletion holds while this stays the same."""
    return hashlib.sha256(node_settings_json.encode()).hexdigest()[:16]


def janitor_marker(node_id: str, digest: str) -> str:
    """The object `tpuctl janitor --apply` creates when it deletes `node_id` past its
    maxRuntime, in the stack's artifacts bucket."""
    return f"{JANITOR_PREFIX}{node_id}/{digest}.json"


def janitor_held(node_id: str, digest: str, marker_names: Iterable[str]) -> bool:
    """Whether the janitor deleted `node_id` with these very settings."""
    return janitor_marker(node_id, digest) in set(marker_names)


