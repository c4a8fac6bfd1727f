"""Build policy/iam_roles.json, the evaluator's role → permissions table
(policy/iam.py), from a published dataset of GCP's predefined roles instead of
typing it.

Source: iann0036/iam-dataset (github.com/iann0036/iam-dataset), `gcp/roles/<role>.json`,
one file per predefined role as IAM's `roles.get` returns it (name, title, stage,
includedPermissions; the data behind gcp.permissions.cloud), pinned by commit.
Run against a checkout (or a git directory) of that repository:

    .venv/infra/bin/python -m policy.generate_roles --dataset /path/to/iam-dataset

It also writes policy/iam_permissions.json: every permission of PERMISSION_SERVICES
that some predefined role of the dataset holds (all `gcp/roles/*.json`), against which
the proof checks each custom role (policy/acting.py; issue 44).

Which roles: every role the stack's components grant (their constants) and the
ones the isolation tests ask about. The basic roles (owner, editor, viewer) list
thousands of permissions: they keep only the services the evaluator is asked
about (BASIC_ROLE_SERVICES), which the table says.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from model import bootstrap, function_accounts
from model import roles as r

DATASET_REPO = "iann0036/iam-dataset"
DATASET_COMMIT = "2073fa52ac008a45477aa0b1b4580cd99135bf60"  # 2026-08-22
TABLE = Path(__file__).with_name("iam_roles.json")
PERMISSIONS_TABLE = Path(__file__).with_name("iam_permissions.json")
# The services whose permissions the proof names (policy/permissions.py TABLE) and the
# stack's custom roles hold: their permissions as the dataset's predefined roles list
# them, written to PERMISSIONS_TABLE. A custom role's permission outside it is refused.
PERMISSION_SERVICES = ("artifactregistry", "billing", "cloudbuild", "cloudfunctions",
                       "cloudquotas", "compute", "eventarc", "iam", "logging", "monitoring",
                       "pubsub", "resourcemanager", "run", "serviceusage", "storage", "tpu")
BASIC_ROLES = ("roles/owner", "roles/editor", "roles/viewer")
BASIC_ROLE_SERVICES = ("cloudquotas", "compute", "iam", "logging", "monitoring",
                       "resourcemanager", "serviceusage", "storage", "tpu")
# Roles the tests ask about that no component grants (escalation targets).
EXTRA_ROLES = ("roles/owner", "roles/editor", "roles/storage.admin", "roles/cloudquotas.admin",
               "roles/iam.serviceAccountTokenCreator", "roles/iam.serviceAccountAdmin",
               "roles/iam.roleAdmin", "roles/iam.workloadIdentityPoolAdmin",
               "roles/resourcemanager.projectCreator", "roles/billing.user")


def granted_roles() -> list[str]:
    """The predefined roles the components grant, from the model's role facts."""
    roles: set[str] = {*r.PROJECT_ROLES, *r.BUCKET_ROLES.values(), r.BUCKET_METADATA_ROLE,
                       r.ACT_AS_ROLE, *r.MEMBER_BUCKET_ROLES.values(), *r.DEPLOYER_ROLES,
                       *r.BOOTSTRAP_ROLES, *r.TEAM_DEPLOYER_ROLES, *r.PREVIEW_ROLES,
                       *r.DEPLOYER_ACCOUNT_ROLES, r.IMPERSONATION_ROLE,
                       *r.PLATFORM_FOLDER_ROLES,
                       *r.MEMBER_PROJECT_ROLES, r.NETWORK_USER_ROLE,
                       r.TPU_XPN_AGENT_ROLE, bootstrap.XPN_ADMIN, bootstrap.BUDGETS_ROLE,
                       bootstrap.HOST_STORAGE_ROLE, *bootstrap.BUDGET_STOP_HOST_ROLES,
                       *bootstrap.CONTROLLER_HOST_ROLES,
                       function_accounts.BUILDER_ROLE, "roles/run.invoker",
                       "roles/pubsub.publisher"}
    return sorted(roles | set(EXTRA_ROLES))


def read_role(dataset: Path, role: str) -> dict[str, Any]:
    """`roles/x.y` from a checkout (gcp/roles/x.y.json) or a git directory at the commit."""
    relative = f"gcp/roles/{role.removeprefix('roles/')}.json"
    if (dataset / "gcp" / "roles").is_dir():
        return json.loads((dataset / relative).read_text())
    shown = subprocess.run(["git", f"--git-dir={dataset}", "show", f"{DATASET_COMMIT}:{relative}"],
                           capture_output=True, text=True, check=False)
    if shown.returncode != 0:
        raise SystemExit(f"{role}: not in {DATASET_REPO}@{DATASET_COMMIT} ({shown.stderr.strip()})")
    return json.loads(shown.stdout)


def table(dataset: Path, roles: Iterable[str]) -> dict[str, Any]:
    entries = {}
    for role in roles:
        data = read_role(dataset, role)
        permissions = sorted(data.get("includedPermissions") or ())
        entry: dict[str, Any] = {"title": data.get("title"), "stage": data.get("stage")}
        if role in BASIC_ROLES:
            entry["permissionsInDataset"] = len(permissions)
            entry["keptServices"] = list(BASIC_ROLE_SERVICES)
            permissions = [p for p in permissions if p.split(".", 1)[0] in BASIC_ROLE_SERVICES]
        entry["permissions"] = permissions
        entries[role] = entry
    return {
        "about": "Generated by policy/generate_roles.py; do not edit. Role -> permissions of "
                 "GCP's predefined roles as IAM's roles.get returns them, for every role the "
                 "stack grants and those the isolation tests ask about. Basic roles keep only "
                 "the services in keptServices.",
        "source": {"repo": DATASET_REPO, "commit": DATASET_COMMIT, "path": "gcp/roles/<role>.json"},
        "roles": entries,
    }


def role_files(dataset: Path) -> list[str]:
    """Every `gcp/roles/<role>.json` of the dataset (a checkout or a git directory)."""
    if (dataset / "gcp" / "roles").is_dir():
        return sorted(f"gcp/roles/{p.name}" for p in (dataset / "gcp" / "roles").glob("*.json"))
    listed = subprocess.run(["git", f"--git-dir={dataset}", "ls-tree", "--name-only",
                             DATASET_COMMIT, "gcp/roles/"], capture_output=True, text=True,
                            check=True)
    return sorted(listed.stdout.split())


def known_permissions(dataset: Path) -> dict[str, Any]:
    """Every permission of PERMISSION_SERVICES some predefined role of the dataset holds:
    what IAM accepts in a custom role, as far as the dataset shows (a permission no
    predefined role holds is missing here, and refused: closed, not open)."""
    found: set[str] = set()
    for relative in role_files(dataset):
        role = "roles/" + relative.removeprefix("gcp/roles/").removesuffix(".json")
        found |= set(read_role(dataset, role).get("includedPermissions") or ())
    return {
        "about": "Generated by policy/generate_roles.py; do not edit. Every permission of "
                 "the services listed that some predefined role of the dataset holds.",
        "source": {"repo": DATASET_REPO, "commit": DATASET_COMMIT, "path": "gcp/roles/*.json"},
        "services": list(PERMISSION_SERVICES),
        "permissions": sorted(p for p in found if p.split(".", 1)[0] in PERMISSION_SERVICES),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, required=True,
                        help=f"a checkout or git directory of {DATASET_REPO}")
    parser.add_argument("--out", type=Path, default=TABLE)
    parser.add_argument("--permissions-out", type=Path, default=PERMISSIONS_TABLE)
    args = parser.parse_args(argv)
    built = table(args.dataset, granted_roles())
    args.out.write_text(json.dumps(built, indent=1, sort_keys=True) + "\n")
    print(f"{args.out}: {len(built['roles'])} roles from {DATASET_REPO}@{DATASET_COMMIT[:12]}")
    known = known_permissions(args.dataset)
    args.permissions_out.write_text(json.dumps(known, indent=1) + "\n")
    print(f"{args.permissions_out}: {len(known['permissions'])} permissions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
