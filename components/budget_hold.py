"""The program's reads of the hold markers (model/budget_hold.py decides what they hold):
pulumi-gcp invokes, run at preview and at up."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pulumi_gcp as gcp

from model.budget_hold import JANITOR_PREFIX, BudgetHold, marker_prefix


def read_markers(bucket: str, team: str) -> list[str]:
    """The names of `team`'s stop markers in `bucket`, through pulumi-gcp's
    gcp.storage.get_bucket_objects (terraform's google_storage_bucket_objects data
    source: GCS objects.list with a prefix; no object under the prefix lists nothing,
    registry.terraform.io/providers/hashicorp/google/latest/docs/data-sources/
    storage_bucket_objects). Runs at preview and at up."""
    result = gcp.storage.get_bucket_objects(bucket=bucket, prefix=marker_prefix(team))
    return [item.name for item in (result.bucket_objects or [])]


def read_janitor_markers(bucket: str) -> list[str]:
    """The janitor's markers in `bucket` (the same invoke as read_markers)."""
    result = gcp.storage.get_bucket_objects(bucket=bucket, prefix=JANITOR_PREFIX)
    return [item.name for item in (result.bucket_objects or [])]


def team_stack_hold(settings: Any, now: datetime) -> BudgetHold | None:
    """A team stack's hold, as its platform recorded it (issue 43): the platform's
    outputs object for the team (components/team_stack.py read_outputs_object) carries
    `teams.<team>.budgetHold` while a budget stop holds the team (components/platform.py
    `_team_outputs`), so the nodes are left out of the program, as the platform leaves
    its held nodes out. None without an object, without a hold, or past the hold's end."""
    from components.team_stack import read_outputs_object

    try:
        hold = read_outputs_object(settings)["teams"][settings.team].get("budgetHold")
    except (KeyError, TypeError, AttributeError):
        return None
    if not hold:
        return None
    until = datetime.fromisoformat(str(hold["until"]).replace("Z", "+00:00"))
    if until <= now:
        return None
    return BudgetHold(settings.team, str(hold.get("marker") or ""),
                      str(hold.get("interval") or ""), until)
