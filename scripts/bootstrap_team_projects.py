"""The bootstrap step of a platform stack (docs/teams.md, "Who deploys what"): the
gcloud commands an admin runs, once per new team (`--team NAME`), before
`pulumi up -s platform`.

It makes each team's project in the folder and links it to billing (so the
platform's deployer needs neither projectCreator nor billing.user and owns no
project), the custom roles the deployer grants (a fixed permission list: the
deployer holds no iam.roleAdmin), the budget-stop functions' accounts, enforces the
folder's org policies, and grants the platform's deployer its roles
(model/bootstrap.py: the folder, the host project, where the host project lives, the
billing account). It prints the commands; review them, then run them as an admin
(`... | sh -e`):

    .venv/infra/bin/python scripts/bootstrap_team_projects.py --stack platform \\
        --deployer platform-deployer@acme-ml-shared.iam.gserviceaccount.com \\
        --customer-id C0abc123 --host-parent organizations/123456789 [--team nlp]

Without `--team`, every team's project, roles and accounts (the first run); with it,
those of the teams named only (the grants and org policies, idempotent, every run).
The condition files go to `.cache/bootstrap/` (`--out-dir`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

from model import function_accounts
from model.bootstrap import (
    PROJECT_IAM_ADMIN,
    CustomRole,
    Grant,
    custom_roles,
    deployer_grants,
    function_account_grants,
    grants_condition,
    host_condition,
    quota_contact_grant,
)
from model.roles import DOMAIN_POLICY, ENFORCED_POLICIES
from model.settings.schema import StackSettings
from model.shared_reservations import OWNER_POLICY, owners_allowed

REPO_ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = REPO_ROOT / ".cache" / "bootstrap"  # ignored by git (.gitignore: .cache/)

# `gcloud <group> add-iam-policy-binding <id>` by the kind of resource a grant is on.
_GRANT_COMMANDS = {"folders": ["resource-manager", "folders"], "projects": ["projects"],
                   "organizations": ["organizations"], "billingAccounts": ["billing", "accounts"]}


def commands(settings: StackSettings, deployer: str, customer_id: str,
             condition_files: dict[str, str], host_parent: str,
             contact_kind: str = "group", teams: list[str] | None = None,
             organization: str | None = None) -> list[list[str]]:
    """Every command, in order: projects, billing, custom roles, the functions' accounts,
    org policies, the deployer's grants, the quota contact's. `teams`: only those
    teams' projects, roles and accounts (default: every team's).
    `condition_files`: the folder's and the host's condition file, by resource kind."""
    assert settings.team_projects is not None and settings.team_billing_account
    folder = settings.team_projects.folder_id
    run: list[list[str]] = []
    for team in sorted(t for t in settings.teams if teams is None or t in teams):
        project = settings.naming.team_project(team)
        labels = settings.naming.labels("project", team, settings.team_labels(team))
        run.append(["gcloud", "projects", "create", project, f"--folder={folder}",
                    f"--name={project}",
                    "--labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items()))])
        run.append(["gcloud", "billing", "projects", "link", project,
                    f"--billing-account={settings.team_billing_account}"])
    run += [_role_command(role) for role in custom_roles(settings, teams)]
    run += [["gcloud", "iam", "service-accounts", "create", account_id,
             f"--project={settings.gcp_project}", f"--display-name={display}"]
            for account_id, display in function_accounts.accounts(settings, teams)]
    for where in (f"--folder={folder}", f"--project={settings.gcp_project}"):
        for constraint in ENFORCED_POLICIES:
            run.append(["gcloud", "resource-manager", "org-policies", "enable-enforce",
                        constraint, where])
        run.append(["gcloud", "resource-manager", "org-policies", "allow", DOMAIN_POLICY,
                    customer_id, where])
    for owner in owners_allowed(settings):  # model/shared_reservations.py
        run.append(["gcloud", "resource-manager", "org-policies", "allow", OWNER_POLICY, owner,
                    f"--organization={organization or 'ORGANIZATION_ID'}"])
    grants = deployer_grants(settings, deployer, host_parent)
    grants += function_account_grants(settings, deployer, teams)
    contact = quota_contact_grant(settings, contact_kind)
    for grant in [*grants, *([contact] if contact else [])]:
        run.append(_grant_command(grant, condition_files))
    return run


def _role_command(role: CustomRole) -> list[str]:
    """`gcloud iam roles create`: the role with exactly these permissions
    (cloud.google.com/iam/docs/creating-custom-roles)."""
    return ["gcloud", "iam", "roles", "create", role.role_id, f"--project={role.project}",
            f"--title={role.title}", f"--permissions={','.join(role.permissions)}",
            "--stage=GA"]


def _grant_command(grant: Grant, condition_files: dict[str, str]) -> list[str]:
    if "/serviceAccounts/" in grant.resource:  # the account's own allow policy
        project, email = grant.resource.removeprefix("projects/").split("/serviceAccounts/")
        return ["gcloud", "iam", "service-accounts", "add-iam-policy-binding", email,
                f"--project={project}", f"--member={grant.member}", f"--role={grant.role}"]
    if grant.resource.startswith("projects/_/buckets/"):
        bucket = grant.resource.removeprefix("projects/_/buckets/")
        return ["gcloud", "storage", "buckets", "add-iam-policy-binding", f"gs://{bucket}",
                f"--member={grant.member}", f"--role={grant.role}"]
    kind, _, name = grant.resource.partition("/")
    command = ["gcloud", *_GRANT_COMMANDS[kind], "add-iam-policy-binding", name,
               f"--member={grant.member}", f"--role={grant.role}"]
    if grant.role == PROJECT_IAM_ADMIN and grant.condition:
        command.append(f"--condition-from-file={condition_files[kind]}")
    return command


def main(argv: list[str] | None = None) -> int:
    from components.stack_config import settings_for

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", default="platform")
    parser.add_argument("--deployer", required=True, help="the platform deployer's email")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR,
                        help="where the condition files are written (default: .cache/bootstrap)")
    parser.add_argument("--team", action="append", default=None, metavar="NAME",
                        help="only this team's project, roles and accounts (repeatable); "
                             "default: every team's (the first run)")
    parser.add_argument("--customer-id", required=True,
                        help="the organization's Workspace/Cloud Identity customer id (C0…)")
    parser.add_argument("--host-parent", required=True,
                        help="where the host project lives: folders/N or organizations/N "
                             "(`gcloud projects describe <host> --format='value(parent)'`)")
    parser.add_argument("--organization", help="the organization id (digits): where the "
                        "shared reservations' owner policy is set (tpu-stack:sharedReservations)")
    parser.add_argument("--quota-contact-kind", choices=("group", "user"), default="group",
                        help="what teamProjects.quotaContact is (IAM member type)")
    args = parser.parse_args(argv)
    settings = settings_for(args.stack)
    if not settings.teams or settings.team_projects is None:
        parser.error(f"stack {args.stack} declares no tpu-stack:teams / teamProjects")
    if not args.host_parent.startswith(("folders/", "organizations/")):
        parser.error(f"--host-parent {args.host_parent!r}: folders/N or organizations/N")
    if owners_allowed(settings) and not (args.organization or "").isdigit():
        parser.error("--organization <digits> is required with tpu-stack:sharedReservations "
                     "(the owner projects' org policy is set on the organization)")
    unknown = sorted(set(args.team or ()) - set(settings.teams))
    if unknown:
        parser.error(f"--team {', '.join(unknown)}: not in tpu-stack:teams of {args.stack} "
                     f"({', '.join(sorted(settings.teams))})")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    files = {"folders": args.out_dir / f"{args.stack}-team-grants.json",
             "projects": args.out_dir / f"{args.stack}-host-grants.json"}
    files["folders"].write_text(json.dumps(grants_condition(settings), indent=1) + "\n")
    files["projects"].write_text(json.dumps(host_condition(settings), indent=1) + "\n")
    print(f"# {files['folders']}, {files['projects']}: the conditions of the deployer's "
          f"projectIamAdmin on the folder and on the host project")
    for command in commands(settings, args.deployer, args.customer_id,
                            {k: str(v) for k, v in files.items()}, args.host_parent,
                            args.quota_contact_kind, args.team, args.organization):
        print(shlex.join(command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
