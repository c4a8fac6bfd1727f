"""tpuctl at platform scale (issue 30): the (project, zone) pairs read side by side under
a per-project bound, every page of a list followed, and a pair that cannot be read shown
as one row while the rest still shows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import pytest

from model.fleet import StackTarget, TargetError
from ops.tpu import status, status_views
from ops.tpu.api import (
    REQUESTS_PER_PROJECT_ENV,
    NodeStatus,
    TpuApi,
    TpuApiError,
    interleaved,
    requests_per_project,
)
from tests.fakes.tpu_api import FakeTpuApi, GrpcFront, running
from tests.ops.tpu_world import expected_node

ZONES = ("us-central1-a", "us-south1-a", "us-west4-a")  # v5e zones (model/catalog.py)
TEAMS = ("nlp", "vision", "speech", "audio")
UNSERVED = "us-nowhere1-z"
LATENCY = 0.1  # long enough that requests sent together are in flight together


def project(team: str) -> str:
    return f"acme-ml-shared-{team}"


def labels(team: str) -> dict[str, str]:
    return {"stack": "platform", "managed-by": "pulumi", "team": team}


def node_id(team: str, zone: str) -> str:
    return f"platform-{team}-{zone.replace('-', '')}"


@pytest.fixture
def platform(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, FakeTpuApi]]:
    """Four team projects, each with one node in each of three zones."""
    offered = {zone: ["v5litepod-8"] for zone in ZONES}
    root = FakeTpuApi(project(TEAMS[0]), accelerator_types=offered,
                      runtime_versions={zone: ["tpu-vm-tf-2.18.0-pjrt"] for zone in ZONES})
    fakes = {TEAMS[0]: root} | {team: root.add_project(project(team)) for team in TEAMS[1:]}
    for team, fake in fakes.items():
        for zone in ZONES:
            fake.add_node(zone, node_id(team, zone), labels=labels(team),
                          accelerator_type="v5litepod-8")
    with running(root):
        monkeypatch.setenv("TPU_STACK_TPU_ENDPOINT", root.endpoint)
        yield fakes


def platform_target(teams: tuple[str, ...] = TEAMS, zones: tuple[str, ...] = ZONES,
                    **caps: dict[tuple[str, str], int]) -> StackTarget:
    nodes = tuple(
        replace(expected_node(node_id(team, zone), zone, "v5litepod-8", "tpu-vm-tf-2.18.0-pjrt"),
                project=project(team), team=team, capacity="spot")
        for team in teams for zone in zones)
    return StackTarget("acme-ml-shared", "platform", nodes, caps=caps)


# ---- concurrency and the per-project bound ----------------------------------------------


def test_pairs_are_read_side_by_side_within_the_per_project_bound(
    platform: dict[str, FakeTpuApi],
) -> None:
    root = platform[TEAMS[0]]
    root.latency = LATENCY
    target = platform_target()

    read = TpuApi(deadline=10.0, per_project=2).read_nodes(target.places, target.stack)

    assert read.unread == []
    assert sorted(n.node_id for n in read.items) == sorted(n.node_id for n in target.nodes)
    assert root.peak_in_flight >= 3, "12 pairs read one after another"
    assert set(root.peak_by_project) == {project(team) for team in TEAMS}
    assert max(root.peak_by_project.values()) <= 2, root.peak_by_project


def test_the_bound_holds_for_every_call_of_a_project_guest_attributes_too(
    platform: dict[str, FakeTpuApi],
) -> None:
    root = platform[TEAMS[0]]
    target = platform_target()
    api = TpuApi(deadline=10.0, per_project=1)
    nodes = api.stack_nodes(target.places, target.stack)
    root.latency = LATENCY
    root.reset_peaks()

    api.with_job_status(nodes, workers=8)

    assert root.peak_in_flight >= 2, "guest attributes of several projects at once"
    assert max(root.peak_by_project.values()) == 1, root.peak_by_project


def test_the_bound_is_a_setting_with_one_clear_message_when_wrong(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert requests_per_project({}) == 8
    assert requests_per_project({REQUESTS_PER_PROJECT_ENV: "3"}) == 3
    for bad in ("0", "-2", "many", "2.5", "²"):
        with pytest.raises(TpuApiError) as raised:
            requests_per_project({REQUESTS_PER_PROJECT_ENV: bad})
        assert str(raised.value).startswith(f"{REQUESTS_PER_PROJECT_ENV}={bad!r}: use a whole")
    monkeypatch.setenv(REQUESTS_PER_PROJECT_ENV, "5")
    assert TpuApi().per_project == 5


def test_reads_go_to_each_project_in_turn() -> None:
    places = [("b", "z1"), ("a", "z2"), ("a", "z1"), ("b", "z2"), ("a", "z3"), ("a", "z1")]

    assert interleaved(places) == [("a", "z1"), ("b", "z1"), ("a", "z2"), ("b", "z2"),
                                   ("a", "z3")]


# ---- pagination -------------------------------------------------------------------------


def test_every_page_of_a_list_is_followed(platform: dict[str, FakeTpuApi]) -> None:
    fake = platform[TEAMS[1]]
    zone = ZONES[0]
    for index in range(6):
        fake.add_node(zone, f"platform-vision-extra{index}", labels=labels("vision"))
    fake.page_size = 2
    target = platform_target(("vision",), (zone,))

    nodes = TpuApi(deadline=10.0).stack_nodes(target.places, target.stack)

    assert len(nodes) == 7
    assert fake.count("list") == 4, "7 nodes, 2 a page"


def test_the_fake_refuses_a_page_token_it_did_not_hand_out(
    platform: dict[str, FakeTpuApi],
) -> None:
    code, body = platform[TEAMS[0]].handle(
        "GET", f"/v2/projects/{project(TEAMS[0])}/locations/{ZONES[0]}/nodes?pageToken=zz", b"")

    assert code == 400 and "page token" in json.loads(body)["error"]["message"]


# ---- a pair that cannot be read ---------------------------------------------------------


def test_a_denied_project_and_an_unserved_zone_are_one_unread_each(
    platform: dict[str, FakeTpuApi],
) -> None:
    target = platform_target()
    stranger = replace(target.nodes[0], node_id="platform-other-a", project="acme-ml-other",
                       team="other")
    lost = replace(target.nodes[0], node_id="platform-nlp-x", zone=UNSERVED)
    target = replace(target, nodes=(*target.nodes, stranger, lost))

    read = TpuApi(deadline=10.0).read_nodes(target.places, target.stack)

    assert len(read.items) == 12, "every pair that could be read"
    assert [(u.project, u.zone, u.kind) for u in read.unread] == [
        ("acme-ml-other", ZONES[0], "denied"), (project("nlp"), UNSERVED, "no-zone")]
    assert "permission denied: list_nodes" in read.unread[0].error
    assert "unknown to the TPU API" in read.unread[1].error
    with pytest.raises(TpuApiError, match=r"permission denied.*\(and 1 more"):
        read.complete()


def test_a_pair_that_keeps_failing_is_unread_and_not_lasting(
    platform: dict[str, FakeTpuApi],
) -> None:
    platform["vision"].fail(503, times=1000, action="list", zone=ZONES[1])
    target = platform_target(("vision",))

    read = TpuApi(deadline=0.5).read_nodes(target.places, target.stack)

    assert sorted(n.zone for n in read.items) == [ZONES[0], ZONES[2]]
    (unread,) = read.unread
    assert (unread.zone, unread.kind, unread.lasting) == (ZONES[1], "failed", False)
    assert "kept failing" in unread.error


def test_an_answer_cut_short_is_an_unread_pair_not_a_traceback(
    platform: dict[str, FakeTpuApi],
) -> None:
    platform["vision"].fail(200, action="list", zone=ZONES[2], message='{"nodes": [{"na')
    target = platform_target(("vision",))

    read = TpuApi(deadline=10.0).read_nodes(target.places, target.stack)

    assert len(read.items) == 2
    (unread,) = read.unread
    assert unread.zone == ZONES[2] and unread.kind == "failed"
    assert unread.error.startswith(f"list_nodes on {ZONES[2]}: the TPU API's answer could not "
                                   "be read")


def test_status_shows_the_rest_and_one_row_for_the_unread_pair(
    platform: dict[str, FakeTpuApi],
) -> None:
    target = platform_target()
    lost = replace(target.nodes[0], node_id="platform-nlp-x", zone=UNSERVED)
    target = replace(target, nodes=(*target.nodes, lost))
    read = status.read_stack(TpuApi(deadline=10.0), target)

    text = render(status_views.status_table(target, read.items, unread=read.unread),
                  status_views.unread_table(target, read.unread))

    assert all(n.node_id in text for n in target.nodes[:-1])
    assert "platform-nlp-x" not in text, "no ABSENT row for a node of an unread pair"
    unread = text[text.index("could not read"):]
    assert unread.startswith("could not read 1 of 13 (project, zone) pairs")
    assert f"{project('nlp')} │ {UNSERVED} │ zone '{UNSERVED}' is unknown to the TPU API" \
        in unread


def test_wait_stops_on_a_lasting_unread_pair_and_waits_out_a_passing_one(
    platform: dict[str, FakeTpuApi],
) -> None:
    target = platform_target(("vision",))
    denied = replace(target, nodes=(*target.nodes,
                                    replace(target.nodes[0], project="acme-ml-other")))

    lasting = status.wait_until(TpuApi(deadline=10.0), denied, "ready", timeout=60, poll=0)

    assert not lasting.reached
    assert lasting.reason.startswith(f"acme-ml-other {ZONES[0]} cannot be read: permission")

    platform["vision"].fail(503, times=1000, action="list", zone=ZONES[1])
    ticks = iter(range(100))
    passing = status.wait_until(TpuApi(deadline=0.3), target, "ready", timeout=2, poll=1,
                                clock=lambda: float(next(ticks)), sleep=lambda _s: None)

    assert not passing.reached
    assert passing.reason == "not ready after 2 s; 1 (project, zone) unread"


# ---- teams ------------------------------------------------------------------------------


def test_a_team_summary_counts_states_chips_against_the_cap_and_goodput() -> None:
    target = platform_target(("vision",), vision={("v5e", "spot"): 16, ("v5e", "onDemand"): 8})
    ids = [n.node_id for n in target.nodes]
    goodput = {"productive": 900.0, "total": 1000.0, "percent": 90.0, "job": "j"}
    nodes = [
        status_of(ids[0], "READY", {"goodput": json.dumps(goodput)}),
        status_of(ids[1], "PREEMPTED",
                  {"goodput": json.dumps(goodput | {"productive": 500.0})}),
    ]

    (summary,) = status.team_summaries(target, nodes)

    assert summary.states == {"PREEMPTED": 1, "READY": 1}
    assert summary.absent == 1
    assert summary.chips == {("v5e", "spot"): 16}
    assert summary.goodput == pytest.approx(70.0)
    assert status_views.summary_line(summary).plain == (
        "team vision: 2 nodes (PREEMPTED 1, READY 1), 1 absent; chips 16 of cap 24 "
        "(v5e on-demand 0/8, v5e spot 16/16); goodput 70.0% over 2 nodes")


def test_a_team_over_its_cap_and_a_team_without_one_say_so() -> None:
    target = platform_target(("vision", "nlp"), (ZONES[0],), vision={("v5e", "spot"): 4})
    nodes = [status_of(n.node_id, "READY", {}) for n in target.nodes]

    lines = {s.team: status_views.summary_line(s) for s in status.team_summaries(target, nodes)}

    assert "chips 8 of cap 4 OVER CAP (v5e spot 8/4)" in lines["vision"].plain
    assert lines["vision"].style == "red"
    assert "chips 8 (no team cap in this stack)" in lines["nlp"].plain
    assert "goodput -" in lines["nlp"].plain


def test_for_team_keeps_the_teams_nodes_and_refuses_an_unknown_team() -> None:
    target = platform_target()

    vision = target.for_team("vision")

    assert {n.project for n in vision.nodes} == {project("vision")}
    assert len(vision.places) == 3
    with pytest.raises(TargetError, match=r"--team nope: not a team of stack platform "
                                          r"\(teams: audio, nlp, speech, vision\)"):
        target.for_team("nope")


def status_of(node: str, state: str, job: dict[str, str]) -> NodeStatus:
    return NodeStatus(ZONES[0], node, state, "HEALTHY", "v5litepod-8", "r", True,
                             {}, {}, "", job=job)


def render(*renderables: object) -> str:
    from io import StringIO

    from rich.console import Console

    out = StringIO()
    console = Console(file=out, width=250, color_system=None)
    for renderable in renderables:
        console.print(renderable)
    return out.getvalue()


def test_the_grpc_transport_reads_the_same_and_explains_the_same(
    platform: dict[str, FakeTpuApi],
) -> None:
    """TpuClient's default transport is gRPC: the fake answers it as it answers REST."""
    front = GrpcFront(platform[TEAMS[0]])
    try:
        platform["vision"].add_node(ZONES[0], "platform-vision-a2", labels=labels("vision"),
                                    accelerator_type="v5litepod-8")
        platform["vision"].page_size = 1
        target = platform_target()
        lost = replace(target.nodes[0], node_id="platform-other-a", project="acme-ml-other")
        target = replace(target, nodes=(*target.nodes, lost))
        api = TpuApi(client=front.client(), deadline=10.0)

        read = api.read_nodes(target.places, target.stack)
        nodes = api.with_job_status(read.items)
    finally:
        front.stop()

    assert len(nodes) == 13
    assert platform["vision"].count("list") == 4, "two pages in one of vision's zones"
    (unread,) = read.unread
    assert (unread.project, unread.kind) == ("acme-ml-other", "denied")
    assert unread.error.startswith("permission denied: list_nodes on us-central1-a in project "
                                   "acme-ml-other needs IAM permission tpu.nodes.list")


# ---- the verbs --------------------------------------------------------------------------


@pytest.fixture
def tpuctl(platform: dict[str, FakeTpuApi], monkeypatch: pytest.MonkeyPatch):
    """`tpuctl <verb> --stack platform` on platform_target() plus one node in a project the
    caller may not read, and vision capped at 16 v5e spot chips."""
    from io import StringIO

    from rich.console import Console
    from typer.testing import CliRunner

    from ops.cli import app
    from ops.commands import tpu as commands

    target = platform_target(vision={("v5e", "spot"): 16})
    denied = replace(target.nodes[0], node_id="platform-other-a", project="acme-ml-other",
                     team="other")
    stack = replace(target, nodes=(*target.nodes, denied))
    monkeypatch.setattr(commands, "load_target", lambda _stack: stack)

    def run(*args: str) -> tuple[int, str, str]:
        out = StringIO()
        monkeypatch.setattr(commands, "console", Console(file=out, width=300, color_system=None))
        result = CliRunner().invoke(app, list(args))
        if result.exception and not isinstance(result.exception, SystemExit):
            raise result.exception
        return result.exit_code, out.getvalue(), result.stderr

    return run


def test_status_of_a_partial_read_shows_the_rest_a_row_and_exits_3(tpuctl) -> None:
    code, out, err = tpuctl("status", "--stack", "platform")

    assert code == 3, err
    assert all(node_id(team, zone) in out for team in TEAMS for zone in ZONES)
    (row,) = [line for line in out.splitlines() if "acme-ml-other" in line and "│" in line]
    assert "permission denied: list_nodes on us-central1-a in project acme-ml-other" in row
    assert ("team vision: 3 nodes (READY 3); chips 24 of cap 16 OVER CAP (v5e spot 24/16); "
            "goodput -") in out
    assert "team other: 0 nodes; chips 0 (no team cap in this stack); goodput -; " \
           "1 (project, zone) unread" in out


def test_status_of_one_team_reads_only_its_project(
    tpuctl, platform: dict[str, FakeTpuApi],
) -> None:
    code, out, err = tpuctl("status", "--stack", "platform", "--team", "vision")

    assert code == 0, err
    assert {n for n in (node_id(t, z) for t in TEAMS for z in ZONES) if n in out} == {
        node_id("vision", zone) for zone in ZONES}
    team_lines = [line for line in out.splitlines() if line.startswith("team ")]
    assert [line for line in team_lines if " spend: " not in line
            and " dashboard: " not in line] == [
        "team vision: 3 nodes (READY 3); chips 24 of cap 16 OVER CAP (v5e spot 24/16); "
        "goodput -"]
    assert [line.split(": ", 1)[0] for line in team_lines if " dashboard: " in line] == [
        "team vision dashboard"]  # its link: tests/infra/test_dashboard_links.py
    assert [line.split(":")[0] for line in team_lines if " spend: " in line] == [
        "team vision spend"]  # its figures: tests/infra/test_meter.py
    assert all(platform[team].calls == [] for team in TEAMS if team != "vision")

    unknown = tpuctl("status", "--stack", "platform", "--team", "nope")
    assert unknown[0] == 2
    assert "--team nope: not a team of stack platform (teams: audio, nlp, other, speech, " \
           "vision)" in unknown[2]


def test_recover_and_janitor_act_on_the_rest_and_exit_3(
    tpuctl, platform: dict[str, FakeTpuApi],
) -> None:
    platform["speech"].set_node_states(ZONES[0], node_id("speech", ZONES[0]), "PREEMPTED")

    code, out, _err = tpuctl("recover", "--stack", "platform", "--apply")

    assert code == 3
    assert f"done: delete-node {node_id('speech', ZONES[0])}" in out
    assert platform["speech"].node(ZONES[0], node_id("speech", ZONES[0])) is None
    assert "could not read 1 of 13 (project, zone) pairs" in out

    code, out, _err = tpuctl("janitor", "--stack", "platform", "--idle-minutes", "0")
    assert code == 3 and "stop-node" in out and "acme-ml-other" in out


def test_preflight_shows_an_unread_pair_as_a_row_and_exits_3(tpuctl) -> None:
    code, out, _err = tpuctl("preflight", "--stack", "platform")

    assert code == 3
    (row,) = [line for line in out.splitlines() if "zone's offers" in line]
    assert f"{ZONES[0]} (acme-ml-other)" in row and "not checked" in row
    assert "permission denied: list_accelerator_types" in row
    assert "zone offers v5litepod-8" in out, "the other pairs were checked"
    assert tpuctl("preflight", "--stack", "platform", "--live")[0] == 1


def test_a_team_stack_takes_its_cap_from_the_platform_stack_file() -> None:
    from ops.tpu.target import load_target

    platform, vision = load_target("platform"), load_target("team-vision")

    assert {n.team for n in vision.nodes} == {"vision"}
    assert {n.capacity for n in vision.nodes} <= {"onDemand", "spot", "reserved"}
    assert vision.caps == {"vision": platform.caps["vision"]} and platform.caps["vision"]
    assert {n.team for n in platform.nodes} <= set(platform.caps), "every team has a cap"


def test_each_teams_logs_bucket_is_listed_beside_the_others() -> None:
    """A team's agents publish to the team's bucket: one listing each, side by side."""
    import threading
    import time

    from node_agent.contract import STATUS_KEY
    from ops.tpu.logs import published_jobs

    class Listings:
        def __init__(self) -> None:
            self.lock, self.now, self.peak = threading.Lock(), 0, 0

        def published(self, bucket: str, parent: str) -> dict[str, dict[str, str]]:
            with self.lock:
                self.now += 1
                self.peak = max(self.peak, self.now)
            time.sleep(LATENCY)
            with self.lock:
                self.now -= 1
            return {f"{parent}{bucket}-node/": {"state": "running"}}

    nodes = [replace(status_of(f"{team}-node", "READY", {}),
                     metadata={STATUS_KEY: f"gs://{team}/status/{team}-node/"})
             for team in TEAMS]
    listings = Listings()

    jobs = published_jobs(listings, nodes)  # type: ignore[arg-type]

    assert jobs == {(ZONES[0], f"{team}-node"): {"state": "running"} for team in TEAMS}
    assert listings.peak >= 2, "four buckets listed one after another"


def test_a_bad_bound_setting_is_one_line_and_exit_2(
    tpuctl, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(REQUESTS_PER_PROJECT_ENV, "lots")

    code, _out, err = tpuctl("status", "--stack", "platform")

    assert code == 2
    assert err.strip().splitlines() == [
        f"tpuctl: error: {REQUESTS_PER_PROJECT_ENV}='lots': use a whole number of requests "
        "in flight per project, 1 or more (default 8)"]
