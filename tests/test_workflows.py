"""The workflows against the docs, the pinned actions and GitHub's own rules:
the variables they read are the ones docs/pr-previews.md asks for, every Pulumi
step runs the CLI version Pulumi.yaml requires, no heal can cancel a deploy, a
deploy checks the zones live before `pulumi up`, and pull requests never get
the deployer."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from model.roles import BOOTSTRAP_ROLES

ROOT = Path(__file__).resolve().parents[1]


def _stacks_module() -> Any:
    """.github/stacks.py, the workflows' stack and variable logic (not a package)."""
    spec = importlib.util.spec_from_file_location("ci_stacks", ROOT / ".github" / "stacks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["ci_stacks"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


stacks = _stacks_module()
WORKFLOWS = ROOT / ".github" / "workflows"
DOC = (ROOT / "docs" / "pr-previews.md").read_text()
PULUMI_ACTION = "pulumi/actions@"

# Inputs of pulumi/actions at the pinned commit 8e5e406f (v7.0.0), action.yml.
PULUMI_ACTION_INPUTS = {
    "command", "stack-name", "pulumi-version", "pulumi-version-file", "work-dir",
    "comment-on-pr", "comment-on-pr-number", "comment-on-summary", "github-token", "cloud-url",
    "secrets-provider", "parallel", "message", "config-map", "expect-no-changes", "diff",
    "replace", "exclude", "exclude-dependents", "target", "target-dependents", "policyPacks",
    "policyPackConfigs", "refresh", "upsert", "remove", "edit-pr-comment", "color",
    "exclude-protected", "plan", "suppress-outputs", "suppress-progress",
    "always-include-summary", "continue-on-error", "log-verbosity", "log-flow", "debug",
}


def load(name: str) -> dict[str, Any]:
    # PyYAML reads the key `on` as True (YAML 1.1); the tests never need it.
    return yaml.safe_load((WORKFLOWS / name).read_text())


def all_workflows() -> dict[str, dict[str, Any]]:
    return {path.name: load(path.name) for path in sorted(WORKFLOWS.glob("*.yml"))}


def steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


def pulumi_steps() -> list[tuple[str, dict[str, Any]]]:
    return [(name, step) for name, workflow in all_workflows().items()
            for step in steps(workflow) if step.get("uses", "").startswith(PULUMI_ACTION)]


def documented_names() -> set[str]:
    """Every `UPPER_CASE` name docs/pr-previews.md shows in code spans."""
    return set(re.findall(r"`([A-Z][A-Z0-9_]+)`", DOC))


# ---- variables -----------------------------------------------------------------


# A read of a `vars` or `secrets` context in every form GitHub's expressions accept: the
# property (`secrets.NAME`) and the index (`secrets['NAME']`, and `secrets["NAME"]`),
# with spaces anywhere inside `${{ }}`, in any case (contexts and their property names
# are case-insensitive: docs.github.com/actions/learn-github-actions/expressions and
# /contexts, "Property dereference"; secret names are upper-cased when stored).
CONTEXT_READ = re.compile(  # spaces within a line: a comment's "secrets." ends its line
    r"\b(?P<context>vars|secrets)[ \t]*(?:\.[ \t]*(?P<property>[A-Za-z_][A-Za-z0-9_]*)"
    r"|\[[ \t]*(?P<quote>['\"])(?P<key>[A-Za-z_][A-Za-z0-9_]*)(?P=quote)[ \t]*\])",
    re.IGNORECASE)


def context_reads(text: str, context: str = "secrets|vars") -> set[str]:
    """The names `text` reads from the context(s) (`vars`, `secrets`), upper-cased."""
    return {(match["property"] or match["key"]).upper() for match in CONTEXT_READ.finditer(text)
            if match["context"].lower() in context.split("|")}


def used_variables() -> set[str]:
    """`vars.NAME` and `secrets.NAME` read anywhere, and the per-stack names
    .github/stacks.py builds, for the stacks deploy.yml deploys."""
    names: set[str] = set()
    for path in WORKFLOWS.glob("*.yml"):
        names |= context_reads(path.read_text())
    for stack in stacks.DEPLOYED:
        for role in ("DEPLOYER", "PREVIEW"):
            names |= set(stacks.variable_names(stack, role))
    return names


def test_every_variable_a_workflow_reads_is_documented() -> None:
    used = used_variables()
    assert {"DEV_GCP_WORKLOAD_IDENTITY_PROVIDER", "PROD_GCP_DEPLOYER_SERVICE_ACCOUNT",
            "PROD_GCP_PREVIEW_SERVICE_ACCOUNT"} <= used
    assert used - documented_names() == set()


def test_every_identity_variable_is_per_stack() -> None:
    """A bare GCP_SERVICE_ACCOUNT is not what the docs ask for (issue 15)."""
    for name in used_variables():
        if "_GCP_" in f"_{name}":
            assert re.fullmatch(r"(DEV|PROD)_GCP_[A-Z_]+", name), name


def test_pull_requests_get_only_the_preview_account() -> None:
    for name, workflow in all_workflows().items():
        text = (WORKFLOWS / name).read_text()
        if triggers(workflow) & {"pull_request", "pull_request_target"}:
            assert "DEPLOYER" not in text and "stacks.py deploy" not in text, name
    preview = (WORKFLOWS / "preview.yml").read_text()
    assert "python3 .github/stacks.py preview" in preview
    assert stacks.preview_matrix({"PROD_GCP_WORKLOAD_IDENTITY_PROVIDER": "p",
                                  "PROD_GCP_PREVIEW_SERVICE_ACCOUNT": "a",
                                  "DEV_GCP_DEPLOYER_SERVICE_ACCOUNT": "d"}) == [
        {"stack": "prod", "provider": "p", "account": "a"}]
    for name, command in (("deploy.yml", "stacks.py deploy"), ("self-heal.yml", "stacks.py heal")):
        text = (WORKFLOWS / name).read_text()
        assert "PREVIEW" not in text and command in text, name


def triggers(workflow: dict[str, Any]) -> set[str]:
    on = workflow.get(True, workflow.get("on"))
    return set(on) if isinstance(on, dict) else {on} if isinstance(on, str) else set(on)


def test_each_deploy_runs_in_the_environment_its_deployer_trusts() -> None:
    """The deployer trusts only jobs in `deployEnvironment`, by default the stack's
    name (components/ci.py): the job enters the environment stacks.py names."""
    jobs = load("deploy.yml")["jobs"]
    for stack in stacks.DEPLOYED:
        args = jobs[stack]["with"]
        assert args["stack"] == stack
        assert args["environment"] == (
            f"${{{{ fromJSON(needs.stacks.outputs.plan).{stack}.environment }}}}")
    heal = load("self-heal.yml")["jobs"]["heal"]
    assert heal["environment"] == "${{ needs.gate.outputs.environment }}"
    assert load("pulumi-up.yml")["jobs"]["up"]["environment"] == "${{ inputs.environment }}"


# ---- credentials: deploy secrets only inside the protected environments ---------------

DEPLOY_SECRETS = ("PULUMI_ACCESS_TOKEN", "PULUMI_CONFIG_PASSPHRASE")


def strings_in(value: Any) -> list[str]:
    """Every string in a parsed workflow's value (keys too), as written, unquoted."""
    if isinstance(value, dict):
        return [text for key, item in value.items() for text in (*strings_in(key),
                                                                  *strings_in(item))]
    if isinstance(value, list):
        return [text for item in value for text in strings_in(item)]
    return [value] if isinstance(value, str) else []


def secret_reads(job: dict[str, Any]) -> set[str]:
    return {name for text in strings_in(job) for name in context_reads(text, "secrets")}


def deploy_secret_readers(workflows: dict[str, dict[str, Any]],
                          ) -> tuple[set[tuple[str, str]], list[tuple[str, str, set[str]]]]:
    """The jobs that read a deploy secret, and those of them outside an environment.
    Environment secrets reach only a job that sets `environment` (a caller of a reusable
    workflow passes them by name; the callee's job in the environment gets the values:
    docs.github.com, "Reusing workflows")."""
    readers, outside = set(), []
    for name, workflow in workflows.items():
        for job_name, job in workflow["jobs"].items():
            read = secret_reads(job) & set(DEPLOY_SECRETS)
            if not read:
                continue
            readers.add((name, job_name))
            if "uses" in job:  # a caller: the called job must run in the environment
                called = workflows.get(job["uses"].rsplit("/", 1)[1], {"jobs": {"?": {}}})
                in_environment = all("environment" in j for j in called["jobs"].values())
            else:
                in_environment = "environment" in job
            if not in_environment:
                outside.append((name, job_name, read))
    return readers, outside


def test_deploy_secrets_are_read_only_by_jobs_in_an_environment() -> None:
    """dev and prod admit main only. The check finds every deploy secret read (it fails
    when none is: a form it cannot see would otherwise pass it)."""
    readers, outside = deploy_secret_readers(all_workflows())
    assert outside == []
    read = {secret for name, job in readers
            for secret in secret_reads(all_workflows()[name]["jobs"][job])}
    assert read >= set(DEPLOY_SECRETS), readers


MADE_UP_WORKFLOW = """
on: push
jobs:
  deploy:
    runs-on: ubuntu-latest
    steps:
      - run: pulumi up
        env:
          PULUMI_ACCESS_TOKEN: ${{secrets[ 'PULUMI_ACCESS_TOKEN' ]}}
  passphrase:
    runs-on: ubuntu-latest
    environment: prod
    steps:
      - run: pulumi up
        env:
          PULUMI_CONFIG_PASSPHRASE: ${{ SECRETS["pulumi_config_passphrase"] }}
  fine:
    runs-on: ubuntu-latest
    steps:
      - run: echo "${{ secrets . PULUMI_PREVIEW_ACCESS_TOKEN }} ${{ vars['DEV_X'] }}"
"""


def test_the_secret_check_sees_the_bracket_forms_of_a_made_up_workflow() -> None:
    """A job outside an environment reading a deploy secret by index, with odd spacing,
    is found; the same read in an environment is not a problem."""
    workflows = {"made-up.yml": yaml.safe_load(MADE_UP_WORKFLOW)}
    readers, outside = deploy_secret_readers(workflows)
    assert readers == {("made-up.yml", "deploy"), ("made-up.yml", "passphrase")}
    assert outside == [("made-up.yml", "deploy", {"PULUMI_ACCESS_TOKEN"})]
    assert context_reads(MADE_UP_WORKFLOW, "secrets") == {
        "PULUMI_ACCESS_TOKEN", "PULUMI_CONFIG_PASSPHRASE", "PULUMI_PREVIEW_ACCESS_TOKEN"}
    assert context_reads(MADE_UP_WORKFLOW, "vars") == {"DEV_X"}


def test_pull_requests_read_no_deploy_secret_and_a_read_only_token() -> None:
    preview = load("preview.yml")["jobs"]["preview"]
    assert preview["env"]["PULUMI_ACCESS_TOKEN"] == "${{ secrets.PULUMI_PREVIEW_ACCESS_TOKEN }}"
    for name, workflow in all_workflows().items():
        if triggers(workflow) & {"pull_request", "pull_request_target"}:
            text = (WORKFLOWS / name).read_text()
            assert not context_reads(text, "secrets") & set(DEPLOY_SECRETS), name
            assert all("environment" not in job for job in workflow["jobs"].values()), name


# ---- which stacks deploy: .github/stacks.py against the shipped stacks ----------------

SHIPPED_ID = "712345678"  # Pulumi.prod.yaml's tpu-stack:ci.githubRepositoryId
PROD_VARS = {"PROD_GCP_WORKLOAD_IDENTITY_PROVIDER": "projects/1/locations/global/"
             "workloadIdentityPools/prod-github/providers/github",
             "PROD_GCP_DEPLOYER_SERVICE_ACCOUNT":
                 "prod-deployer@acme-ml-prod.iam.gserviceaccount.com"}


def run_stacks(*args: str, variables: dict[str, str], repository_id: str = SHIPPED_ID,
               branch: str = "main") -> subprocess.CompletedProcess[str]:
    """.github/stacks.py as the workflows run it, on the shipped stack files."""
    env = {**os.environ, "VARS": json.dumps(variables), "REPOSITORY_ID": repository_id,
           "BRANCH": branch}
    return subprocess.run([sys.executable, str(ROOT / ".github" / "stacks.py"), *args],
                          env=env, capture_output=True, text=True, cwd=ROOT, check=False)


def outputs(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return dict(line.split("=", 1) for line in result.stdout.splitlines())


def test_the_shipped_stacks_deploy_only_what_declares_ci() -> None:
    """dev declares no tpu-stack:ci: it is skipped, not failed, and prod no longer
    waits for a dev that cannot deploy (issue 19 item 4)."""
    assert not stacks.ci_of("dev") and stacks.ci_of("prod")
    result = run_stacks("deploy", variables=PROD_VARS)
    assert result.returncode == 0, result.stderr
    plan = json.loads(outputs(result)["plan"])
    assert plan["dev"]["act"] is False
    assert plan["prod"] == {"stack": "prod", "act": True, "environment": "prod",
                            "provider": PROD_VARS["PROD_GCP_WORKLOAD_IDENTITY_PROVIDER"],
                            "account": PROD_VARS["PROD_GCP_DEPLOYER_SERVICE_ACCOUNT"]}
    assert "::notice::dev is not deployed by CI: Pulumi.dev.yaml declares no tpu-stack:ci" in (
        result.stderr)


def test_a_missing_variable_fails_with_one_message_naming_it() -> None:
    result = run_stacks("deploy", variables={
        "PROD_GCP_WORKLOAD_IDENTITY_PROVIDER": "x"})
    assert result.returncode == 1 and result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if line.startswith("::error::")]
    assert errors == ["::error::set the repository variables PROD_GCP_DEPLOYER_SERVICE_ACCOUNT "
                      "(docs/pr-previews.md, 'Repository variables and secrets')"]
    both = run_stacks("heal", "prod", variables={})
    assert both.returncode == 1
    assert "PROD_GCP_WORKLOAD_IDENTITY_PROVIDER, PROD_GCP_DEPLOYER_SERVICE_ACCOUNT" in both.stderr


def test_another_repository_or_branch_deploys_nothing() -> None:
    """A clone keeps the shipped ids: its first push to main deploys nothing and
    says why, instead of failing in google-github-actions/auth."""
    for result in (run_stacks("deploy", variables={}, repository_id="1"),
                   run_stacks("deploy", variables=PROD_VARS, branch="release")):
        assert result.returncode == 0, result.stderr
        assert not any(t["act"] for t in json.loads(outputs(result)["plan"]).values())
        assert "prod is not deployed by CI" in result.stderr


def test_the_scheduled_heal_of_a_stack_without_ci_does_nothing() -> None:
    result = run_stacks("heal", "dev", variables={})
    assert result.returncode == 0, result.stderr
    assert outputs(result)["heal"] == "false"
    healed = outputs(run_stacks("heal", "prod", variables=PROD_VARS))
    assert healed["heal"] == "true" and healed["environment"] == "prod"
    assert healed["account"] == PROD_VARS["PROD_GCP_DEPLOYER_SERVICE_ACCOUNT"]


TEAM_ID = "723456789"  # Pulumi.platform.yaml's tpu-stack:teams.vision.ci.githubRepositoryId
TEAM_VARS = {"TEAM_VISION_GCP_WORKLOAD_IDENTITY_PROVIDER": "projects/2/locations/global/"
             "workloadIdentityPools/team-vision-github/providers/github",
             "TEAM_VISION_GCP_DEPLOYER_SERVICE_ACCOUNT":
                 "team-vision-deployer@acme-ml-shared-vision.iam.gserviceaccount.com"}


def test_a_team_stack_is_deployed_only_from_the_repository_the_platform_names() -> None:
    """team-vision declares no tpu-stack:ci: its deployer is the platform's
    teams.vision.ci, which names vision's repository, not this one."""
    here = run_stacks("deploy", "team-vision", variables=TEAM_VARS)
    assert here.returncode == 0, here.stderr
    assert json.loads(outputs(here)["plan"])["team-vision"]["act"] is False
    assert ("::notice::team-vision is not deployed by CI: it is deployed from "
            "acme/vision-models (Pulumi.platform.yaml's tpu-stack:teams.vision.ci: "
            f"githubRepositoryId '{TEAM_ID}'), this repository's id is '{SHIPPED_ID}'"
            ) in here.stderr

    theirs = run_stacks("deploy", "team-vision", variables=TEAM_VARS, repository_id=TEAM_ID)
    assert theirs.returncode == 0, theirs.stderr
    assert json.loads(outputs(theirs)["plan"])["team-vision"] == {
        "stack": "team-vision", "act": True, "environment": "team-vision",
        "provider": TEAM_VARS["TEAM_VISION_GCP_WORKLOAD_IDENTITY_PROVIDER"],
        "account": TEAM_VARS["TEAM_VISION_GCP_DEPLOYER_SERVICE_ACCOUNT"]}


def test_a_team_stacks_missing_variables_name_the_platform_outputs() -> None:
    result = run_stacks("heal", "team-vision", variables={}, repository_id=TEAM_ID)
    assert result.returncode == 1
    assert ("set the repository variables TEAM_VISION_GCP_WORKLOAD_IDENTITY_PROVIDER, "
            "TEAM_VISION_GCP_DEPLOYER_SERVICE_ACCOUNT (docs/pr-previews.md, 'Repository "
            "variables and secrets'; TEAM_VISION_GCP_WORKLOAD_IDENTITY_PROVIDER: platform's "
            "output teams.vision.deployer.workloadIdentityProvider; "
            "TEAM_VISION_GCP_DEPLOYER_SERVICE_ACCOUNT: platform's output "
            "teams.vision.deployer.serviceAccount)") in result.stderr


def test_a_team_repository_without_the_platform_file_deploys_its_team_stack(
    tmp_path: Path,
) -> None:
    shutil.copy(ROOT / "Pulumi.team-vision.yaml", tmp_path / "Pulumi.team-vision.yaml")
    chosen = stacks.select(["team-vision"], TEAM_VARS, "1", "main", root=tmp_path)
    assert chosen.missing == [] and chosen.notes == []
    assert chosen.targets[0].act and chosen.targets[0].environment == "team-vision"


def test_the_doc_names_each_team_variables_platform_output() -> None:
    doc = (ROOT / "docs" / "pr-previews.md").read_text()
    for name in stacks.TEAM_OUTPUTS.values():
        assert f"teams.<team>.deployer.{name}" in doc, name


def test_the_doc_lists_exactly_the_bootstrap_roles() -> None:
    doc = (ROOT / "docs" / "pr-previews.md").read_text()
    listed = doc.split("<!-- bootstrap-roles -->")[1].split("<!-- /bootstrap-roles -->")[0]
    assert re.findall(r"`(roles/[^`]+)`", listed) == list(BOOTSTRAP_ROLES)


def test_deploy_yml_has_one_job_per_deployed_stack_in_order() -> None:
    jobs = load("deploy.yml")["jobs"]
    assert set(jobs) == {"stacks", *stacks.DEPLOYED}
    plan = "\n".join(step.get("run", "") for step in jobs["stacks"]["steps"])
    assert "python .github/stacks.py deploy" in plan and "--require-hashes" in plan
    assert jobs["dev"]["if"] == "fromJSON(needs.stacks.outputs.plan).dev.act"
    assert jobs["prod"]["needs"] == ["stacks", "dev"]
    condition = jobs["prod"]["if"]
    assert "!cancelled()" in condition and "needs.dev.result == 'skipped'" in condition
    heal = load("self-heal.yml")["jobs"]
    assert heal["heal"]["if"].startswith("needs.gate.outputs.heal == 'true'")


# ---- the Pulumi CLI version ------------------------------------------------------


def required_version() -> str:
    required = yaml.safe_load((ROOT / "Pulumi.yaml").read_text()).get("requiredPulumiVersion")
    assert required, "Pulumi.yaml names no requiredPulumiVersion"
    match = re.fullmatch(r">=\s*v?(\d+\.\d+\.\d+)", str(required).strip())
    assert match, f"requiredPulumiVersion {required!r} is not >=X.Y.Z"
    return match[1]


def test_the_version_file_is_pulumi_yamls_minimum() -> None:
    path = ROOT / ".pulumi-version"
    assert path.exists(), ".pulumi-version is missing"
    text = path.read_text()
    assert re.fullmatch(r"\d+\.\d+\.\d+\n?", text), f"{text!r}: one X.Y.Z line"
    assert text.strip() == required_version()


def test_every_pulumi_step_pins_the_cli_with_the_version_file() -> None:
    found = pulumi_steps()
    assert len(found) >= 3
    for workflow, step in found:
        inputs = step.get("with", {})
        # An empty input means any version: the runner image's CLI is used
        # (pulumi/actions src/libs/pulumi-cli.ts, semver.satisfies(version, '')).
        assert inputs.get("pulumi-version-file") == ".pulumi-version", workflow
        assert "pulumi-version" not in inputs, workflow  # both at once is an error
        assert set(inputs) <= PULUMI_ACTION_INPUTS, (workflow, set(inputs) - PULUMI_ACTION_INPUTS)


# ---- concurrency: a heal never cancels a deploy -------------------------------------


def group_prefix(job: dict[str, Any]) -> str:
    """The literal start of the job's concurrency group, lower-cased (GitHub
    compares group names case-insensitively)."""
    concurrency = job.get("concurrency")
    assert concurrency, "a job that runs pulumi up needs a concurrency group"
    group = concurrency["group"] if isinstance(concurrency, dict) else concurrency
    return group.split("${{", 1)[0].lower()


def updating_jobs(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return [job for job in workflow["jobs"].values()
            if any(step.get("uses", "").startswith(PULUMI_ACTION)
                   and step.get("with", {}).get("command") == "up"
                   for step in job.get("steps", []))]


def test_heals_and_deploys_never_share_a_concurrency_group() -> None:
    """GitHub keeps one pending job per group and cancels the older pending one
    when another queues (docs.github.com, "Control the concurrency of workflows
    and jobs"): sharing a group with the 30-minute heal would let it cancel a
    pending deploy. Groups whose literal prefixes differ can never be equal."""
    deploys = updating_jobs(load("pulumi-up.yml"))
    heals = updating_jobs(load("self-heal.yml"))
    assert deploys and heals
    for deploy in deploys:
        for heal in heals:
            one, other = group_prefix(deploy), group_prefix(heal)
            assert one and other
            assert not one.startswith(other) and not other.startswith(one), (one, other)
    for job in deploys:
        assert job["concurrency"]["cancel-in-progress"] is False  # never cancel a running up


def test_a_heal_gives_way_to_deploys_and_a_deploy_waits_for_a_running_heal() -> None:
    heal = load("self-heal.yml")["jobs"]
    gate = "\n".join(step.get("run", "") for step in heal["gate"]["steps"])
    assert "--workflow deploy.yml" in gate and 'select(.status != "completed")' in gate
    assert heal["heal"]["needs"] == "gate"
    assert heal["heal"]["if"] == (
        "needs.gate.outputs.heal == 'true' && needs.gate.outputs.deploying == 'false'")
    # Checked again just before anything changes: the job may have waited in its group.
    heal_steps = heal["heal"]["steps"]
    recheck = next(i for i, step in enumerate(heal_steps) if step.get("id") == "recheck")
    assert "--workflow deploy.yml" in heal_steps[recheck]["run"]
    changing = [i for i, step in enumerate(heal_steps)
                if "tpuctl recover" in step.get("run", "")
                or step.get("uses", "").startswith(PULUMI_ACTION)]
    assert len(changing) == 2 and recheck < min(changing)
    for i in changing:
        assert heal_steps[i]["if"] == "steps.recheck.outputs.active == 'false'"
    up = load("pulumi-up.yml")["jobs"]["up"]
    names = [step.get("name", step.get("uses", "")) for step in up["steps"]]
    wait = names.index("Wait until no heal is running")
    assert "--workflow self-heal.yml" in up["steps"][wait]["run"]
    assert wait < next(i for i, n in enumerate(names) if n.startswith(PULUMI_ACTION))
    assert up["permissions"]["actions"] == "read"
    callers = (load("deploy.yml")["jobs"][stack] for stack in stacks.DEPLOYED)
    for job in callers:  # a caller grants what the callee asks
        assert job["permissions"]["actions"] == "read"


# ---- preflight before up --------------------------------------------------------------


def test_the_deploy_runs_a_live_preflight_before_pulumi_up() -> None:
    up = load("pulumi-up.yml")["jobs"]["up"]["steps"]
    runs = [i for i, step in enumerate(up)
            if re.search(r"\./tpuctl preflight --stack \"\$STACK\" --live\b", step.get("run", ""))]
    assert len(runs) == 1
    preflight = up[runs[0]]
    assert preflight["env"]["STACK"] == "${{ inputs.stack }}"
    assert not preflight.get("continue-on-error")  # a failed preflight stops the job
    auth = next(i for i, s in enumerate(up) if "google-github-actions/auth" in s.get("uses", ""))
    pulumi = next(i for i, s in enumerate(up) if s.get("uses", "").startswith(PULUMI_ACTION))
    assert auth < runs[0] < pulumi


# ---- stacks exist in the backend ----------------------------------------------------


def test_no_step_creates_a_stack_and_the_docs_say_how() -> None:
    for workflow, step in pulumi_steps():
        assert str(step.get("with", {}).get("upsert", "false")).lower() == "false", workflow
    assert "pulumi stack init" in DOC
    assert "stack not found" in DOC.lower() or "no `upsert`" in DOC


@pytest.mark.parametrize("name", ["deploy.yml", "self-heal.yml", "preview.yml"])
def test_each_documented_workflow_is_in_the_table(name: str) -> None:
    assert f"`{name}`" in DOC


def test_the_job_running_pull_request_code_gets_no_write_token() -> None:
    """preview.yml: the job that checks out and runs the PR's code may read and mint
    its OIDC token only; the comment is written by a job that runs none of it."""
    jobs = load("preview.yml")["jobs"]
    for name, job in jobs.items():
        runs_pr_code = any(step.get("uses", "").startswith("actions/checkout@")
                           for step in job.get("steps", []))
        writes = {scope for scope, level in job.get("permissions", {}).items()
                  if level == "write"}
        if runs_pr_code:
            assert writes <= {"id-token"}, (name, writes)
            for step in job["steps"]:
                if step.get("uses", "").startswith(PULUMI_ACTION):
                    assert str(step["with"].get("comment-on-pr", "false")).lower() == "false"
    comment = jobs["comment"]
    assert comment["permissions"]["pull-requests"] == "write"
    assert comment["needs"] == "preview"
    assert all("run" not in step and not step.get("uses", "").startswith("actions/checkout@")
               for step in comment["steps"])
