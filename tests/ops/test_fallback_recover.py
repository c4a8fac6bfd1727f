"""tpuctl recover moves a fallback node's request between candidates; janitor frees quota."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from io import StringIO

import pytest
from rich.console import Console
from typer.testing import CliRunner

from cloud.tpu import tpu_client
from components.fallback_tpu import enqueue, merged
from model import catalog
from ops.cli import app
from ops.commands import tpu as tpu_cmds
from ops.tpu.actions import fallback_recovery_plan, queued_janitor_plan
from ops.tpu.api import QueuedStatus
from tests.fakes.tpu_api import CAPACITY_MESSAGE, FakeTpuApi
from tests.ops.tpu_world import OTHER_ZONE, PROJECT, STACK_LABELS, ZONE, expected_node, target

NODE = "dev-trainer"
SUBNET = "dev-tpu-{region}"


def candidate(zone: str) -> dict[str, object]:
    return {"zone": zone, "provisioning": "spot", "accelerator_type": "v2-8",
            "runtime_version": "tpu-vm-tf-2.18.0-pjrt", "spot": True, "generation": "v2",
            "chips": 4, "quota_type": "preemptible",
            "subnet_name": SUBNET.format(region=zone.rsplit("-", 1)[0])}


FALLBACK_NODE = replace(expected_node(NODE, spot=True), queued=True, max_wait_seconds=1800,
                        candidates=(candidate(ZONE), candidate(OTHER_ZONE)))
DEV = target(FALLBACK_NODE)


def queue_request(zone: str, node_id: str = NODE) -> None:
    """The node's request at `zone`, as the provider sends it (metadata and all)."""
    shared = {"project": PROJECT, "node_id": node_id,
              "network": f"projects/{PROJECT}/global/networks/dev-tpu",
              "service_account_email": "tpu-runtime@acme-ml-dev.iam.gserviceaccount.com",
              "metadata": {"tpu-stack-node": NODE}, "labels": {"stack": "dev"}}
    region = zone.rsplit("-", 1)[0]
    place = {**candidate(zone), "subnetwork": f"projects/{PROJECT}/regions/{region}/"
             f"subnetworks/{SUBNET.format(region=region)}"}
    enqueue(tpu_client(), merged(shared, place), timeout=5)


@pytest.fixture
def tpuctl(fake_tpu: FakeTpuApi, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(tpu_cmds, "load_target", lambda _stack: DEV)

    def run(*args: str) -> str:
        out = StringIO()
        monkeypatch.setattr(tpu_cmds, "console", Console(file=out, width=250, color_system=None))
        result = CliRunner().invoke(app, list(args))
        if result.exception and not isinstance(result.exception, SystemExit):
            raise result.exception
        assert result.exit_code == 0, out.getvalue() + result.stderr
        return out.getvalue()

    return run


def test_recover_apply_moves_a_request_failed_for_capacity_to_the_next_candidate(
        tpuctl, fake_tpu: FakeTpuApi) -> None:
    fake_tpu.script_queued(NODE, "FAILED", zone=ZONE,
                           error=(8, CAPACITY_MESSAGE.format(zone=ZONE)))
    queue_request(ZONE)

    dry = tpuctl("recover", "--stack", "dev")
    assert "move-queued" in dry and f"move to candidate 2/2 {OTHER_ZONE} spot" in dry
    assert "capacity" in dry
    assert fake_tpu.queued_resource(OTHER_ZONE, NODE) is None

    tpuctl("recover", "--stack", "dev", "--apply")

    assert fake_tpu.queued_resource(ZONE, NODE) is None
    moved = fake_tpu.queued_resource(OTHER_ZONE, f"{NODE}-c2")  # candidate 2's own name
    node = moved.tpu.node_spec[0].node
    assert moved.tpu.node_spec[0].parent == f"projects/{PROJECT}/locations/{OTHER_ZONE}"
    assert node.metadata["tpu-stack-node"] == NODE
    assert node.network_config.subnetwork.endswith("/regions/europe-west4/subnetworks/"
                                                   "dev-tpu-europe-west4")
    assert "spot" in moved


def test_the_janitors_dry_run_lists_a_failed_request_with_the_chips_it_frees(
        tpuctl, fake_tpu: FakeTpuApi, monkeypatch: pytest.MonkeyPatch) -> None:
    # The janitor shows the controller's limits steps (ops/controller/views.py): a plain
    # queued node's FAILED request is freed; a fallback node's is placement's (it moves,
    # `tpuctl recover`), so the janitor leaves it, as the controller does (issue 43).
    plain = replace(expected_node("dev-plain"), queued=True)
    monkeypatch.setattr(tpu_cmds, "load_target", lambda _stack: target(FALLBACK_NODE, plain))
    for node_id in (NODE, "dev-plain"):
        fake_tpu.script_queued(node_id, "FAILED", zone=ZONE,
                               error=(9, "Insufficient reserved capacity."))
        queue_request(ZONE, node_id)
    chips = catalog.parse_accelerator_type("v2-8").chips

    out = tpuctl("janitor", "--stack", "dev")

    assert "delete-queued" in out and f"FAILED: frees {chips} chips of v2-8" in out
    assert f"would free {chips} chips of quota" in out
    assert fake_tpu.queued_resource(ZONE, "dev-plain") is not None  # a dry run
    assert "other step(s) (move-queued)" in out

    tpuctl("janitor", "--stack", "dev", "--apply")
    assert fake_tpu.queued_resource(ZONE, "dev-plain") is None
    assert fake_tpu.queued_resource(ZONE, NODE) is not None


NOW = datetime(2026, 12, 4, 12, 0, tzinfo=timezone.utc)


def status(zone: str, state: str, **fields: object) -> QueuedStatus:
    return QueuedStatus(zone=zone, name=f"projects/{PROJECT}/locations/{zone}/queuedResources/"
                        f"{NODE}", state=state, node_ids=(NODE,), accelerator_type="v2-8",
                        chips=4, **fields)  # type: ignore[arg-type]


def test_a_request_waiting_longer_than_max_wait_moves_on_and_a_permanent_failure_stays() -> None:
    waited = status(ZONE, "WAITING_FOR_RESOURCES", created=NOW - timedelta(minutes=31))
    fresh = status(ZONE, "WAITING_FOR_RESOURCES", created=NOW - timedelta(minutes=5))
    denied = status(OTHER_ZONE, "FAILED", error_code=7, error_message="Permission denied")

    [moved] = fallback_recovery_plan([FALLBACK_NODE], [], [waited], NOW)
    [reported] = fallback_recovery_plan([FALLBACK_NODE], [], [denied], NOW)

    assert (moved.verb, moved.to["zone"]) == ("move-queued", OTHER_ZONE)
    assert "longer than maxWait (30 min)" in moved.reason
    assert fallback_recovery_plan([FALLBACK_NODE], [], [fresh], NOW) == []
    assert reported.verb == "report" and "permanent" in reported.reason


def test_after_a_preemption_the_node_starts_again_from_its_first_candidate(
        fake_tpu: FakeTpuApi) -> None:
    from ops.tpu.api import TpuApi

    fake_tpu.add_queued_node(OTHER_ZONE, NODE, "PREEMPTED", labels=STACK_LABELS, spot=True)
    api = TpuApi(deadline=10.0)
    nodes = api.stack_nodes([(PROJECT, OTHER_ZONE)], "dev")
    queued = api.stack_queued([(PROJECT, OTHER_ZONE)], [NODE])

    [action] = fallback_recovery_plan([FALLBACK_NODE], nodes, queued, NOW)

    assert (action.verb, action.to["zone"]) == ("move-queued", ZONE)
    assert "start again from the first candidate" in action.reason


def test_the_janitor_deletes_requests_past_valid_until_but_not_waiting_ones() -> None:
    expired = status(ZONE, "WAITING_FOR_RESOURCES", valid_until=NOW - timedelta(minutes=1))
    waiting = status(ZONE, "WAITING_FOR_RESOURCES", valid_until=NOW + timedelta(hours=1))
    suspended = status(OTHER_ZONE, "SUSPENDED")

    actions = queued_janitor_plan([expired, waiting, suspended], NOW)

    assert [(a.verb, a.zone, a.chips) for a in actions] == [
        ("delete-queued", ZONE, 4), ("delete-queued", OTHER_ZONE, 4)]
    assert "past validUntil" in actions[0].reason


def test_status_says_which_candidate_the_node_is_on_and_when_the_next_is_tried() -> None:
    from ops.tpu.status import candidate_lines

    waiting = status(OTHER_ZONE, "WAITING_FOR_RESOURCES", created=NOW - timedelta(minutes=12))
    failed = status(ZONE, "FAILED", error_code=8,
                    error_message=CAPACITY_MESSAGE.format(zone=ZONE))

    [line] = candidate_lines(DEV, [waiting], NOW.timestamp())
    [failed_line] = candidate_lines(DEV, [failed], NOW.timestamp())

    assert line == (f"trainer: candidate 2/2 {OTHER_ZONE} spot; request WAITING_FOR_RESOURCES "
                    f"for 12 min; next candidate in 18 min")
    assert failed_line == (f"trainer: candidate 1/2 {ZONE} spot; request FAILED; "
                           f"last failure: capacity")


def test_status_prints_the_candidate_line(tpuctl, fake_tpu: FakeTpuApi) -> None:
    queue_request(OTHER_ZONE)

    out = tpuctl("status", "--stack", "dev")

    assert f"trainer: candidate 2/2 {OTHER_ZONE} spot; request WAITING_FOR_RESOURCES" in out


def test_wait_that_times_out_shows_the_candidate_line(
        tpuctl, fake_tpu: FakeTpuApi, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tpu.script_queued(NODE, "WAITING_FOR_RESOURCES", zone=OTHER_ZONE)
    queue_request(OTHER_ZONE)
    shown = StringIO()
    monkeypatch.setattr(tpu_cmds, "console", Console(file=shown, width=250, color_system=None))

    result = CliRunner().invoke(app, ["wait", "--stack", "dev", "--until", "ready",
                                      "--timeout", "1s", "--poll", "1s"])

    assert result.exit_code != 0
    out = shown.getvalue()
    assert f"trainer: candidate 2/2 {OTHER_ZONE} spot; request WAITING_FOR_RESOURCES" in out


def test_wait_shows_the_candidate_line_while_it_waits(fake_tpu: FakeTpuApi) -> None:
    from ops.tpu.api import TpuApi
    from ops.tpu.status import wait_until

    fake_tpu.script_queued(NODE, "WAITING_FOR_RESOURCES", zone=OTHER_ZONE)
    queue_request(OTHER_ZONE)
    polls: list[list[str]] = []
    ticks = iter(range(100))

    outcome = wait_until(TpuApi(deadline=10.0), DEV, "ready", timeout=2, poll=0,
                         clock=lambda: float(next(ticks)), on_candidates=polls.append)

    assert not outcome.reached
    assert len(polls) == 2  # every poll (at 1 s and 2 s), before the outcome
    assert all(p == [f"trainer: candidate 2/2 {OTHER_ZONE} spot; request "
                     f"WAITING_FOR_RESOURCES for 0 min; next candidate in 30 min"]
               for p in polls)


def test_wait_prints_the_candidate_line_before_it_gives_up(
        tpuctl, fake_tpu: FakeTpuApi, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tpu.script_queued(NODE, "WAITING_FOR_RESOURCES", zone=OTHER_ZONE)
    queue_request(OTHER_ZONE)
    shown = StringIO()
    monkeypatch.setattr(tpu_cmds, "console", Console(file=shown, width=250, color_system=None))

    CliRunner().invoke(app, ["wait", "--stack", "dev", "--until", "ready",
                             "--timeout", "2s", "--poll", "1s"])

    out = shown.getvalue()
    line = f"trainer: candidate 2/2 {OTHER_ZONE} spot; request WAITING_FOR_RESOURCES"
    # Once while waiting (a line only when it changes: not once per poll), once in the
    # final table's lines.
    assert out.count(line) == 2
    assert out.index(line) < out.index("not ready after")
