"""tpuctl preflight: catalog, the zone's live offers, quota; offline says so."""

from __future__ import annotations

import pytest

from model import catalog
from ops.tpu.api import TpuApi
from ops.tpu.preflight import preflight
from tests.fakes.tpu_api import FakeTpuApi
from tests.ops.tpu_world import OTHER_ZONE, PROJECT, ZONE, expected_node, target


def outcomes(report) -> list[tuple[str, str, str]]:
    return [(c.subject, c.what, c.outcome) for c in report.checks]


def test_live_preflight_checks_each_zone_once_and_passes(fake_tpu: FakeTpuApi, tpu: TpuApi) -> None:
    stack = target(expected_node("dev-a"), expected_node("dev-b", spot=True))

    report = preflight(stack, tpu)

    assert report.live and report.ok
    assert ("dev-a", "zone offers v2-8", "ok") in outcomes(report)
    assert ("dev-b", "zone offers tpu-vm-tf-2.18.0-pjrt", "ok") in outcomes(report)
    assert [(c.action, c.collection) for c in fake_tpu.calls] == [
        ("list", "acceleratorTypes"),
        ("list", "runtimeVersions"),
    ]
    quota = [c for c in report.checks if c.what.startswith("quota")]
    assert [(c.subject, c.what, c.outcome) for c in quota] == [
        ("v2 on-demand in us-central1", "quota for 4 chips", "not checked"),
        ("v2 spot in us-central1", "quota for 4 chips", "not checked"),
    ]
    assert fake_tpu.mutating_calls() == []


def test_a_zone_that_does_not_offer_the_type_or_runtime_fails(
    fake_tpu: FakeTpuApi, tpu: TpuApi
) -> None:
    # No Google doc lists a TF 2.19 image (the catalog refuses it), and this zone
    # of the fake offers only 2.18: both checks fail.
    stack = target(expected_node("dev-big", OTHER_ZONE, "v3-8", "tpu-vm-tf-2.19.0-pjrt"))

    report = preflight(stack, tpu)

    assert not report.ok
    failed = [c for c in report.checks if c.outcome == "fail"]
    assert [c.what for c in failed] == ["catalog: runtime tpu-vm-tf-2.19.0-pjrt",
                                        "zone offers tpu-vm-tf-2.19.0-pjrt"]
    assert failed[1].detail == "europe-west4-a offers: tpu-vm-tf-2.18.0-pjrt"


def test_the_catalog_check_catches_a_zone_the_generation_is_not_in(fake_tpu: FakeTpuApi) -> None:
    stack = target(expected_node("dev-a", "us-central2-b", "v2-8"))

    report = preflight(stack, None)

    assert not report.live and report.note == "offline: checked against the catalog only"
    assert ("dev-a", "catalog: v2 in us-central2-b", "fail") in outcomes(report)
    assert fake_tpu.calls == []


def test_quota_is_compared_when_a_lookup_answers(fake_tpu: FakeTpuApi, tpu: TpuApi) -> None:
    stack = target(expected_node("dev-a"), expected_node("dev-b"))
    seen = []

    def lookup(project: str, region: str, gen: catalog.Generation, spot: bool) -> int:
        seen.append((project, region, gen.name, spot))
        return 4

    report = preflight(stack, tpu, quota=lookup)

    assert seen == [(PROJECT, "us-central1", "v2", False)]
    quota = [c for c in report.checks if c.what.startswith("quota")]
    assert [(c.what, c.outcome, c.detail) for c in quota] == [
        ("quota for 8 chips", "fail", "quota allows 4")
    ]


def test_without_credentials_preflight_falls_back_to_the_catalog(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.delenv("TPU_STACK_TPU_ENDPOINT", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "absent.json"))

    report = preflight(target(expected_node("dev-a", ZONE)), TpuApi())

    assert not report.live and report.ok
    assert report.credentials_error.startswith("no usable Google credentials: "
                                               "GOOGLE_APPLICATION_CREDENTIALS names ")
    assert report.note == "checked against the catalog only"
    assert ("v2 on-demand in us-central1", "quota for 4 chips", "not checked") in outcomes(report)


def test_offline_preflight_still_lists_the_chips_each_quota_must_allow() -> None:
    report = preflight(target(expected_node("dev-a"), expected_node("dev-b")), None)
    quota = [c for c in report.checks if c.what.startswith("quota")]
    assert [(c.subject, c.what, c.outcome) for c in quota] == [
        ("v2 on-demand in us-central1", "quota for 8 chips", "not checked")]


def test_a_generation_suffixed_runtime_passes_the_catalog_with_its_note_and_live_decides(
    fake_tpu: FakeTpuApi, tpu: TpuApi
) -> None:
    runtime = "tpu-vm-tf-2.18.0-pjrt-v5p-and-below"
    stack = target(expected_node("dev-a", runtime_version=runtime))

    offline = {c.what: c for c in preflight(stack, None).checks}
    live = {c.what: c for c in preflight(stack, tpu).checks}

    check = offline[f"catalog: runtime {runtime}"]
    assert check.outcome == "ok"
    assert check.detail == ("v5p-and-below images have only secondary sources "
                            "(docs/tpu-facts.md): `tpuctl preflight --live` checks that the "
                            f"zone offers {runtime}")
    assert live[f"zone offers {runtime}"].outcome == "fail"  # this zone lists no such image
