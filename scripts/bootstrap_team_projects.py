"""The bootstrap step of a platform stack (docs/teams.md, "Who deploys what"): the
gcloud commands an admin runs, once per new team, before `pulumi up -s platform`.

It makes each team's project in the folder and links it to billing (so the
platform's deployer needs neither projectCreator nor billing.user and owns no
project), enforces the folder's org policies, and grants the platform's deployer
its folder roles (components/ci.py, PLATFORM_FOLDER_ROLES). It prints the
commands; review them, then run them as an admin (`... | sh -e`):

    .venv/infra/bin/python scripts/bootstrap_team_projects.py --stack platform \\
        --deployer platform-deployer@acme-ml-shared.iam.gserviceaccount.com \\
        --customer-id C0abc123
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.ci import (
    DOMAIN_POLICY,
    ENFORCED_POLICIES,
    PLATFORM_FOLDER_ROLES,
    STORAGE_ROLE,
    TEAM_DEPLOYER_ROLES,
)
from components.identity import PROJECT_ROLES
from components.settings import StackSettings
from components.teams import MEMBER_PROJECT_ROLES


def granted_in_team_projects(settings: StackSettings) -> list[str]:
    """Project roles TeamProject grants in the teams' projects: what the deployer's
    projectIamAdmin on the folder is limited to (modifiedGrantsByRole)."""
    custom = [f"projects/{settings.naming.team_project(team)}/roles/"
              f"{settings.naming.custom_role_id(STORAGE_ROLE)}" for team in settings.teams]
    return sorted({*PROJECT_ROLES, *MEMBER_PROJECT_ROLES, *TEAM_DEPLOYER_ROLES, *custom})


def grants_condition(settings: StackSettings) -> dict[str, str]:
    """The condition file of the deployer's folder-level projectIamAdmin (gcloud
    --condition-from-file: the expression holds commas, which --condition splits on)."""
    listed = ", ".join(f"'{role}'" for role in granted_in_team_projects(settings))
    return {"title": "tpu-stack team grants",
            "expression": f"api.getAttribute('iam.googleapis.com/modifiedGrantsByRole', [])"
                          f".hasOnly([{listed}])"}


def commands(settings: StackSettings, deployer: str, customer_id: str,
             condition_file: str) -> list[list[str]]:
    """Every command, in order: projects, billing, org policies, folder grants."""
    assert settings.team_projects is not None and settings.team_billing_account
    folder = settings.team_projects.folder_id
    run: list[list[str]] = []
    for team in sorted(settings.teams):
        project = settings.naming.team_project(team)
        labels = settings.naming.labels("project", team, settings.team_labels(team))
        run.append(["gcloud", "projects", "create", project, f"--folder={folder}",
                    f"--name={project}",
                    "--labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items()))])
        run.append(["gcloud", "billing", "projects", "link", project,
                    f"--billing-account={settings.team_billing_account}"])
    for where in (f"--folder={folder}", f"--project={settings.gcp_project}"):
        for constraint in ENFORCED_POLICIES:
            run.append(["gcloud", "resource-manager", "org-policies", "enable-enforce",
                        constraint, where])
        run.append(["gcloud", "resource-manager", "org-policies", "allow", DOMAIN_POLICY,
                    customer_id, where])
    member = f"--member=serviceAccount:{deployer}"
    for role in PLATFORM_FOLDER_ROLES:
        command = ["gcloud", "resource-manager", "folders", "add-iam-policy-binding", folder,
                   member, f"--role={role}"]
        if role == "roles/resourcemanager.projectIamAdmin":
            command.append(f"--condition-from-file={condition_file}")
        run.append(command)
    return run


def main(argv: list[str] | None = None) -> int:
    from components.stack_config import settings_for

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", default="platform")
    parser.add_argument("--deployer", required=True, help="the platform deployer's email")
    parser.add_argument("--condition-file", default="tpu-stack-team-grants.json")
    parser.add_argument("--customer-id", required=True,
                        help="the organization's Workspace/Cloud Identity customer id (C0…)")
    args = parser.parse_args(argv)
    settings = settings_for(args.stack)
    if not settings.teams or settings.team_projects is None:
        parser.error(f"stack {args.stack} declares no tpu-stack:teams / teamProjects")
    condition = Path(args.condition_file)
    condition.write_text(json.dumps(grants_condition(settings), indent=1) + "\n")
    print(f"# {condition}: the condition of the deployer's projectIamAdmin on the folder")
    for command in commands(settings, args.deployer, args.customer_id, str(condition)):
        print(shlex.join(command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
