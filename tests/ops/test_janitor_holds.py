"""A node the janitor deleted past maxRuntime stays deleted (issue 36): `--apply`
records it in the stack's artifacts bucket with the node's settings digest, which the
program reads (tests/infra/test_budget_hold.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from model.budget_hold import janitor_marker
from node_agent.contract import MAX_RUNTIME_KEY
from ops.local.storage_emulator import StorageEmulator
from ops.tpu.actions import apply_actions, janitor_plan, record_holds
from ops.tpu.api import TpuApi
from ops.tpu.logs import AgentLogs
from ops.tpu.status import collect
from tests.fakes.tpu_api import FakeTpuApi
from tests.ops.tpu_world import PROJECT, STACK_LABELS, ZONE, expected_node, target

NOW = datetime(2026, 12, 2, 14, 0, tzinfo=timezone.utc)
BUCKET = "acme-ml-dev-artifacts"


def test_the_janitor_records_its_deletions_past_max_runtime_only(
    fake_tpu: FakeTpuApi, tpu: TpuApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    limit = {MAX_RUNTIME_KEY: "3600"}
    fake_tpu.add_node(ZONE, "dev-old", labels=STACK_LABELS, metadata=limit,
                      created=NOW - timedelta(hours=2))
    fake_tpu.add_node(ZONE, "dev-idle-pod", accelerator_type="v3-32", labels=STACK_LABELS,
                      created=NOW - timedelta(minutes=30))
    fake_tpu.set_guest_attributes(ZONE, "dev-idle-pod", 0, {
        "state": "stopped", "updated": NOW.isoformat(), "message": "stopped (idleStop)"})
    nodes = [replace(expected_node(n), settings_digest=f"digest-{n}")
             for n in ("dev-old", "dev-idle-pod")]
    stack = replace(target(*nodes), artifacts_bucket=BUCKET)
    actions = janitor_plan(collect(tpu, stack), idle_minutes=24 * 60, now=NOW)
    assert [(a.verb, a.subject, a.holds) for a in actions] == [
        ("delete-node", "dev-idle-pod", ""), ("delete-node", "dev-old", "dev-old")]
    apply_actions(tpu, actions)

    with StorageEmulator() as emulator:
        emulator.create_bucket(BUCKET)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.host)
        client = AgentLogs(PROJECT).client
        marker = janitor_marker("dev-old", "digest-dev-old")
        assert record_holds(client, stack, actions, NOW) == [marker]
        assert record_holds(client, stack, actions, NOW) == [marker]  # again: no error
        assert emulator.names(f"gs://{BUCKET}/janitor/") == [f"gs://{BUCKET}/{marker}"]
        record = json.loads(emulator.read(f"gs://{BUCKET}/{marker}") or b"{}")
        assert record["node"] == "dev-old" and record["reason"].startswith("past maxRuntime")
