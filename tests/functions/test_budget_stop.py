"""The budget-stop function through its real entry point (functions-framework, a Pub/Sub
CloudEvent), against the fake TPU API holding two teams' nodes and a GCS emulator for
its marker (issue 36, "What must be true")."""

from __future__ import annotations

import base64
import io
import json
import zipfile
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from components.budget_stop import ENTRY_POINT, function_source
from model import catalog, spend
from model.meter import price_table
from ops.local.storage_emulator import StorageEmulator
from tests.fakes.gcs_preconditions import CreateOnlyProxy
from tests.fakes.tpu_api import FakeTpuApi, running

ZONE = "us-central1-a"
VISION, NLP = "acme-ml-shared-vision", "acme-ml-shared-nlp"
MARKERS = "acme-ml-shared-platform-artifacts"
BUDGET_ID = "b-1234"
INTERVAL = "2026-12-01T08:00:00Z"
STOP_KEY = "tpu-stack-stop"


def labels(team: str) -> dict[str, str]:
    return {"team": team, "stack": "platform", "managed-by": "pulumi"}


def budget_event(cost: float, budget: float = 1000.0, exceeded: float | None = None) -> dict:
    data: dict[str, Any] = {"budgetDisplayName": "tpu-stack platform vision",
                            "costAmount": cost, "costIntervalStart": INTERVAL,
                            "budgetAmount": budget, "budgetAmountType": "SPECIFIED_AMOUNT",
                            "currencyCode": "USD"}
    if exceeded is not None:
        data["alertThresholdExceeded"] = exceeded
    message = {"data": base64.b64encode(json.dumps(data).encode()).decode(),
               "attributes": {"billingAccountId": "01AB23-45CD67-89EF01",
                              "budgetId": BUDGET_ID, "schemaVersion": "1.0"},
               "messageId": "1", "publishTime": "2026-12-04T10:00:00Z"}
    return {"message": message, "subscription": "projects/p/subscriptions/s"}


@pytest.fixture
def emulator() -> Iterator[StorageEmulator]:
    with StorageEmulator() as running_emulator:
        running_emulator.create_bucket(MARKERS)
        yield running_emulator


@pytest.fixture
def gcs(emulator: StorageEmulator) -> Iterator[CreateOnlyProxy]:
    """The emulator (its own per test: no marker left by another) with GCS's create-only
    precondition."""
    with CreateOnlyProxy(emulator.host) as proxy:
        yield proxy


@pytest.fixture
def tpu() -> Iterator[FakeTpuApi]:
    """Two teams, each in its own project: vision's plain node, queued node and a
    waiting queued request, an unlabelled node made by hand in vision's project, and
    nlp's node."""
    fake = FakeTpuApi("acme-ml-shared", accelerator_types={ZONE: ["v2-8", "v5litepod-8"]})
    vision, nlp = fake.add_project(VISION), fake.add_project(NLP)
    boot = {"startup-script": "#!/bin/bash\necho boot", "tpu-stack-release": "gs://r/"}
    vision.add_node(ZONE, "platform-vision-a", accelerator_type="v4-8", labels=labels("vision"),
                    metadata=boot)
    vision.add_queued_node(ZONE, "platform-vision-q", accelerator_type="v5litepod-8",
                           labels=labels("vision"), metadata=boot, spot=True)
    vision.add_node(ZONE, "by-hand")
    nlp.add_node(ZONE, "platform-nlp-a", labels=labels("nlp"), metadata=boot)
    with running(fake):
        yield fake


def call(client: Any, event: dict) -> None:
    headers = {"ce-id": "1", "ce-specversion": "1.0", "ce-source":
               "//pubsub.googleapis.com/projects/acme-ml-shared/topics/budget-vision",
               "ce-type": "google.cloud.pubsub.topic.v1.messagePublished",
               "Content-Type": "application/json"}
    answer = client.post("/", data=json.dumps(event), headers=headers)
    assert answer.status_code == 200, answer.data


@pytest.fixture
def function(tmp_path: Path, tpu: FakeTpuApi, gcs: CreateOnlyProxy,
             monkeypatch: pytest.MonkeyPatch) -> Any:
    """The deployed archive, unpacked and served by functions-framework as Cloud Run does."""
    import functions_framework

    with zipfile.ZipFile(io.BytesIO(function_source())) as archive:
        archive.extractall(tmp_path / "source")
    for key, value in {"TPU_STACK_TPU_ENDPOINT": tpu.endpoint,
                       "STORAGE_EMULATOR_HOST": gcs.host, "TPU_STACK_TEAM": "vision",
                       "TPU_STACK_PROJECT": VISION,
                       "TPU_STACK_ZONES": f"{ZONE},europe-west4-a",  # the fake serves one
                       "TPU_STACK_MARKER_BUCKET": MARKERS,
                       "TPU_STACK_SAVE_GRACE_SECONDS": "0"}.items():
        monkeypatch.setenv(key, value)
    app = functions_framework.create_app(ENTRY_POINT, str(tmp_path / "source" / "main.py"),
                                         "cloudevent")
    return app.test_client()


def test_below_at_and_again_asks_the_teams_nodes_to_save_then_deletes_them_once(
        function: Any, tpu: FakeTpuApi) -> None:
    vision, nlp = tpu.projects[VISION], tpu.projects[NLP]
    patched: list[tuple[str, dict[str, str]]] = []
    patch = vision._patch_node

    def recording_patch(zone: str, rid: str, query: dict, body: bytes) -> Any:
        patched.append((rid, dict(json.loads(body)["metadata"])))
        return patch(zone, rid, query, body)

    vision._patch_node = recording_patch  # type: ignore[method-assign]

    call(function, budget_event(500.0))
    assert vision.mutating_calls() == [] and nlp.mutating_calls() == []

    call(function, budget_event(1000.0, exceeded=1.0))
    changes = [(c.action, c.collection, c.resource_id) for c in vision.mutating_calls()]
    assert changes == [("patch", "nodes", "platform-vision-a"),
                       ("patch", "nodes", "platform-vision-q"),
                       ("delete", "queuedResources", "platform-vision-q-qr"),
                       ("delete", "nodes", "platform-vision-a")]
    for node_id, metadata in patched:
        assert metadata[STOP_KEY].startswith("budget tpu-stack platform vision: spend 1000.00 "
                                             "reached the budget's stop"), node_id
        assert metadata["startup-script"].startswith("#!/bin/bash"), "the node's keys kept"
    assert vision.node(ZONE, "platform-vision-a") is None
    assert vision.node(ZONE, "platform-vision-q") is None
    assert vision.queued_resource(ZONE, "platform-vision-q-qr") is None
    assert vision.node(ZONE, "by-hand") is not None, "not labelled the team's: left alone"
    assert nlp.node(ZONE, "platform-nlp-a") is not None and nlp.mutating_calls() == []
    assert tpu.mutating_calls() == [], "the platform's own project is not touched"

    vision.add_node(ZONE, "platform-vision-b", labels=labels("vision"))  # made again since
    call(function, budget_event(1000.0, exceeded=1.0))
    call(function, budget_event(1012.5, exceeded=1.0))  # a later update, same interval
    assert len(vision.mutating_calls()) == 4, "acted once for the budget's interval"
    assert vision.node(ZONE, "platform-vision-b") is not None


def test_the_meter_acts_before_the_reported_cost_catches_up(
        function: Any, tpu: FakeTpuApi) -> None:
    vision = tpu.projects[VISION]
    started = datetime(2026, 12, 1, 8, tzinfo=timezone.utc)
    vision.node_message(ZONE, "platform-vision-a").create_time = started
    # Billing reports little (its data lags by hours); the meter sees v4-8 on demand
    # since the interval started, days ago: more than the budget.
    hourly = catalog.usd_per_hour(catalog.parse_accelerator_type("v4-8"), spot=False)
    assert hourly is not None
    hours = (datetime.now(timezone.utc) - started).total_seconds() / 3600
    budget = hourly * hours * 0.9
    call(function, budget_event(1.0, budget=budget))
    assert vision.node(ZONE, "platform-vision-a") is None


def test_a_message_that_is_no_budget_notification_is_acknowledged_and_ignored(
        function: Any, tpu: FakeTpuApi) -> None:
    call(function, {"message": {"data": base64.b64encode(b"hello").decode()}})
    assert tpu.projects[VISION].mutating_calls() == []


# ---- the pure parts ----------------------------------------------------------------

def message(cost: float, budget: float = 100.0) -> spend.BudgetMessage:
    return spend.BudgetMessage.from_pubsub(budget_event(cost, budget)["message"])


def test_the_projection_over_the_horizon_stops_before_the_budget_is_spent() -> None:
    assert not spend.decide(message(50.0), meter=0.0, burn=2.0, horizon_hours=24).act
    decision = spend.decide(message(50.0), meter=0.0, burn=2.1, horizon_hours=24)
    assert decision.act and "projected" in decision.reason
    assert decision.projected_usd == pytest.approx(50.0 + 2.1 * 24)
    assert spend.decide(message(10.0), meter=120.0, burn=0.0, horizon_hours=24).spend_usd == 120


def test_the_function_prices_a_node_as_the_catalog_does() -> None:
    table = price_table()
    for accelerator_type in ("v2-8", "v4-32", "v5litepod-16", "v5p-8", "v6e-8"):
        tpu = catalog.parse_accelerator_type(accelerator_type)
        for spot in (False, True):
            expected = catalog.usd_per_hour(tpu, spot=spot)
            got = spend.hourly_usd(table, accelerator_type, spot)
            assert got == pytest.approx(expected) if expected is not None else got is None


def test_the_marker_is_one_per_budget_interval_and_threshold() -> None:
    first = spend.marker_name("vision", message(100.0), 1.0)
    assert first == "budget-stop/vision/b-1234/2026-12-01T080000Z/at-1.json"
    assert spend.marker_name("vision", message(130.0), 1.0) == first
    later = spend.BudgetMessage.from_pubsub(budget_event(1.0)["message"])
    assert spend.marker_name("vision", later, 0.9) != first
    assert spend.hours_left(100.0, 40.0, 3.0) == pytest.approx(20.0)
    assert spend.hours_left(100.0, 100.0, 3.0) == 0.0
    assert spend.hours_left(100.0, 40.0, 0.0) is None
    assert timedelta(hours=1).total_seconds() == spend.SECONDS_PER_HOUR


def test_a_refused_stop_request_still_deletes_after_the_grace(
        function: Any, tpu: FakeTpuApi) -> None:
    vision = tpu.projects[VISION]
    vision.fail(400, times=1, action="patch", collection="nodes",
                message="node is not READY")  # the first node's request refused
    call(function, budget_event(1000.0, exceeded=1.0))
    assert vision.node(ZONE, "platform-vision-a") is None
    assert vision.node(ZONE, "platform-vision-q") is None
    assert [c.action for c in vision.mutating_calls()].count("patch") == 2
