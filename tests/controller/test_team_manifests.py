"""The controller sees team stacks (issue 43): a team stack's manifest, in its own artifacts
bucket where its platform's manifest says (teamManifests), is reconciled as the platform's
is; its agents' status is read from its own logs bucket (statusBuckets); a missing or
malformed team manifest is a problem line and the other stacks are still reconciled.
Against the fake TPU API and the GCS emulator."""

from __future__ import annotations

import json
from dataclasses import replace

from components.fallback_tpu import FallbackTpuProvider
from model.manifest import TeamManifestRef, manifest_json, object_name
from node_agent.contract import STATUS_KEY
from ops.controller.run import last_run_lines
from tests.controller.world import (
    PROJECT,
    TAKES,
    WAITS,
    World,
    fallback_node,
    plain_node,
    provider_props,
    stack,
)

TEAM_STACK = "team-vision"
TEAM_BUCKET = "acme-ml-dev-team-vision-vision-artifacts"
TEAM_LOGS = "acme-ml-dev-team-vision-vision-logs"
TEAM_NODE = "team-vision-vision-trainer"
TEAM_LABELS = {"stack": TEAM_STACK, "managed-by": "pulumi", "team": "vision"}
PLATFORM_LABELS = {"stack": "dev", "managed-by": "pulumi", "team": "platform"}


def team_ref(bucket: str = TEAM_BUCKET) -> TeamManifestRef:
    return TeamManifestRef("vision", TEAM_STACK, PROJECT, bucket, object_name(TEAM_STACK))


def publish_team(world: World, *nodes, status_buckets: tuple[str, ...] = ()) -> None:
    """The team stack's manifest in its own bucket (components/team_manifest.py)."""
    target = replace(stack(*nodes, name=TEAM_STACK), artifacts_bucket=TEAM_BUCKET)
    world.store.client.bucket(TEAM_BUCKET).blob(object_name(TEAM_STACK)).upload_from_string(
        manifest_json(target, status_buckets=status_buckets), content_type="application/json")


def team_fallback_node(*zones: str):
    return replace(fallback_node(*zones), node_id=TEAM_NODE, team="vision")


def test_a_team_stack_only_fallback_node_is_moved_by_controller_runs_after_max_wait(
        world: World) -> None:
    world.store.client.create_bucket(TEAM_BUCKET)
    world.publish(stack(), team_manifests=(team_ref(),))
    publish_team(world, team_fallback_node(WAITS, TAKES))
    world.tpu.script_queued(TEAM_NODE, "WAITING_FOR_RESOURCES", zone=WAITS)  # forever
    FallbackTpuProvider().create({**provider_props(WAITS, TAKES), "node_id": TEAM_NODE,
                                  "labels": TEAM_LABELS})
    world.watch_requests(TEAM_NODE)

    early = world.run(minutes=10)
    moved = world.run(minutes=31)

    assert early.outcomes == [] and early.record["stacks"] == ["dev", TEAM_STACK]
    assert [(o.step.verb, o.step.stack, o.result) for o in moved.outcomes] == [
        ("move-queued", TEAM_STACK, "done")]
    assert "longer than maxWait" in moved.outcomes[0].step.reason
    assert world.requests_of(TEAM_NODE) == [
        f"projects/{PROJECT}/locations/{TAKES}/queuedResources/{TEAM_NODE}-c2"]
    assert world.peak_alive[TEAM_NODE] == 1
    assert moved.record["problems"] == []


def add_status(world: World, bucket: str, node_id: str, state: str) -> None:
    fields = {"state": state, "message": "idle 61 min: idleStop 1h",
              "updated": "2026-12-05T00:00:00Z"}
    blob = world.store.client.bucket(bucket).blob(f"status/{node_id}/worker-0/status.json")
    blob.metadata = fields
    blob.upload_from_string(json.dumps(fields), content_type="application/json")


def test_an_idle_team_stack_node_is_stopped_from_its_status_in_the_teams_logs_bucket(
        world: World) -> None:
    for bucket in (TEAM_BUCKET, TEAM_LOGS):
        world.store.client.create_bucket(bucket)
    # The platform names a logs bucket it cannot read: one problem line, nothing else lost.
    world.publish(stack(plain_node("dev-a")), team_manifests=(team_ref(),),
                  status_buckets=("acme-ml-dev-gone-logs",))
    idle, busy = "team-vision-vision-idle", "team-vision-vision-busy"
    publish_team(world, plain_node(idle, team="vision"), plain_node(busy, team="vision"),
                 status_buckets=(TEAM_LOGS,))
    for node_id in (idle, busy):
        world.tpu.add_node(TAKES, node_id, accelerator_type="v6e-8", labels=TEAM_LABELS,
                           metadata={STATUS_KEY: f"gs://{TEAM_LOGS}/status/{node_id}/"})
    world.tpu.add_node(TAKES, "dev-a", accelerator_type="v6e-8", labels=PLATFORM_LABELS)
    add_status(world, TEAM_LOGS, idle, "stopped")  # its agent's idleStop stopped the job
    add_status(world, TEAM_LOGS, busy, "running")

    result = world.run(minutes=0)

    assert [(o.step.verb, o.step.node, o.result) for o in result.outcomes] == [
        ("stop-node", idle, "done")]
    assert result.outcomes[0].step.reason.startswith("stopped for good: idle 61 min")
    assert world.tpu.node(TAKES, idle).state.name == "STOPPED"
    [problem] = result.record["problems"]
    assert problem.startswith("gs://acme-ml-dev-gone-logs: the agents' status was not read")


def test_a_missing_or_foreign_team_manifest_is_a_problem_and_the_platform_is_reconciled(
        world: World) -> None:
    world.store.client.create_bucket(TEAM_BUCKET)
    other = TeamManifestRef("nlp", "team-nlp", PROJECT, TEAM_BUCKET, object_name("team-nlp"))
    world.publish(stack(plain_node("dev-lost")), team_manifests=(team_ref(), other))
    # vision's manifest names a node of another project: not vision's to give.
    stray = replace(plain_node("team-vision-vision-x", team="vision"), project="acme-ml-other")
    publish_team(world, stray)
    world.tpu.add_node(TAKES, "dev-lost", "PREEMPTED", accelerator_type="v6e-8",
                       labels=PLATFORM_LABELS)

    result = world.run(minutes=0)

    assert [(o.step.verb, o.step.node, o.result) for o in result.outcomes] == [
        ("delete-node", "dev-lost", "done")]
    assert result.record["stacks"] == ["dev"]
    missing, foreign = sorted(result.record["problems"])
    assert missing.startswith(f"gs://{TEAM_BUCKET}/controller/manifests/team-nlp.json: no "
                              f"manifest of team nlp's stack team-nlp")
    assert foreign.startswith(f"gs://{TEAM_BUCKET}/controller/manifests/{TEAM_STACK}.json: "
                              f"not team vision's to give") and "team-vision-vision-x" in foreign
    lines, _stale = last_run_lines(world.store.last_run(), world.clock(1))
    assert f"  problem: {missing}" in lines  # tpuctl status shows them


def test_a_malformed_team_manifest_is_a_problem_line(world: World) -> None:
    world.store.client.create_bucket(TEAM_BUCKET)
    world.publish(stack(), team_manifests=(team_ref(),))
    world.store.client.bucket(TEAM_BUCKET).blob(object_name(TEAM_STACK)).upload_from_string(
        "{not json")

    result = world.run(minutes=0)

    [problem] = result.record["problems"]
    assert "not a controller manifest" in problem and TEAM_STACK in problem
    assert result.record["leased"] and result.record["stacks"] == ["dev"]
