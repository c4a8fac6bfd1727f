"""`tpuctl plan --live`: each fallback candidate's quota headroom from Cloud Quotas' limit
less the project's usage outside the stack (the TPU API) less the plan's other nodes."""

from __future__ import annotations

import pytest

from model import catalog
from model.settings.load import load_settings
from ops.commands.plan import print_report
from ops.plan.offline import offline_plan
from ops.tpu.api import TpuApi
from ops.tpu.headroom import ReservationReader, live_candidates
from ops.tpu.quota import QuotaReader, plain_get, quota_info_url
from tests.fakes.tpu_api import FakeTpuApi, running
from tests.infra.stack_fixtures import as_cli, config, node
from tests.ops.test_tpu_quota import FakeQuotas, quota_info
from tests.ops.tpu_world import PROJECT, STACK_LABELS

SPOT = catalog.TPU_QUOTA_IDS[("v5e", "preemptible")]
ZONES = ("us-central1-a", "us-west4-a")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):
    from cloud.tpu import ENDPOINT_ENV

    api = FakeTpuApi(project=PROJECT, accelerator_types={z: ["v5litepod-8"] for z in ZONES},
                     runtime_versions={z: ["v2-alpha-tpuv5-lite"] for z in ZONES})
    with running(api):
        monkeypatch.setenv(ENDPOINT_ENV, api.endpoint)
        yield api


def settings():
    """trainer (v5e-8 spot, us-central1-a, then us-west4-a) and `other` (v5e-8 spot,
    us-central1-a) in one project."""
    return load_settings(as_cli(config(
        gcp_project=PROJECT,
        tpu_stack_nodes=[node(fallback=[{"zone": "us-west4-a"}]), node(name="other")])),
        "test")


def read_live(fake: FakeTpuApi, stack, quotas: QuotaReader):
    """live_candidates against the fake TPU API (nodes and reservations)."""
    return live_candidates(stack, TpuApi(deadline=10.0), quotas,
                           ReservationReader(plain_get, fake.endpoint))


def reader(limits: dict[str, tuple]) -> QuotaReader:
    fake = FakeQuotas({quota_info_url(PROJECT, quota): [(200, quota_info(*entries))]
                       for quota, entries in limits.items()})
    return QuotaReader(fake, sleep=lambda _s: None)


def test_limit_less_usage_outside_the_stack_less_the_plans_other_nodes(fake) -> None:
    fake.add_node("us-central1-a", "someone-else", accelerator_type="v5litepod-16", spot=True)
    fake.add_node("us-west4-a", "on-demand-elsewhere", accelerator_type="v5litepod-8")
    # The stack's own running node is the plan's `other`: counted once, as the plan's.
    fake.add_node("us-central1-a", "test-other", accelerator_type="v5litepod-8", spot=True,
                  labels={**STACK_LABELS, "stack": "test"})

    live = read_live(fake, settings(), reader({SPOT: [("us-central1", 64), (None, 32)]}))

    rows = live.candidates["trainer"]
    # us-central1: 64 - 16 (someone else's spot v5e) - 8 (the plan's other node)
    # us-west4: the default 32; the on-demand node there draws on another quota.
    assert [(r["zone"], r["quotaHeadroom"]) for r in rows] == [
        ("us-central1-a", "40"), ("us-west4-a", "32")]
    assert live.notes == ()


def test_an_unread_limit_stays_unknown_and_says_why(fake) -> None:
    live = read_live(fake, settings(), reader({}))

    assert {r["quotaHeadroom"] for r in live.candidates["trainer"]} == {"unknown"}
    assert live.notes and SPOT in live.notes[0]


def test_an_unread_zone_leaves_its_region_unknown_never_too_high(fake) -> None:
    fake.fail(403, action="list", collection="nodes", zone="us-west4-a")

    live = read_live(fake, settings(), reader({SPOT: [(None, 32)]}))

    assert [r["quotaHeadroom"] for r in live.candidates["trainer"]] == ["24", "unknown"]
    assert any("us-west4-a" in note for note in live.notes)


def test_tpuctl_plan_live_shows_the_figures(fake, monkeypatch, capsys) -> None:
    monkeypatch.setattr("ops.commands.plan.live_source",
                        lambda _result: (TpuApi(deadline=10.0), reader({SPOT: [(None, 48)]}),
                                         ReservationReader(plain_get, fake.endpoint)))
    plan = offline_plan("test", as_cli(config(
        gcp_project=PROJECT, tpu_stack_nodes=[node(fallback=[{"zone": "us-west4-a"}])])))

    print_report(plan, "table", None, live=True)

    out = capsys.readouterr().out
    assert "quota headroom read live" in out
    assert "48" in out.split("fallback candidates")[1]


def reserved_settings(name: str):
    return load_settings(as_cli(config(gcp_project=PROJECT, tpu_stack_nodes=[node(
        allowCostlier=True, fallback=[{"zone": "us-west4-a", "provisioning": "queued",
                                       "queue": {"reservationName": name}}])])), "test")


@pytest.mark.parametrize(("reservation", "left"), [
    ({"size": 16, "used": 8}, "8"),
    ({"size": 32, "used": 16, "units": "CORES"}, "16"),  # v5e: 1 core per chip
    ({"size": 16, "used": 0, "state": "EXPIRED"}, "EXPIRED"),
])
def test_a_reserved_candidate_shows_what_is_left_of_its_reservation(fake, reservation,
                                                                     left) -> None:
    fake.add_reservation("us-west4-a", "res-a", **reservation)
    fake.add_reservation("us-west4-a", "res-b", size=64, used=0)

    live = read_live(fake, reserved_settings(f"projects/{PROJECT}/locations/us-west4-a/"
                                             "reservations/res-a"), reader({}))

    assert [r["reservationHeadroom"] for r in live.candidates["trainer"]] == ["n/a", left]


def test_a_reservation_the_zone_does_not_list_is_not_found(fake) -> None:
    live = read_live(fake, reserved_settings("res-gone"), reader({}))

    assert live.candidates["trainer"][1]["reservationHeadroom"] == "not found"


def test_plan_live_of_a_stack_without_fallback_prints_the_same_plan(monkeypatch) -> None:
    from typer.testing import CliRunner

    from ops.cli import app

    def no_reads(_result):
        raise AssertionError("nothing is read live for a stack without fallback")

    monkeypatch.setattr("ops.commands.plan.live_source", no_reads)
    runner = CliRunner()

    offline = runner.invoke(app, ["plan", "--stack", "dev", "--format", "json"])
    live = runner.invoke(app, ["plan", "--stack", "dev", "--format", "json", "--live"])

    assert offline.exit_code == live.exit_code == 0, live.output
    assert live.stdout == offline.stdout
