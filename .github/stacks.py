"""Which stacks a workflow acts on, and as whom (deploy.yml, self-heal.yml, preview.yml;
tests/test_workflows.py runs the same code against the shipped stack files).

A stack is deployed or healed by CI only if its stack file declares a CI identity
(`tpu-stack:ci`) for this repository and branch: only then does its own `pulumi up`
create the deployer that CI impersonates (components/ci.py). A team stack (one that
declares `tpu-stack:platformStack`) declares none itself: the platform stack declares
the team's deployer (`tpu-stack:teams.<team>.ci`) and exports it as
`teams.<team>.deployer`. Where the platform's stack file is here too, its `ci` must
name this repository and branch; in a team's own repository (no platform file) the
team stack is deployed. Other stacks are skipped with a notice saying why, so the
shipped stacks deploy on a first run. A stack that is deployed needs its repository
variables; a missing one fails the run with one message naming every missing
variable (for a team stack, also the platform outputs that hold their values).

    python .github/stacks.py deploy [STACK...]  # GITHUB_OUTPUT line: plan=<json>
                                                # (default: dev, prod)
    python .github/stacks.py heal STACK      # lines: heal, environment, provider, account
    python .github/stacks.py preview         # line: matrix=<json>

Reads the variables as JSON in $VARS (`toJSON(vars)`), $REPOSITORY_ID
(`github.repository_id`) and $BRANCH (`github.ref_name`). Exit 1 on a missing variable.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEPLOYED = ("dev", "prod")  # deploy.yml's jobs, in order
DOC = "docs/pr-previews.md, 'Repository variables and secrets'"
# The platform output that holds each variable's value for a team stack
# (components/teams.py, TeamProject; docs/teams.md "Platform and team stacks").
TEAM_OUTPUTS = {"WORKLOAD_IDENTITY_PROVIDER": "workloadIdentityProvider",
                "DEPLOYER_SERVICE_ACCOUNT": "serviceAccount",
                "PREVIEW_SERVICE_ACCOUNT": "previewServiceAccount"}


def prefix(stack: str) -> str:
    """A stack's variable prefix: upper-cased, `-` as `_` (team-vision: TEAM_VISION)."""
    return stack.upper().replace("-", "_")


def variable_names(stack: str, role: str) -> tuple[str, str]:
    """The provider and service-account variables of `role` (DEPLOYER or PREVIEW)."""
    return (f"{prefix(stack)}_GCP_WORKLOAD_IDENTITY_PROVIDER",
            f"{prefix(stack)}_GCP_{role}_SERVICE_ACCOUNT")


def stacks(root: Path = ROOT) -> list[str]:
    return sorted(path.name[len("Pulumi."):-len(".yaml")] for path in root.glob("Pulumi.*.yaml"))


def config_of(stack: str, root: Path = ROOT) -> dict[str, Any]:
    """The stack file's `config` ({} without a stack file)."""
    path = root / f"Pulumi.{stack}.yaml"
    if not path.exists():
        return {}
    import yaml  # not needed by `preview`, which runs on the runner's own Python

    return (yaml.safe_load(path.read_text()) or {}).get("config") or {}


def ci_of(stack: str, root: Path = ROOT) -> dict[str, Any]:
    """The stack file's `tpu-stack:ci` ({} when it declares none)."""
    return config_of(stack, root).get("tpu-stack:ci") or {}


@dataclass(frozen=True)
class TeamStack:
    """A team stack: its team, and its platform's stack name."""

    team: str
    platform: str

    @property
    def environment(self) -> str:
        return f"team-{self.team}"  # components/ci.py, CiIdentity's default for a team

    def output(self, name: str) -> str:
        return f"teams.{self.team}.deployer.{TEAM_OUTPUTS[name.split('_GCP_', 1)[1]]}"


def team_of(stack: str, root: Path = ROOT) -> TeamStack | None:
    """A stack declaring `tpu-stack:platformStack` (`org/project/stack`) is a team stack."""
    config = config_of(stack, root)
    reference = str(config.get("tpu-stack:platformStack") or "")
    if not reference:
        return None
    return TeamStack(str(config.get("tpu-stack:team") or ""), reference.rsplit("/", 1)[-1])


def team_ci(team: TeamStack, root: Path = ROOT) -> dict[str, Any] | None:
    """The platform's `tpu-stack:teams.<team>.ci` ({} if it declares none), or None
    when the platform's stack file is not here (a team's own repository)."""
    if not (root / f"Pulumi.{team.platform}.yaml").exists():
        return None
    teams = config_of(team.platform, root).get("tpu-stack:teams") or {}
    return (teams.get(team.team) or {}).get("ci") or {}


def has_controller(stack: str, root: Path = ROOT) -> bool:
    """The stack, or a team stack's platform, runs the controller (issue 43): it heals
    the stack every interval, so the GitHub schedule leaves it alone."""
    team = team_of(stack, root)
    config = config_of(team.platform if team else stack, root)
    return bool((config.get("tpu-stack:controller") or {}).get("enabled"))


@dataclass
class Target:
    stack: str
    act: bool = False  # deploy or heal it
    environment: str = ""
    provider: str = ""
    account: str = ""


@dataclass
class Selection:
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # where a team stack's values are


def select(names: list[str] | tuple[str, ...], variables: dict[str, str], repository_id: str,
           branch: str, root: Path = ROOT) -> Selection:
    """The stacks among `names` CI deploys from `branch`, with their deployer."""
    out = Selection()
    for stack in names:
        target, why = Target(stack), _skip_reason(stack, repository_id, branch, root)
        if why:
            out.notes.append(f"{stack} is not deployed by CI: {why}")
        else:
            team = team_of(stack, root)
            ci = (team_ci(team, root) if team else ci_of(stack, root)) or {}
            default = team.environment if team else stack
            wanted = variable_names(stack, "DEPLOYER")
            missing = [name for name in wanted if not variables.get(name)]
            out.missing += missing
            out.sources += [f"{name}: {team.platform}'s output {team.output(name)}"
                            for name in missing if team]
            target = Target(stack, True, str(ci.get("deployEnvironment") or default),
                            *(variables.get(name, "") for name in wanted))
        out.targets.append(target)
    return out


def _skip_reason(stack: str, repository_id: str, branch: str, root: Path) -> str:
    if not (root / f"Pulumi.{stack}.yaml").exists():
        return f"there is no Pulumi.{stack}.yaml"
    team = team_of(stack, root)
    if team is not None:
        return _team_skip_reason(team, repository_id, branch, root)
    return _ci_skip_reason(ci_of(stack, root), f"Pulumi.{stack}.yaml declares no tpu-stack:ci "
                           "(docs/pr-previews.md, 'The stacks in CI's backend')",
                           repository_id, branch)


def _team_skip_reason(team: TeamStack, repository_id: str, branch: str, root: Path) -> str:
    ci = team_ci(team, root)
    if ci is None:
        return ""  # a team's own repository: the platform declared its deployer
    where = f"Pulumi.{team.platform}.yaml's tpu-stack:teams.{team.team}.ci"
    if ci and str(ci.get("githubRepositoryId", "")) != str(repository_id):
        return (f"it is deployed from {ci.get('githubRepository') or 'another repository'} "
                f"({where}: githubRepositoryId {ci.get('githubRepositoryId')!r}), this "
                f"repository's id is {repository_id!r}")
    return _ci_skip_reason(ci, f"{where} is not declared: the team has no deployer",
                           repository_id, branch)


def _ci_skip_reason(ci: dict[str, Any], undeclared: str, repository_id: str,
                    branch: str) -> str:
    if not ci:
        return undeclared
    if str(ci.get("githubRepositoryId", "")) != str(repository_id):
        return (f"its tpu-stack:ci.githubRepositoryId is {ci.get('githubRepositoryId')!r}, "
                f"this repository's id is {repository_id!r}")
    if str(ci.get("deployBranch") or "main") != branch:
        return f"it deploys from {ci.get('deployBranch') or 'main'!r}, this run is on {branch!r}"
    return ""


def missing_message(missing: list[str], sources: list[str] | None = None) -> str:
    where = f"; {'; '.join(sources)}" if sources else ""
    return f"set the repository variables {', '.join(missing)} ({DOC}{where})"


def preview_matrix(variables: dict[str, str], root: Path = ROOT) -> list[dict[str, str]]:
    """Every stack whose preview identity variables are set."""
    rows = []
    for stack in stacks(root):
        provider, account = (variables.get(name) for name in variable_names(stack, "PREVIEW"))
        if provider and account:
            rows.append({"stack": stack, "provider": provider, "account": account})
    return rows


def main(argv: list[str]) -> int:
    variables = json.loads(os.environ.get("VARS") or "{}")
    repository_id, branch = os.environ.get("REPOSITORY_ID", ""), os.environ.get("BRANCH", "")
    mode = argv[0] if argv else ""
    if mode == "preview":
        print("matrix=" + json.dumps(preview_matrix(variables)))
        return 0
    if mode not in ("deploy", "heal"):
        print(__doc__, file=sys.stderr)
        return 2
    if mode == "heal" and len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    chosen = select(argv[1:] or DEPLOYED, variables, repository_id, branch)
    for note in chosen.notes:
        print(f"::notice::{note}", file=sys.stderr)
    if chosen.missing:
        print(f"::error::{missing_message(chosen.missing, chosen.sources)}", file=sys.stderr)
        return 1
    if mode == "deploy":
        print("plan=" + json.dumps({t.stack: asdict(t) for t in chosen.targets}))
    else:
        target = chosen.targets[0]
        if target.act and has_controller(target.stack):
            print(f"::notice::{target.stack} is healed by its controller in the cloud "
                  f"(tpu-stack:controller, docs/design.md 'The controller'): this schedule "
                  f"is the fallback of stacks without one", file=sys.stderr)
            target = Target(target.stack)
        print(f"heal={str(target.act).lower()}")
        for key in ("environment", "provider", "account"):
            print(f"{key}={getattr(target, key)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
