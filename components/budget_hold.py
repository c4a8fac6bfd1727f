"""The program's reads of the hold markers (model/budget_hold.py decides what they hold):
pulumi-gcp invokes, run at preview and at up."""

from __future__ import annotations

import pulumi_gcp as gcp

from model.budget_hold import JANITOR_PREFIX, marker_prefix


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
