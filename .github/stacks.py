"""Which stacks a workflow acts on, and as whom (deploy.yml, self-heal.yml, preview.yml;
tests/test_workflows.py runs the same code against the shipped stack files).

A stack is deployed or healed by CI only if its stack file declares a CI identity
(`tpu-stack:ci`) for this repository and branch: only then does its own `pulumi up`
create the deployer that CI impersonates (components/ci.py). Other stacks are
skipped with a notice saying why, so the shipped stacks deploy on a first run.
A stack that does declare one needs its repository variables; a missing one fails
the run with one message naming every missing variable.

    python .github/stacks.py deploy          # GITHUB_OUTPUT line: plan=<json>
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


def prefix(stack: str) -> str:
    """A stack's variable prefix: upper-cased, `-` as `_` (team-vision: TEAM_VISION)."""
    return stack.upper().replace("-", "_")


def variable_names(stack: str, role: str) -> tuple[str, str]:
    """The provider and service-account variables of `role` (DEPLOYER or PREVIEW)."""
    return (f"{prefix(stack)}_GCP_WORKLOAD_IDENTITY_PROVIDER",
            f"{prefix(stack)}_GCP_{role}_SERVICE_ACCOUNT")


def stacks(root: Path = ROOT) -> list[str]:
    return sorted(path.name[len("Pulumi."):-len(".yaml")] for path in root.glob("Pulumi.*.yaml"))


def ci_of(stack: str, root: Path = ROOT) -> dict[str, Any]:
    """The stack file's `tpu-stack:ci` ({} when it declares none)."""
    path = root / f"Pulumi.{stack}.yaml"
    if not path.exists():
        return {}
    import yaml  # not needed by `preview`, which runs on the runner's own Python

    config = (yaml.safe_load(path.read_text()) or {}).get("config") or {}
    return config.get("tpu-stack:ci") or {}


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


def select(names: list[str] | tuple[str, ...], variables: dict[str, str], repository_id: str,
           branch: str, root: Path = ROOT) -> Selection:
    """The stacks among `names` CI deploys from `branch`, with their deployer."""
    out = Selection()
    for stack in names:
        target, why = Target(stack), _skip_reason(stack, repository_id, branch, root)
        if why:
            out.notes.append(f"{stack} is not deployed by CI: {why}")
        else:
            ci = ci_of(stack, root)
            wanted = variable_names(stack, "DEPLOYER")
            out.missing += [name for name in wanted if not variables.get(name)]
            target = Target(stack, True, str(ci.get("deployEnvironment") or stack),
                            *(variables.get(name, "") for name in wanted))
        out.targets.append(target)
    return out


def _skip_reason(stack: str, repository_id: str, branch: str, root: Path) -> str:
    ci = ci_of(stack, root)
    if not (root / f"Pulumi.{stack}.yaml").exists():
        return f"there is no Pulumi.{stack}.yaml"
    if not ci:
        return (f"Pulumi.{stack}.yaml declares no tpu-stack:ci (docs/pr-previews.md, "
                "'The stacks in CI's backend')")
    if str(ci.get("githubRepositoryId", "")) != str(repository_id):
        return (f"its tpu-stack:ci.githubRepositoryId is {ci.get('githubRepositoryId')!r}, "
                f"this repository's id is {repository_id!r}")
    if str(ci.get("deployBranch") or "main") != branch:
        return f"it deploys from {ci.get('deployBranch') or 'main'!r}, this run is on {branch!r}"
    return ""


def missing_message(missing: list[str]) -> str:
    return f"set the repository variables {', '.join(missing)} ({DOC})"


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
    if mode not in ("deploy", "heal") or (mode == "heal") != (len(argv) == 2):
        print(__doc__, file=sys.stderr)
        return 2
    chosen = select(DEPLOYED if mode == "deploy" else argv[1:], variables, repository_id, branch)
    for note in chosen.notes:
        print(f"::notice::{note}", file=sys.stderr)
    if chosen.missing:
        print(f"::error::{missing_message(chosen.missing)}", file=sys.stderr)
        return 1
    if mode == "deploy":
        print("plan=" + json.dumps({t.stack: asdict(t) for t in chosen.targets}))
    else:
        target = chosen.targets[0]
        print(f"heal={str(target.act).lower()}")
        for key in ("environment", "provider", "account"):
            print(f"{key}={getattr(target, key)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
