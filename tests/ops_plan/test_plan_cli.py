"""`tpuctl plan --format` / `--against` through the CLI, on the dev stack."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from components.stack_config import StackFileError, file_config
from model.archive import REPO_ROOT, PackageError
from ops.cli import app
from ops.terminal import CALLER_DIR_ENV

runner = CliRunner()


def test_save_then_diff_against_the_saved_plan(tmp_path):
    saved = runner.invoke(app, ["plan", "--stack", "dev", "--format", "json"])
    assert saved.exit_code == 0, saved.output
    plan = json.loads(saved.stdout)
    assert plan["violations"] == [] and plan["cost"]["hoursPerMonth"] == 730
    base = tmp_path / "base.json"
    base.write_text(saved.stdout)
    diff = runner.invoke(app, ["plan", "--stack", "dev", "--against", str(base)])
    assert diff.exit_code == 0, diff.output
    assert diff.stdout.startswith("## tpu-stack plan diff: dev")
    assert "Resources:\n    " in diff.stdout and " to " not in diff.stdout.split("Resources:")[1]


def _error(args: list[str]) -> str:
    """The one error of a refused command: on stderr, nothing on stdout."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    return result.stderr


def test_bad_format_and_bad_base_are_one_clear_error(tmp_path):
    assert _error(["plan", "--stack", "dev", "--format", "html"]) == (
        "tpuctl: error: --format 'html' is not a format; allowed: markdown, table, json\n")
    missing = tmp_path / "x"
    assert _error(["plan", "--stack", "dev", "--against", str(missing)]).startswith(
        f"tpuctl: error: --against {missing}: cannot read a plan")


def test_a_yaml_error_reaches_stderr_verbatim_caret_and_brackets_included(tmp_path, monkeypatch):
    import ops.plan.offline

    (tmp_path / "Pulumi.yaml").write_text((REPO_ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.broken.yaml").write_text("config:\n  tpu-stack:nodes: [a, b\n")
    monkeypatch.setattr(ops.plan.offline, "file_config",
                        lambda stack: file_config(stack, tmp_path))
    with pytest.raises(StackFileError) as expected:
        file_config("broken", tmp_path)
    assert "^" in str(expected.value)
    assert _error(["plan", "--stack", "broken", "--format", "json"]) == (
        f"tpuctl: error: {expected.value}\n")


def test_a_team_stack_the_platform_rejects_is_one_message_and_exit_2():
    """In a process of its own: the "Future exception was never retrieved" logs of a failed
    program came when its futures were freed, at the latest at exit."""
    program = ("import sys, components.stack_config as c, ops.plan.offline as o\n"
               "config = c.file_config('team-vision')\n"
               "config['tpu-stack:team'] = 'visoin'\n"
               "o.file_config = lambda stack: config\n"
               "from ops.cli import main\n"
               "main()\n")
    result = subprocess.run([sys.executable, "-c", program, "plan", "--stack", "team-vision"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                            check=False)
    assert (result.returncode, result.stdout) == (2, "")
    # Offline the platform's stack file is at hand: its teams are listed (issue 45; the
    # program, reading only the team's own outputs object, cannot).
    assert result.stderr.splitlines() == [
        "tpuctl: error: the stack config has 1 problem:",
        "  tpu-stack:team: 'visoin' is not a team of acme/tpu-stack/platform (its "
        "tpu-stack:teams: nlp, vision); did you mean vision?"]


@pytest.mark.parametrize(("error", "message"), [
    (PackageError("training/wheels.lock: could not fetch tf-keras~=2.18.0"),
     "training/wheels.lock: could not fetch tf-keras~=2.18.0"),
    (KeyError("tpu-stack:storage"), "the Pulumi program failed: KeyError: 'tpu-stack:storage'"),
])
def test_any_error_of_the_program_is_one_message(monkeypatch, error, message):
    import ops.plan.offline

    def broken(config, stack, **_):
        raise error

    monkeypatch.setattr(ops.plan.offline, "run_program", broken)
    assert _error(["plan", "--stack", "dev"]) == f"tpuctl: error: {message}\n"
    assert _error(["rehearse", "--stack", "dev"]) == f"tpuctl: error: {message}\n"


def test_relative_paths_are_the_callers(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)  # as the tpuctl wrapper runs
    name = f"{tmp_path.name}.json"
    result = runner.invoke(app, ["plan", "--stack", "dev", "--out", name],
                           env={CALLER_DIR_ENV: str(tmp_path)})
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / name).read_text())["stack"] == "dev"
    assert not (REPO_ROOT / name).exists()
    assert result.stderr == f"plan written to {tmp_path / name}\n"


def test_a_base_of_another_stack_is_diffed_with_a_warning(tmp_path):
    saved = runner.invoke(app, ["plan", "--stack", "dev", "--format", "json"])
    (tmp_path / "dev.json").write_text(saved.stdout)
    diff = runner.invoke(app, ["plan", "--stack", "prod", "--against", str(tmp_path / "dev.json")])
    assert diff.stdout.startswith("## tpu-stack plan diff: prod")
    assert diff.stderr == (f"tpuctl: warning: --against {tmp_path}/dev.json is a plan of stack "
                           "'dev', this one of 'prod': the diff compares two stacks\n")


def test_usage_lines_name_tpuctl():
    result = subprocess.run([str(REPO_ROOT / "tpuctl"), "plan", "--bogus"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "Usage: tpuctl plan [OPTIONS]" in result.stderr.splitlines()
    assert "ops.cli" not in result.stderr


def test_the_wrapper_resolves_paths_against_the_callers_directory(tmp_path):
    result = subprocess.run([str(REPO_ROOT / "tpuctl"), "plan", "--stack", "dev", "--out",
                             "plan.json"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "plan.json").read_text())["stack"] == "dev"


def _plan_json(seed: str, *extra: str) -> bytes:
    """`tpuctl plan --stack platform --format json` in a fresh interpreter (its own hash
    seed: set order differs between processes)."""
    env = {**__import__("os").environ, "PYTHONHASHSEED": seed}
    done = subprocess.run([sys.executable, "-m", "ops.cli", "plan", "--stack", "platform",
                           "--format", "json", *extra], cwd=REPO_ROOT, env=env,
                          capture_output=True, check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return done.stdout


def test_two_plans_of_a_stack_are_the_same_bytes_and_out_writes_that_document(tmp_path):
    """The plan the PR check saves and diffs: the same bytes for the same input (the
    registration order of dependencies does not leak), and `--out` writes exactly what
    `--format json` prints."""
    out = tmp_path / "plan.json"
    first = _plan_json("1", "--out", str(out))
    assert first == _plan_json("2")
    assert out.read_bytes() == first
    assert json.loads(first)["violations"] == []


def test_a_refused_step_fails_the_pr_check_with_the_way_out(tmp_path):
    """A base that held a protected resource the head no longer declares: `pulumi up`
    would refuse the delete, so `plan --against` (the PR check) exits 1 and says why
    and how to do it."""
    saved = runner.invoke(app, ["plan", "--stack", "dev", "--format", "json"])
    base = json.loads(saved.stdout)
    extra = {**base["resources"][0], "urn": base["resources"][0]["urn"] + "-old",
             "name": "old", "protect": True}
    base["resources"].append(extra)
    path = tmp_path / "base.json"
    path.write_text(json.dumps(base))
    diff = runner.invoke(app, ["plan", "--stack", "dev", "--against", str(path)])
    assert diff.exit_code == 1
    assert f'error: resource "{extra["urn"]}" cannot be deleted' in diff.stdout
    assert "unprotected in its own reviewed change" in diff.stderr
