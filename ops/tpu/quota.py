"""TPU quota as Cloud Quotas reports it, for `tpuctl preflight`: the limit each
node draws on, and what each cap a platform stack sets in a team's project
(model/team_quota.py) will do to the limit there now.

The Cloud Quotas API v1 (cloud.google.com/docs/quotas/reference/rest/v1/
projects.locations.services.quotaInfos/get): `GET .../projects/<p>/locations/
global/services/tpu.googleapis.com/quotaInfos/<quotaId>` answers a QuotaInfo whose
`dimensionsInfos[]` hold `{dimensions: {region: …}, details: {value: "<int64>"}}`,
"ordered by their dimensions from more specific ones to less specific ones" (an
entry without dimensions is the default for every other region); a value of -1 is
unlimited. Reading needs `cloudquotas.quotas.get` (Quota Viewer). Every answer is
treated as possibly broken: 429 and 5xx are retried a few times, anything
unreadable leaves the row "not checked" with the reason, a 404 means GCP knows no
such quota id (the cap's `pulumi up` would fail).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from cloud import gcp_credentials
from model import catalog
from model.fleet import StackTarget
from model.settings.schema import StackSettings
from model.team_quota import SKIPPED_SAFETY_CHECK, QuotaCap, stack_caps
from ops.tpu.api import TpuApi
from ops.tpu.preflight import Check, PreflightReport, preflight
from ops.tpu.state_layout import STORAGE_API, layout_check

QUOTAS_API = "https://cloudquotas.googleapis.com/v1"
# A stand-in Cloud Quotas (tests' loopback fake): anonymous, plain HTTP.
ENDPOINT_ENV = "TPU_STACK_QUOTAS_ENDPOINT"
TPU_SERVICE = "tpu.googleapis.com"
UNLIMITED = -1
RETRIED = frozenset({429, 500, 502, 503, 504})
# url → (HTTP status, body); raises OSError when nothing came back.
Get = Callable[[str], tuple[int, bytes]]


class QuotaReadError(RuntimeError):
    """The quota could not be read; the message says why."""


class UnknownQuotaError(QuotaReadError):
    """Cloud Quotas answered 404: no such quota id for the TPU API."""


def quota_info_url(project: str, quota_id: str, base: str = QUOTAS_API) -> str:
    return (f"{base}/projects/{project}/locations/global/services/{TPU_SERVICE}"
            f"/quotaInfos/{quota_id}")


def region_limits(info: Any) -> dict[str, int]:
    """Region → limit from a QuotaInfo; the key "" holds the default for the others."""
    infos = info.get("dimensionsInfos") if isinstance(info, Mapping) else None
    if not isinstance(infos, list):
        raise QuotaReadError("the answer has no dimensionsInfos")
    limits: dict[str, int] = {}
    for entry in infos:
        try:
            region = str((entry.get("dimensions") or {}).get("region", ""))
            value = int(entry["details"]["value"])
        except (AttributeError, KeyError, TypeError, ValueError):
            raise QuotaReadError(f"unreadable dimensionsInfos entry {entry!r:.80}") from None
        limits.setdefault(region, value)
    return limits


def limit_in(limits: Mapping[str, int], region: str) -> int | None:
    """The region's own limit, else the default; None when neither is listed."""
    return limits.get(region, limits.get(""))


class QuotaReader:
    """Reads (and caches) one QuotaInfo per project and quota id."""

    def __init__(self, get: Get, attempts: int = 3,
                 sleep: Callable[[float], None] = time.sleep, base: str = QUOTAS_API) -> None:
        self._get, self._attempts, self._sleep, self._base = get, attempts, sleep, base
        self._cache: dict[tuple[str, str], dict[str, int] | QuotaReadError] = {}

    def limits(self, project: str, quota_id: str) -> dict[str, int]:
        key = (project, quota_id)
        if key not in self._cache:
            try:
                url = quota_info_url(project, quota_id, self._base)
                self._cache[key] = region_limits(self._fetch(url))
            except QuotaReadError as error:
                self._cache[key] = error
        found = self._cache[key]
        if isinstance(found, QuotaReadError):
            raise found
        return found

    def _fetch(self, url: str) -> Any:
        status, body = 0, b""
        for attempt in range(self._attempts):
            try:
                status, body = self._get(url)
            except OSError as error:
                raise QuotaReadError(f"Cloud Quotas could not be reached: {error}") from None
            if status not in RETRIED:
                break
            if attempt + 1 < self._attempts:
                self._sleep(2.0 ** attempt)
        if status == 404:
            raise UnknownQuotaError("Cloud Quotas knows no such quota id for tpu.googleapis.com")
        if status in (401, 403):
            raise QuotaReadError(f"Cloud Quotas answered {status}: reading needs "
                                 "cloudquotas.quotas.get (Quota Viewer) on the project")
        if status != 200:
            raise QuotaReadError(f"Cloud Quotas answered {status}")
        try:
            return json.loads(body)
        except ValueError:
            raise QuotaReadError("Cloud Quotas' answer is not JSON (cut short?)") from None

    def lookup(self, project: str, region: str, gen: catalog.Generation,
               spot: bool) -> int | None:
        """preflight.QuotaLookup: the chips a node of `gen` may use, or None if unknown."""
        quota_id = catalog.TPU_QUOTA_IDS.get((gen.name, "preemptible" if spot else "onDemand"))
        if quota_id is None:
            return None
        try:
            limit = limit_in(self.limits(project, quota_id), region)
        except QuotaReadError:
            return None
        return None if limit is None or limit == UNLIMITED else limit


def cap_effect(cap: QuotaCap, current: int | None) -> str:
    """What setting the cap does to the limit there now."""
    if current is None:
        return f"sets {cap.chips} (no current limit listed for {cap.region})"
    if current == UNLIMITED or current > cap.chips:
        before = "unlimited" if current == UNLIMITED else str(current)
        return (f"lowers {before} to {cap.chips} at once (skips {SKIPPED_SAFETY_CHECK}; "
                f"refused if more than {cap.chips} are in use)")
    if current == cap.chips:
        return f"keeps {current}"
    return f"asks Google to raise {current} to {cap.chips} (a request Google may refuse)"


def cap_checks(caps: Mapping[str, Iterable[QuotaCap]], reader: QuotaReader) -> list[Check]:
    """One row per cap (team project → caps): what it will do, or why it cannot be told."""
    checks = []
    for project, project_caps in sorted(caps.items()):
        for cap in project_caps:
            subject = f"{cap.family} {cap.quota_type} in {cap.region} ({project})"
            what = f"cap at {cap.chips} chips"
            if cap.quota_id is None:
                checks.append(Check(subject, what, "not checked",
                                    "no Cloud Quotas id in the catalog: no cap is set"))
                continue
            try:
                current = limit_in(reader.limits(project, cap.quota_id), cap.region)
            except UnknownQuotaError as error:
                checks.append(Check(subject, what, "fail", f"{cap.quota_id}: {error}; the "
                                    "cap's `pulumi up` would fail (model/catalog.py)"))
                continue
            except QuotaReadError as error:
                checks.append(Check(subject, what, "not checked", str(error)))
                continue
            checks.append(Check(subject, what, "ok", cap_effect(cap, current)))
    return checks


def authorized_get(credentials: Any, timeout: float = 30.0) -> Get:
    """A Get over google-auth's AuthorizedSession with the stack's credentials."""
    from google.auth import exceptions as auth_exceptions
    from google.auth.transport.requests import AuthorizedSession
    from requests import RequestException

    session = AuthorizedSession(credentials)

    def get(url: str) -> tuple[int, bytes]:
        try:
            response = session.get(url, timeout=timeout)
        except (RequestException, auth_exceptions.GoogleAuthError) as error:
            raise OSError(str(error)) from None
        return response.status_code, response.content

    return get


def live_preflight(target: StackTarget, api: TpuApi, settings: StackSettings,
                   env: Mapping[str, str] | None = None) -> PreflightReport:
    """preflight with the nodes' quota read from Cloud Quotas and, for a platform
    stack, one row per cap of each team's project. Without credentials for the
    TPU API, the quota is not read either (the report says why)."""
    reader = stack_reader(target, os.environ if env is None else env)
    report = preflight(target, api, quota=reader.lookup)
    if not report.live:
        return report
    caps = cap_checks(stack_caps(settings), reader)
    state = settings.team_projects.state_bucket if settings.team_projects else None
    layout = ([layout_check(state, *storage_get(target, os.environ if env is None else env))]
              if state else [])
    return replace(report, checks=(*report.checks, *caps, *layout))


def storage_get(target: StackTarget, env: Mapping[str, str]) -> tuple[Get, str]:
    """A getter for the Cloud Storage JSON API and its base URL: the emulator named by
    $STORAGE_EMULATOR_HOST (google-cloud-storage's convention) anonymously; nothing
    beside a stand-in TPU API; else the stack's credentials, built on first use."""
    emulator = env.get("STORAGE_EMULATOR_HOST")
    if emulator:
        return plain_get, f"{emulator.rstrip('/')}/storage/v1"
    if env.get(ENDPOINT_ENV.replace("QUOTAS", "TPU")):
        return _refuse("the TPU API is a stand-in and Cloud Storage has none "
                       "($STORAGE_EMULATOR_HOST)"), STORAGE_API
    return lazy_get(target, env), STORAGE_API


def stack_reader(target: StackTarget, env: Mapping[str, str]) -> QuotaReader:
    """A reader with the stack's credentials, built on first use (a missing
    credential becomes a "not checked" row, never a traceback); against
    $TPU_STACK_QUOTAS_ENDPOINT if set. With a stand-in TPU API and no stand-in
    Cloud Quotas, Cloud Quotas is not asked."""
    if env.get(ENDPOINT_ENV):
        return QuotaReader(plain_get, base=env[ENDPOINT_ENV].rstrip("/"))
    if env.get(ENDPOINT_ENV.replace("QUOTAS", "TPU")):
        return QuotaReader(_refuse("the TPU API is a stand-in and Cloud Quotas has none "
                                   f"(${ENDPOINT_ENV})"))
    return QuotaReader(lazy_get(target, env))


def lazy_get(target: StackTarget, env: Mapping[str, str]) -> Get:
    """A getter with the stack's credentials, built on first use (a missing credential
    becomes a "not checked" row, never a traceback)."""
    get: Get | None = None

    def lazy(url: str) -> tuple[int, bytes]:
        nonlocal get
        if get is None:
            try:
                get = authorized_get(gcp_credentials.build(target.auth(env)))
            except Exception as error:  # google.auth's errors, a bad credentials file
                raise OSError(f"no usable Google credentials ({error})") from None
        return get(url)

    return lazy


def _refuse(reason: str) -> Get:
    def get(_url: str) -> tuple[int, bytes]:
        raise OSError(reason)
    return get


def plain_get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    import requests

    try:
        response = requests.get(url, timeout=timeout)
    except requests.RequestException as error:
        raise OSError(str(error)) from None
    return response.status_code, response.content
