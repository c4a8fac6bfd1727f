"""tpuctl preflight reads TPU quota from Cloud Quotas (ops/tpu/quota.py): each node's
limit, and what each cap of a team's project will do; broken answers never pass."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from components.stack_config import settings_for
from model.team_quota import QuotaCap, stack_caps
from ops.tpu.quota import QuotaReader, cap_checks, cap_effect, live_preflight, quota_info_url
from tests.fakes.tpu_api import FakeTpuApi
from tests.ops.tpu_world import PROJECT, expected_node, target

V5E_SPOT = "TPUV5sPreemptibleLitepodPerProjectPerRegionForTPUAPI"
V2_ON_DEMAND = "TPUV2sPodPerProjectPerRegionForTPUAPI"


def quota_info(*entries: tuple[str | None, int]) -> bytes:
    """A QuotaInfo: (region or None for the default, value), most specific first."""
    infos = [{"dimensions": {"region": region} if region else {},
              "details": {"value": str(value)}} for region, value in entries]
    return json.dumps({"quotaId": "x", "dimensionsInfos": infos}).encode()


class FakeQuotas:
    """url → answers in order (the last repeats); records every request."""

    def __init__(self, answers: dict[str, list[tuple[int, bytes]]]) -> None:
        self.answers, self.calls = answers, []

    def __call__(self, url: str) -> tuple[int, bytes]:
        self.calls.append(url)
        answers = self.answers.get(url) or [(404, b"{}")]
        return answers.pop(0) if len(answers) > 1 else answers[0]


def url(quota_id: str, project: str = PROJECT) -> str:
    return quota_info_url(project, quota_id)


def reader(answers: dict[str, list[tuple[int, bytes]]]) -> tuple[QuotaReader, FakeQuotas]:
    fake = FakeQuotas(answers)
    return QuotaReader(fake, sleep=lambda _s: None), fake


def test_a_region_s_own_limit_else_the_default() -> None:
    r, fake = reader({url(V5E_SPOT): [(200, quota_info(("us-central1", 64), (None, 8)))]})
    cap = QuotaCap("v5e", "preemptible", "us-central1", 16)
    elsewhere = QuotaCap("v5e", "preemptible", "us-west4", 16)
    checks = cap_checks({PROJECT: [cap, elsewhere]}, r)
    assert [(c.outcome, c.detail) for c in checks] == [
        ("ok", "lowers 64 to 16 at once (skips QUOTA_DECREASE_PERCENTAGE_TOO_HIGH; refused "
               "if more than 16 are in use)"),
        ("ok", "asks Google to raise 8 to 16 (a request Google may refuse)")]
    assert len(fake.calls) == 1  # one QuotaInfo per project and quota id


@pytest.mark.parametrize(("current", "effect"), [
    (-1, "lowers unlimited to 0 at once"),
    (0, "keeps 0"),
    (None, "sets 0 (no current limit listed for us-central1)"),
])
def test_what_a_cap_of_zero_does(current, effect) -> None:
    assert cap_effect(QuotaCap("v5e", "onDemand", "us-central1", 0), current).startswith(effect)


@pytest.mark.parametrize(("answers", "detail"), [
    ([(503, b"")] * 3, "Cloud Quotas answered 503"),
    ([(429, b"")] * 3, "Cloud Quotas answered 429"),
    ([(200, b'{"dimensionsInfos": [{"dimensions": {"re')], "not JSON (cut short?)"),
    ([(200, b'{"quotaId": "x"}')], "the answer has no dimensionsInfos"),
    ([(200, b'{"dimensionsInfos": [{"details": {"value": "many"}}]}')], "unreadable"),
    ([(403, b"{}")], "cloudquotas.quotas.get (Quota Viewer)"),
])
def test_a_broken_answer_leaves_the_cap_not_checked(answers, detail) -> None:
    r, _ = reader({url(V5E_SPOT): list(answers)})
    [check] = cap_checks({PROJECT: [QuotaCap("v5e", "preemptible", "us-central1", 0)]}, r)
    assert check.outcome == "not checked" and detail in check.detail


def test_a_retried_answer_that_recovers_is_read() -> None:
    r, fake = reader({url(V5E_SPOT): [(503, b""), (429, b""), (200, quota_info((None, 4)))]})
    [check] = cap_checks({PROJECT: [QuotaCap("v5e", "preemptible", "us-central1", 0)]}, r)
    assert check.outcome == "ok" and check.detail.startswith("lowers 4 to 0")
    assert len(fake.calls) == 3


def test_a_quota_id_gcp_does_not_know_fails_before_up() -> None:
    r, _ = reader({})
    [check] = cap_checks({PROJECT: [QuotaCap("v2", "onDemand", "us-central1", 0)]}, r)
    assert check.outcome == "fail"
    assert check.detail.startswith(f"{V2_ON_DEMAND}: Cloud Quotas knows no such quota id")


def test_an_unreachable_service_is_not_checked() -> None:
    def down(_url: str) -> tuple[int, bytes]:
        raise OSError("connection refused")

    [check] = cap_checks({PROJECT: [QuotaCap("v5e", "preemptible", "us-central1", 0)]},
                         QuotaReader(down))
    assert (check.outcome, check.detail) == (
        "not checked", "Cloud Quotas could not be reached: connection refused")


def test_the_node_lookup_reads_the_limit_of_its_family_and_type() -> None:
    r, _ = reader({url(V2_ON_DEMAND): [(200, quota_info(("us-central1", 4)))]})
    from model import catalog
    assert r.lookup(PROJECT, "us-central1", catalog.GENERATIONS["v2"], False) == 4
    assert r.lookup(PROJECT, "us-central1", catalog.GENERATIONS["v2"], True) is None  # 404


# ---- the command, against a loopback Cloud Quotas -------------------------------------


@pytest.fixture
def quotas_server() -> Iterator[tuple[str, dict[str, bytes]]]:
    """A loopback Cloud Quotas: path → QuotaInfo body; anything else 404."""
    bodies: dict[str, bytes] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = bodies.get(self.path)
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write(body or b"{}")

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1", bodies
    finally:
        server.shutdown()
        server.server_close()


def test_preflight_of_the_platform_shows_each_team_cap_against_the_live_quota(
        quotas_server, fake_tpu: FakeTpuApi, tpu) -> None:
    endpoint, bodies = quotas_server
    settings = settings_for("platform")
    caps = stack_caps(settings)
    assert set(caps) == {"acme-ml-shared-vision", "acme-ml-shared-nlp"}
    path = f"/v1/projects/acme-ml-shared-vision/locations/global/services/tpu.googleapis.com/" \
           f"quotaInfos/{V5E_SPOT}"
    bodies[path] = quota_info(("us-central1", 128), (None, 0))
    bodies[path.replace("-vision/", "-nlp/")] = quota_info(("us-central1", 128), (None, 0))
    report = live_preflight(target(expected_node("dev-a")), tpu, settings,
                            env={"TPU_STACK_QUOTAS_ENDPOINT": endpoint})
    rows = {(c.subject, c.what): c for c in report.checks}
    vision = rows[("v5e preemptible in us-central1 (acme-ml-shared-vision)", "cap at 64 chips")]
    assert vision.outcome == "ok" and vision.detail.startswith("lowers 128 to 64 at once")
    # A region of the team without the platform's v5e quota: capped at 0.
    other_region = rows[("v5e preemptible in us-central2 (acme-ml-shared-nlp)",
                         "cap at 0 chips")]
    assert other_region.detail == "keeps 0"
    # A region the team does not use has no cap at all (teams.vision.regions; issue 45).
    assert not [c for c in report.checks if c.subject.endswith(
        "in us-central2 (acme-ml-shared-vision)")]
    # An id the stand-in does not know is a failure before `up`, not after.
    nlp_v6e = rows[("v6e onDemand in us-central1 (acme-ml-shared-nlp)", "cap at 0 chips")]
    assert nlp_v6e.outcome == "fail"
    assert len([c for c in report.checks if c.what.startswith("cap at")]) == sum(
        len(c) for c in caps.values())


def test_with_a_stand_in_tpu_api_and_no_stand_in_quotas_nothing_leaves_the_machine(
        fake_tpu: FakeTpuApi, tpu) -> None:
    report = live_preflight(target(expected_node("dev-a")), tpu, settings_for("platform"),
                            env={"TPU_STACK_TPU_ENDPOINT": "http://127.0.0.1:9"})
    caps = [c for c in report.checks if c.what.startswith("cap at")]
    assert caps and {c.outcome for c in caps} == {"not checked"}
    assert "stand-in" in caps[0].detail


# ---- the shared backend's layout (issue 34) ---------------------------------------

def _storage(meta: bytes | None, stacks: bool, status: int = 200):
    def get(url: str) -> tuple[int, bytes]:
        if "meta.yaml" in url:
            return (404, b"") if meta is None else (status, meta)
        return 200, b'{"items": [{"name": ".pulumi/stacks/x.json"}]}' if stacks else b"{}"
    return get


def test_a_legacy_state_bucket_fails_preflight_with_the_upgrade_step() -> None:
    from ops.tpu.state_layout import layout_check

    legacy = layout_check("acme-pulumi-state", _storage(None, stacks=True))
    assert legacy.outcome == "fail"
    assert "pulumi state upgrade" in legacy.detail
    assert layout_check("b", _storage(b"version: 0\n", stacks=True)).outcome == "fail"
    assert layout_check("b", _storage(b"version: 1\n", stacks=True)).outcome == "ok"
    assert layout_check("b", _storage(None, stacks=False)).outcome == "ok"  # a new bucket
    denied = layout_check("b", _storage(b"", stacks=True, status=403))
    assert denied.outcome == "not checked" and "403" in denied.detail


def test_preflight_of_the_platform_reads_its_state_bucket_s_layout(fake_tpu, tpu) -> None:
    report = live_preflight(target(expected_node("dev-a")), tpu, settings_for("platform"),
                            env={"TPU_STACK_TPU_ENDPOINT": "http://127.0.0.1:9"})
    [row] = [c for c in report.checks if c.subject == "gs://acme-pulumi-state"]
    assert row.outcome == "not checked" and "stand-in" in row.detail
