"""The tpuctl verbs end to end: typer + the dev stack's config + the fake TPU API."""

from __future__ import annotations

import json
from dataclasses import dataclass
from io import StringIO

import pytest
from rich.console import Console
from typer.testing import CliRunner

from ops.cli import app
from ops.commands import tpu as tpu_cmds
from ops.local.storage_emulator import StorageEmulator
from ops.tpu import rehearsal_record
from ops.tpu import status as node_status
from tests.fakes.tpu_api import FakeTpuApi
from tests.ops.tpu_world import STACK_LABELS, ZONE, expected_node, target

# The stack "dev" as these tests define it (the repo's Pulumi.dev.yaml may change):
# one v2-8 spot node `trainer` in us-central1-b, node id dev-trainer.
NODE = "dev-trainer"
DEV = target(expected_node(NODE, spot=True))
STATUS_PREFIX = "gs://acme-ml-dev-logs/status/dev-trainer/"


@dataclass
class Run:
    code: int
    out: str
    err: str


@pytest.fixture
def tpuctl(fake_tpu: FakeTpuApi, monkeypatch: pytest.MonkeyPatch):
    real_loader = tpu_cmds.load_target
    monkeypatch.setattr(tpu_cmds, "load_target", lambda s: DEV if s == "dev" else real_loader(s))

    def run(*args: str) -> Run:
        out = StringIO()
        monkeypatch.setattr(tpu_cmds, "console", Console(file=out, width=200, color_system=None))
        result = CliRunner().invoke(app, list(args))
        if result.exception and not isinstance(result.exception, SystemExit):
            raise result.exception
        return Run(result.exit_code, out.getvalue(), result.stderr)

    return run


def add_trainer(fake: FakeTpuApi, *states: str) -> None:
    fake.add_node(
        ZONE,
        NODE,
        *states,
        labels={**STACK_LABELS, "node": "trainer"},
        spot=True,
        metadata={"tpu-stack-status": STATUS_PREFIX},
    )


def test_status_lists_the_stack_without_changing_anything(tpuctl, fake_tpu: FakeTpuApi) -> None:
    add_trainer(fake_tpu)
    fake_tpu.set_guest_attributes(ZONE, NODE, 0, {"state": "running", "step": "42"})

    run = tpuctl("status", "--stack", "dev")

    assert run.code == 0, run.err
    row = next(line for line in run.out.splitlines() if NODE in line)
    assert "READY" in row and "running" in row and "42" in row
    assert fake_tpu.mutating_calls() == []


def test_preflight_live_and_offline(tpuctl, fake_tpu: FakeTpuApi) -> None:
    live = tpuctl("preflight", "--stack", "dev")
    assert live.code == 0, live.out
    assert "zone offers v2-8" in live.out and "not checked" in live.out

    fake_tpu.calls.clear()
    offline = tpuctl("preflight", "--stack", "dev", "--offline")
    assert offline.code == 0
    assert "offline: checked against the catalog only" in offline.out
    assert fake_tpu.calls == []


def test_preflight_live_refuses_to_fall_back_to_the_catalog(
    tpuctl, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """The deploy workflow runs `preflight --live`: no credentials must stop it, not pass."""
    assert tpuctl("preflight", "--stack", "dev", "--live").code == 0
    monkeypatch.delenv("TPU_STACK_TPU_ENDPOINT", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "absent.json"))
    assert tpuctl("preflight", "--stack", "dev", "--offline").code == 0  # the catalog only
    run = tpuctl("preflight", "--stack", "dev", "--live")
    assert run.code == 2
    assert "the zone's offers were not checked" in run.err


def test_preflight_without_credentials_is_an_error_and_still_shows_quota_rows(
    tpuctl, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.delenv("TPU_STACK_TPU_ENDPOINT", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "absent.json"))
    run = tpuctl("preflight", "--stack", "dev")
    assert run.code == 2  # as every other verb that cannot reach the TPU API
    (error,) = run.err.splitlines()
    assert error.startswith("tpuctl: error: no usable Google credentials: "
                            f"GOOGLE_APPLICATION_CREDENTIALS names {tmp_path / 'absent.json'}, "
                            "which does not exist")
    assert error.endswith("offers were not checked (--offline checks the catalog only)")
    (quota,) = [line for line in run.out.splitlines() if "quota for" in line]
    assert "v2 spot in us-central1" in quota and "not checked" in quota


def test_wait_until_ready(tpuctl, fake_tpu: FakeTpuApi) -> None:
    add_trainer(fake_tpu, "CREATING", "READY")

    run = tpuctl("wait", "--stack", "dev", "--until", "ready", "--timeout", "10s", "--poll", "0")

    assert run.code == 0, run.out + run.err
    assert "ready after" in run.out
    assert fake_tpu.mutating_calls() == []


def test_recover_is_a_dry_run_unless_applied(tpuctl, fake_tpu: FakeTpuApi) -> None:
    add_trainer(fake_tpu, "PREEMPTED")

    dry = tpuctl("recover", "--stack", "dev")
    assert dry.code == 0
    assert "delete-node" in dry.out and "dry run: nothing changed" in dry.out
    assert fake_tpu.mutating_calls() == []

    applied = tpuctl("recover", "--stack", "dev", "--apply")
    assert applied.code == 0
    assert f"done: delete-node {NODE}" in applied.out and "pulumi up --refresh" in applied.out
    assert fake_tpu.node(ZONE, NODE) is None


def test_janitor_dry_run_changes_nothing(tpuctl, fake_tpu: FakeTpuApi) -> None:
    add_trainer(fake_tpu)
    fake_tpu.set_guest_attributes(ZONE, NODE, 0, {"state": "succeeded"})

    run = tpuctl("janitor", "--stack", "dev", "--idle-minutes", "30")

    assert run.code == 0
    assert "stop-node" in run.out and "job succeeded" in run.out
    assert fake_tpu.mutating_calls() == []


def test_permission_denied_is_one_line_naming_the_permission(tpuctl, fake_tpu: FakeTpuApi) -> None:
    fake_tpu.fail(403, action="list", message="The caller does not have permission")

    run = tpuctl("status", "--stack", "dev")

    assert run.code == 2
    assert run.err.strip().splitlines() == [
        "tpuctl: error: permission denied: list_nodes on us-central1-b in project acme-ml-dev "
        "needs IAM "
        "permission tpu.nodes.list (e.g. roles/tpu.viewer or roles/tpu.admin)"
    ]


def test_bad_input_is_one_clear_message(tpuctl) -> None:
    unknown = tpuctl("status", "--stack", "nosuch")
    assert unknown.code == 2 and "no stack file Pulumi.nosuch.yaml" in unknown.err

    bad_until = tpuctl("wait", "--stack", "dev", "--until", "forever")
    assert bad_until.code == 2


def test_logs_prints_the_workers_job_log(tpuctl, fake_tpu: FakeTpuApi, monkeypatch) -> None:
    add_trainer(fake_tpu)
    with StorageEmulator() as gcs:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.host)
        gcs.create_bucket("acme-ml-dev-logs")
        gcs.upload(f"{STATUS_PREFIX}worker-0/job.log", b"step 10 loss 2.3\n")
        gcs.upload(
            f"{STATUS_PREFIX}worker-0/status.json", json.dumps({"state": "succeeded"}).encode()
        )

        once = tpuctl("logs", "--stack", "dev", "--node", "trainer")
        followed = tpuctl("logs", "--stack", "dev", "--follow", "--poll", "0")
        missing = tpuctl("logs", "--stack", "dev", "--worker", "3")

    assert (once.code, once.out) == (0, "step 10 loss 2.3\n")
    assert fake_tpu.mutating_calls() == []
    assert followed.out == "step 10 loss 2.3\njob succeeded\n"
    assert missing.code == 2 and "no log yet at" in missing.err


def test_status_watch_refreshes_until_interrupted(
    tpuctl, fake_tpu: FakeTpuApi, monkeypatch
) -> None:
    add_trainer(fake_tpu, "CREATING", "READY")
    naps: list[float] = []

    def nap(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(tpu_cmds.time, "sleep", nap)
    run = tpuctl("status", "--stack", "dev", "--watch", "--interval", "1m")

    assert run.code == 0
    assert naps == [60.0, 60.0] and fake_tpu.count("list") == 2
    assert "READY" in run.out


def test_wait_for_done_fails_fast_on_a_failed_job(tpuctl, fake_tpu: FakeTpuApi) -> None:
    add_trainer(fake_tpu)
    fake_tpu.set_guest_attributes(ZONE, NODE, 0, {"state": "failed", "message": "exit 1"})

    run = tpuctl("wait", "--stack", "dev", "--until", "done", "--timeout", "1h", "--poll", "0")

    assert run.code == 1
    assert f"{NODE}: job failed: exit 1" in run.out


def rehearse_here(root, node: str = NODE, folder: str = "node-trainer") -> None:
    """What `tpuctl rehearse --stack dev` leaves for a node: the emulator's status objects,
    and the record of what was rehearsed (ops/tpu/rehearsal_record.py)."""
    status = root / "dev" / folder / "status-objects" / "worker-0" / "status.json"
    status.parent.mkdir(parents=True)
    fields = {"node": node, "state": "succeeded", "step": "40", "worker": 0,
              "goodput": {"percent": 91.5, "productive": 915, "total": 1000}}
    status.write_text(json.dumps(fields))
    (status.parent / "job.log").write_text("tpu_training step=40 loss=0.5\n")
    rehearsal_record.write_record(root / "dev" / folder, "dev", folder, "gs://p", "gs://r")


def test_status_offline_shows_the_last_rehearsal_without_a_call(
    tpuctl, fake_tpu: FakeTpuApi, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.setattr(node_status, "REHEARSAL_ROOT", tmp_path)
    rehearse_here(tmp_path)

    run = tpuctl("status", "--stack", "dev", "--offline")

    assert run.code == 0, run.err
    row = next(line for line in run.out.splitlines() if NODE in line)
    assert "REHEARSED" in row and "succeeded" in row and "40" in row and "91.5%" in row
    assert f"stack dev (rehearsal, offline: {tmp_path / 'dev'})" in run.out
    assert fake_tpu.calls == []


def test_status_without_credentials_shows_the_rehearsal_and_exits_2_as_every_verb(
    tpuctl, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.delenv("TPU_STACK_TPU_ENDPOINT", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "absent.json"))
    monkeypatch.setattr(node_status, "REHEARSAL_ROOT", tmp_path)

    never = tpuctl("status", "--stack", "dev")
    assert never.code == 2
    assert never.err.strip().endswith(
        "(or `tpuctl rehearse --stack dev` first, then `tpuctl status --offline`)")

    rehearse_here(tmp_path)
    run = tpuctl("status", "--stack", "dev")
    assert run.code == 2  # as every verb without credentials; the rehearsal is still shown
    (error,) = run.err.splitlines()
    assert error.startswith("tpuctl: error: no usable Google credentials: ")
    assert error.endswith("showed the last rehearsal (offline) instead: `tpuctl status --stack "
                          "dev --offline` shows it without this error")
    assert "REHEARSED" in next(line for line in run.out.splitlines() if NODE in line)


def test_status_offline_without_a_rehearsal_says_what_to_run(
    tpuctl, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.setattr(node_status, "REHEARSAL_ROOT", tmp_path)

    run = tpuctl("status", "--stack", "dev", "--offline")

    assert run.code == 2
    assert "stack dev has no rehearsal here" in run.err
    assert "run `tpuctl rehearse --stack dev`" in run.err


# ---- issue 29: each node's rehearsal kept and marked when stale; logs --offline; wait ----


def test_status_offline_marks_a_rehearsal_whose_stack_file_or_training_changed_since(
    tpuctl, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.setattr(node_status, "REHEARSAL_ROOT", tmp_path)
    rehearse_here(tmp_path)
    fresh = tpuctl("status", "--stack", "dev", "--offline")
    record = tmp_path / "dev" / "node-trainer" / rehearsal_record.RECORD
    then = json.loads(record.read_text())
    then["digests"]["Pulumi.dev.yaml"] = "0" * 64  # the stack file was edited since
    then["digests"]["training/"] = "1" * 64  # and the job's code
    record.write_text(json.dumps(then))
    stale = tpuctl("status", "--stack", "dev", "--offline")

    row = next(line for line in fresh.out.splitlines() if NODE in line)
    assert "REHEARSED " in row and "stale" not in row
    row = next(line for line in stale.out.splitlines() if NODE in line)
    assert "REHEARSED (stale)" in row
    assert "changed since: Pulumi.dev.yaml, training/; rehearse again" in row


def test_every_rehearsed_node_is_kept_and_shown(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path) -> None:
    two = target(expected_node("dev-trainer", spot=True), expected_node("dev-second"))
    rehearse_here(tmp_path, "dev-trainer", "node-trainer")
    rehearse_here(tmp_path, "dev-second", "node-second")

    nodes = node_status.rehearsed(two, tmp_path)

    assert [(n.node_id, n.state) for n in nodes] == [("dev-second", "REHEARSED"),
                                                     ("dev-trainer", "REHEARSED")]


def test_logs_offline_prints_the_rehearsals_job_log_without_a_call(
    tpuctl, fake_tpu: FakeTpuApi, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.setattr(node_status, "REHEARSAL_ROOT", tmp_path)
    never = tpuctl("logs", "--stack", "dev", "--offline")
    rehearse_here(tmp_path)

    run = tpuctl("logs", "--stack", "dev", "--offline", "--node", "trainer")
    other = tpuctl("logs", "--stack", "dev", "--offline", "--worker", "1")
    unknown = tpuctl("logs", "--stack", "dev", "--offline", "--node", "pod")

    assert never.code == 2 and "stack dev has no rehearsal here" in never.err
    assert (run.code, run.out) == (0, "tpu_training step=40 loss=0.5\n")
    assert other.code == 2 and "the rehearsal left no job.log for worker 1" in other.err
    assert unknown.code == 2 and "--node pod: not rehearsed here (rehearsed: dev-trainer)" in (
        unknown.err)
    assert fake_tpu.calls == []


def test_wait_without_credentials_prints_only_its_error_line(
    tpuctl, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.delenv("TPU_STACK_TPU_ENDPOINT", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "absent.json"))

    run = tpuctl("wait", "--stack", "dev")

    assert run.code == 2
    assert run.out == ""
    assert len(run.err.splitlines()) == 1


def test_status_team_shows_the_teams_spend_burn_and_budget(
        tpuctl, fake_tpu: FakeTpuApi, monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace
    from datetime import datetime, timedelta, timezone

    from model import catalog, meter

    nlp = replace(expected_node(NODE, spot=True), team="nlp")
    stack = replace(target(nlp), budgets={"nlp": 1000.0})
    monkeypatch.setattr(tpu_cmds, "load_target", lambda _stack: stack)
    created = datetime.now(timezone.utc) - timedelta(hours=2)
    fake_tpu.add_node(ZONE, NODE, labels={**STACK_LABELS, "team": "nlp"}, spot=True,
                      accelerator_type="v5litepod-8", created=created)

    run = tpuctl("status", "--stack", "dev", "--team", "nlp")

    assert run.code == 0, run.err
    line = next(line for line in run.out.splitlines() if line.startswith("team nlp spend: "))
    hourly = catalog.usd_per_hour(catalog.parse_accelerator_type("v5litepod-8"), spot=True)
    assert hourly is not None
    hours = min(2.0, (datetime.now(timezone.utc)
                      - meter.month_start(datetime.now(timezone.utc))).total_seconds() / 3600)
    spent = float(line.split("$", 1)[1].split(" ", 1)[0].replace(",", ""))
    assert spent == pytest.approx(hourly * hours, abs=0.05)
    assert f"burn ${hourly:,.2f}/h; budget $1,000 runs out in " in line
    assert fake_tpu.mutating_calls() == []
