"""The controller (issue 43, "What must be true"), run against the fake TPU API and the
GCS emulator behind GCS's create-only precondition."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest

from components.fallback_tpu import FallbackTpuProvider
from node_agent.contract import STOP_REQUEST_KEY as STOP_KEY
from ops.controller import plan as planner
from tests.controller.world import (
    NODE,
    PROJECT,
    QUOTA,
    TAKES,
    V6E_SPOT_QUOTA,
    WAITS,
    World,
    acting,
    fallback_node,
    plain_node,
    provider_props,
    stack,
)


def queue_first_candidate(world: World, *zones: str) -> str:
    world.tpu.script_queued(NODE, "WAITING_FOR_RESOURCES", zone=zones[0])  # forever
    return FallbackTpuProvider().create(provider_props(*zones)).id


def test_runs_move_the_node_past_max_wait_to_2_then_to_3_when_2_is_refused_for_quota(
        world: World) -> None:
    world.publish(stack(fallback_node(WAITS, QUOTA, TAKES)))
    world.watch_requests()
    queue_first_candidate(world, WAITS, QUOTA, TAKES)
    world.tpu.refuse_for_quota(QUOTA, V6E_SPOT_QUOTA)
    world.tpu.script_queued(f"{NODE}-c3", "ACTIVE", zone=TAKES)

    early = world.run(minutes=10)
    moved = world.run(minutes=31)

    assert acting(early) == []
    [outcome] = moved.outcomes
    assert (outcome.step.verb, outcome.result) == ("move-queued", "done")
    assert "longer than maxWait" in outcome.step.reason
    assert f"{NODE}-c2 refused (quota)" in outcome.detail
    assert world.requests_of() == [
        f"projects/{PROJECT}/locations/{TAKES}/queuedResources/{NODE}-c3"]
    assert world.peak_alive[NODE] == 1, "at no instant two requests of the node alive"
    assert world.store.moves() == []
    audit = world.store.last_run()
    assert audit is not None and audit["steps"][0]["reason"] == outcome.step.reason


def test_a_second_run_with_nothing_changed_does_nothing(world: World) -> None:
    world.publish(stack(fallback_node(WAITS, TAKES)))
    queue_first_candidate(world, WAITS, TAKES)
    world.tpu.script_queued(f"{NODE}-c2", "ACTIVE", zone=TAKES)
    world.run(minutes=31)
    before = len(world.tpu.mutating_calls())

    again = world.run(minutes=36)

    assert again.acted and again.steps == [] and len(world.tpu.mutating_calls()) == before


def test_a_504_on_the_status_list_deletes_nothing(world: World) -> None:
    world.publish(stack(fallback_node(WAITS, TAKES)))
    queue_first_candidate(world, WAITS, TAKES)
    world.tpu.fail(504, times=99, action="list", collection="queuedResources", zone=WAITS)

    result = world.run(minutes=31)

    assert result.steps == [] and result.record["unread"]
    assert [c for c in world.tpu.mutating_calls() if c.action == "delete"] == []


def test_an_active_request_past_valid_until_is_untouched_by_the_controller(
        world: World) -> None:
    from google.cloud import tpu_v2

    from cloud.tpu import tpu_client

    qr = tpu_v2.QueuedResource
    world.publish(stack(plain_node("dev-serve", queued=True)))
    world.tpu.script_queued("dev-serve-qr", "ACTIVE", zone=TAKES)
    spec = qr.Tpu.NodeSpec(parent=f"projects/{PROJECT}/locations/{TAKES}", node_id="dev-serve",
                           node=tpu_v2.Node(accelerator_type="v6e-8"))
    tpu_client().create_queued_resource(
        parent=f"projects/{PROJECT}/locations/{TAKES}", queued_resource_id="dev-serve-qr",
        queued_resource=qr(tpu=qr.Tpu(node_spec=[spec]), queueing_policy=qr.QueueingPolicy(
            valid_until_time=datetime.now(timezone.utc) - timedelta(hours=1)))).result(timeout=5)

    result = world.run(minutes=5)

    assert planner.acting(result.steps) == []
    assert world.tpu.queued_resource(TAKES, "dev-serve-qr") is not None


def test_two_runs_started_together_act_once(world: World) -> None:
    world.publish(stack(fallback_node(WAITS, TAKES)))
    queue_first_candidate(world, WAITS, TAKES)
    results = []

    def one_run() -> None:
        results.append(world.run(minutes=31))

    threads = [threading.Thread(target=one_run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(r.acted for r in results) == [False, True]
    deletes = [c for c in world.tpu.mutating_calls() if c.action == "delete"]
    creates = [c for c in world.tpu.mutating_calls() if c.action == "create"]
    assert (len(deletes), len(creates)) == (1, 2)  # the provider's create, the move's


class Killed(BaseException):
    """The run's process ends here (a BaseException: no step catches it)."""


def test_a_run_killed_after_its_first_delete_is_completed_by_the_next(world: World) -> None:
    world.publish(stack(fallback_node(WAITS, TAKES)))
    queue_first_candidate(world, WAITS, TAKES)

    def die_after_delete(phase: str) -> None:
        if phase.startswith("deleted"):
            raise Killed(phase)

    with pytest.raises(Killed):
        world.run(minutes=31, checkpoint=die_after_delete)
    assert world.requests_of() == [] and len(world.store.moves()) == 1

    finished = world.run(minutes=36)

    assert [(o.step.verb, o.result) for o in finished.outcomes] == [("finish-move", "done")]
    assert world.requests_of() == [
        f"projects/{PROJECT}/locations/{TAKES}/queuedResources/{NODE}-c2"]
    assert world.store.moves() == []


def budget_marker(world: World, team: str) -> None:
    start = datetime.now(timezone.utc).replace(day=1, hour=0, minute=0, second=0,
                                               microsecond=0)
    world.store.bucket.blob(f"budget-stop/{team}/b-1/{start:%Y-%m-%dT%H%M%SZ}/at-1.json"
                            ).upload_from_string("{}")


def test_a_team_past_its_budget_is_saved_then_deleted_and_a_failed_delete_is_retried(
        world: World) -> None:
    labels = {"stack": "team-vision", "managed-by": "pulumi", "team": "vision"}
    world.publish(stack(plain_node("tv-a", team="vision"), plain_node("tv-b", team="vision"),
                        name="team-vision"))
    for node_id in ("tv-a", "tv-b"):
        world.tpu.add_node(TAKES, node_id, accelerator_type="v6e-8", labels=labels,
                           metadata={"startup-script": "#!/bin/bash"})
    budget_marker(world, "vision")

    asked = world.run(minutes=0)
    saving = {n: world.tpu.node(TAKES, n).metadata[STOP_KEY] for n in ("tv-a", "tv-b")}
    world.tpu.fail(403, times=1, action="delete", collection="nodes", zone=TAKES)
    first = world.run(minutes=5)
    second = world.run(minutes=10)

    assert acting(asked) == [("save-node", "done")] * 2
    assert all(why.startswith("budget hold (budget stop in") for why in saving.values())
    assert sorted(r for _, r in acting(first)) == ["done", "failed"]
    assert acting(second) == [("delete-node", "done")]
    assert world.tpu.node(TAKES, "tv-a") is None and world.tpu.node(TAKES, "tv-b") is None


def test_a_held_teams_team_stack_nodes_are_saved_then_deleted_though_no_manifest_names_them(
        world: World) -> None:
    from model.manifest import BudgetTeam

    labels = {"stack": "team-vision", "managed-by": "pulumi", "team": "vision"}
    world.publish(stack(plain_node("dev-a")), budget_teams=(BudgetTeam("vision", PROJECT,
                                                                        (TAKES,)),))
    world.tpu.add_node(TAKES, "team-vision-a", accelerator_type="v6e-8", labels=labels)
    world.tpu.add_queued_node(TAKES, "team-vision-q", accelerator_type="v6e-8", labels=labels)
    world.tpu.add_node(TAKES, "dev-a", accelerator_type="v6e-8",
                       labels={"stack": "dev", "managed-by": "pulumi", "team": "platform"})
    budget_marker(world, "vision")

    asked = world.run(minutes=0)
    deleted = world.run(minutes=5)

    assert sorted(o.step.node for o in asked.outcomes) == ["team-vision-a", "team-vision-q"]
    assert {o.step.verb for o in asked.outcomes} == {"save-node"}
    assert sorted((o.step.verb, o.result) for o in deleted.outcomes) == [
        ("delete-node", "done"), ("delete-queued", "done")]
    assert world.tpu.node(TAKES, "team-vision-a") is None
    assert world.tpu.queued_resource(TAKES, "team-vision-q-qr") is None
    assert world.tpu.node(TAKES, "dev-a") is not None


def test_runs_either_side_of_a_slot_boundary_act_once_and_a_released_lease_frees_the_next(
        world: World) -> None:
    from datetime import timedelta

    boundary = datetime.fromtimestamp((world.started.timestamp() // 300 + 1) * 300,
                                      timezone.utc)
    before = world.store.try_lease("a", boundary - timedelta(seconds=1), 300)
    after = world.store.try_lease("b", boundary + timedelta(seconds=1), 300)
    assert before is not None and after is None

    world.store.release(before)
    assert world.store.try_lease("c", boundary + timedelta(seconds=2), 300) is not None


def test_idle_stops_only_a_node_whose_agent_reported_from_its_status_object(
        world: World) -> None:
    import json

    from node_agent.contract import STATUS_KEY

    labels = {"stack": "dev", "managed-by": "pulumi", "team": "platform"}
    world.publish(stack(plain_node("dev-done"), plain_node("dev-silent")), idle=60)
    for node_id in ("dev-done", "dev-silent"):
        world.tpu.add_node(TAKES, node_id, accelerator_type="v6e-8", labels=labels,
                           metadata={STATUS_KEY: f"gs://{world.store.bucket_name}/status/"
                                                 f"{node_id}/"})
    fields = {"state": "succeeded", "updated": "2026-12-05T00:00:00Z"}
    blob = world.store.bucket.blob("status/dev-done/worker-0/status.json")
    blob.metadata = fields
    blob.upload_from_string(json.dumps(fields), content_type="application/json")

    result = world.run(minutes=0)

    assert [(o.step.verb, o.step.node, o.result) for o in result.outcomes] == [
        ("stop-node", "dev-done", "done")]
    assert "job succeeded" in result.outcomes[0].step.reason
