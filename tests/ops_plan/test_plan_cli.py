"""`tpuctl plan --format` / `--against` through the CLI, on the dev stack."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from ops.cli import app

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
    assert "No resource changes." in diff.stdout


def _error(args: list[str]) -> str:
    """The one-line error of a refused command (the console wraps long lines)."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    return " ".join(result.output.split())


def test_bad_format_and_bad_base_are_one_clear_error(tmp_path):
    assert ("error: --format 'html' is not a format; allowed: markdown, table, json"
            in _error(["plan", "--stack", "dev", "--format", "html"]))
    missing = tmp_path / "x"
    assert (f"error: --against {missing}: cannot read a plan"
            in _error(["plan", "--stack", "dev", "--against", str(missing)]))
