"""`tpuctl preflight`'s look at a platform's shared gs:// backend (docs/teams.md, "State"):
is the bucket on the project layout the teams' conditions name (model/team_state.py)?

Two reads through the Cloud Storage JSON API (cloud.google.com/storage/docs/json_api/v1):
`objects.get` of `.pulumi/meta.yaml` with `alt=media`, and one `objects.list` of
`.pulumi/stacks/` (`maxResults=1`): a legacy bucket is refused with its
`pulumi state upgrade` step before any team's `up` meets a 403.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote

from model.team_state import legacy_problem
from ops.tpu.preflight import Check

STORAGE_API = "https://storage.googleapis.com/storage/v1"
# url → (HTTP status, body); raises OSError when nothing came back (ops/tpu/quota.py).
Get = Callable[[str], tuple[int, bytes]]


def layout_check(bucket: str, get: Get, base: str = STORAGE_API) -> Check:
    """One row: the bucket's layout, "fail" with the upgrade step for a legacy one."""
    subject, what = f"gs://{bucket}", "state layout (teams' conditions)"
    meta_url = f"{base}/b/{bucket}/o/{quote('.pulumi/meta.yaml', safe='')}?alt=media"
    list_url = f"{base}/b/{bucket}/o?prefix={quote('.pulumi/stacks/', safe='')}&maxResults=1"
    try:
        meta_status, meta_body = get(meta_url)
        list_status, list_body = get(list_url)
    except OSError as error:
        return Check(subject, what, "not checked", str(error))
    if meta_status not in (200, 404) or list_status != 200:
        return Check(subject, what, "not checked",
                     f"Cloud Storage answered {meta_status} and {list_status}")
    meta = meta_body.decode("utf-8", "replace") if meta_status == 200 else None
    has_stacks = b'"items"' in list_body
    problem = legacy_problem(bucket, meta, has_stacks)
    return Check(subject, what, "fail" if problem else "ok", problem or "project layout")
