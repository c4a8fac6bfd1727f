"""What the bootstrap step grants the platform's deployer, outside every plan (docs/teams.md,
"Who deploys what"): pure, read by scripts/bootstrap_team_projects.py (which prints the
gcloud commands) and by the permission proof (ops/plan/proof.py), so both see one list.

Where each grant lives:
- the teams' folder: PLATFORM_FOLDER_ROLES (components/ci.py), its projectIamAdmin
  limited by `modifiedGrantsByRole` to the roles TeamProject grants in a team project;
- the host project (the platform's `gcp:project`): the deployer roles of a stack's own
  project (ci.DEPLOYER_ROLES, projectIamAdmin limited to the roles the stack grants
  there) and storage.admin for the host's buckets;
- where the host project lives (its folder or organization, `--host-parent`):
  compute.xpnAdmin, because enabling a Shared VPC host is checked there
  (cloud.google.com/vpc/docs/shared-vpc: the Shared VPC Admin role is granted on the
  organization or a folder; compute.organizations.enableXpnHost);
- the state bucket (`teamProjects.stateBucket`): storage.admin, for the teams' conditioned
  grants on it and the per-team outputs objects the platform writes there;
- the billing account: billing.costsManager, for the teams' budgets
  (cloud.google.com/billing/docs/how-to/budgets: Billing Account Costs Manager);
- with a team's `budgetAction: stop`, the host project again: BUDGET_STOP_HOST_ROLES, for
  the budget stop's topic, function and Cloud Run invoker grant (components/
  budget_stop.py). Its grant of the TPU custom role in the team's project fits the
  folder's condition, which names that role in every team project;
- with `tpu-stack:controller` on, the host project again: CONTROLLER_HOST_ROLES, for the
  controller's schedule, function and invoker grant (components/controller.py); its
  custom roles (its TPU role in the host and every team project, its objects role in
  the host) are named in both conditions.
The custom roles the deployer grants are the bootstrap's (custom_roles), made with a
fixed permission list: the deployer holds iam.roleAdmin nowhere (issue 44).
And to the quota contact (`teamProjects.quotaContact`), Quota Administrator on the
teams' folder (quota_contact_grant).
"""

from __future__ import annotations

from dataclasses import dataclass

from model import function_accounts
from model.roles import (
    ACT_AS_ROLE,
    BUDGET_STOP_PERMISSIONS,
    BUDGET_STOP_ROLE,
    CONTROLLER_OBJECT_PERMISSIONS,
    CONTROLLER_OBJECTS_ROLE,
    CONTROLLER_PERMISSIONS,
    CONTROLLER_ROLE,
    DEPLOYER_ROLES,
    MARKER_PERMISSIONS,
    MEMBER_PROJECT_ROLES,
    METRICS_SCOPE_ROLE,
    PLATFORM_FOLDER_ROLES,
    PREVIEW_ROLES,
    PROJECT_ROLES,
    STORAGE_PERMISSIONS,
    STORAGE_ROLE,
    TEAM_DEPLOYER_ROLES,
    TPU_XPN_AGENT_ROLE,
    grants_only,
    marker_role,
)
from model.settings.schema import StackSettings

PROJECT_IAM_ADMIN = "roles/resourcemanager.projectIamAdmin"
XPN_ADMIN = "roles/compute.xpnAdmin"
BUDGETS_ROLE = "roles/billing.costsManager"
HOST_STORAGE_ROLE = "roles/storage.admin"
QUOTA_CONTACT_ROLE = "roles/cloudquotas.admin"
# What the budget stop (components/budget_stop.py) needs in the host project, each the
# smallest predefined role holding its permissions (policy/iam_roles.json, from
# iann0036/iam-dataset): granted only when a team's budget stops its TPUs.
BUDGET_STOP_HOST_ROLES = {
    # pubsub.topics.create/update/delete and the topic's setIamPolicy (the billing
    # publisher's grant): roles/pubsub.editor holds no setIamPolicy
    # (cloud.google.com/pubsub/docs/access-control).
    "roles/pubsub.admin": "the budget's topic and its publisher grant",
    # cloudfunctions.functions.create/update/delete (cloud.google.com/functions/docs/
    # reference/iam/roles); actAs on the function's account is granted on that account.
    "roles/cloudfunctions.developer": "the budget-stop function",
    # run.services.setIamPolicy: the one Cloud Run role holding it (Cloud Run Developer
    # "can get but not set IAM policies", cloud.google.com/run/docs/securing/managing-access).
    "roles/run.admin": "the trigger account's run.invoker on the function's service",
}
# What the controller (components/controller.py) needs in the host project beyond the
# budget stop's roles: its schedule, its function and that function's invoker grant.
CONTROLLER_HOST_ROLES = {
    # cloudscheduler.jobs.create/update/delete: no narrower predefined role holds them
    # (iann0036/iam-dataset gcp/roles/cloudscheduler.*.json: only cloudscheduler.admin).
    "roles/cloudscheduler.admin": "the controller's Cloud Scheduler job",
    "roles/cloudfunctions.developer": "the controller's function",
    "roles/run.admin": "the controller account's run.invoker on the function's service",
}
# The host project's parent as the proof names it when the bootstrap is not told.
UNKNOWN_HOST_PARENT = "folders/HOST_PARENT"


@dataclass(frozen=True)
class CustomRole:
    """A custom role the bootstrap creates with a fixed permission list: the deployer,
    which may grant it, holds no iam.roleAdmin to change it (issue 44)."""

    project: str
    role_id: str
    title: str
    permissions: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"projects/{self.project}/roles/{self.role_id}"


def custom_roles(settings: StackSettings, teams: list[str] | None = None) -> list[CustomRole]:
    """Per team (`teams`: those only): its deployer's storage role in its project (a team
    with `ci`), with `budgetAction: stop` the budget stop's TPU role there and its
    markers' role in the host project, and with the controller on its TPU role there;
    and, for the whole stack (`teams` None), the controller's roles in the host project."""
    naming, made = settings.naming, []
    if teams is None:
        made += controller_host_roles(settings)
    for team in sorted(settings.teams):
        spec = settings.teams[team]
        if teams is not None and team not in teams:
            continue
        project = naming.team_project(team)
        if spec.ci is not None:
            made.append(CustomRole(project, naming.custom_role_id(STORAGE_ROLE),
                                   "tpu-stack storage deployer", STORAGE_PERMISSIONS))
        if spec.budget_action == "stop":
            made.append(CustomRole(project, naming.custom_role_id(BUDGET_STOP_ROLE),
                                   f"tpu-stack budget stop of team {team}"[:100],
                                   BUDGET_STOP_PERMISSIONS))
            made.append(CustomRole(settings.gcp_project, naming.custom_role_id(marker_role(team)),
                                   f"tpu-stack budget stop markers of team {team}"[:100],
                                   MARKER_PERMISSIONS))
        if function_accounts.controller_enabled(settings):
            made.append(_controller_tpu_role(settings, project))
    return made


def _controller_tpu_role(settings: StackSettings, project: str) -> CustomRole:
    return CustomRole(project, settings.naming.custom_role_id(CONTROLLER_ROLE),
                      "tpu-stack controller", CONTROLLER_PERMISSIONS)


def controller_host_roles(settings: StackSettings) -> list[CustomRole]:
    """The controller's TPU role and objects role in the host project, when it is on."""
    if not function_accounts.controller_enabled(settings):
        return []
    return [_controller_tpu_role(settings, settings.gcp_project),
            CustomRole(settings.gcp_project, settings.naming.custom_role_id(
                CONTROLLER_OBJECTS_ROLE), "tpu-stack controller objects",
                CONTROLLER_OBJECT_PERMISSIONS)]


@dataclass(frozen=True)
class Grant:
    """One allow binding the bootstrap adds: `resource` is an IAM resource name
    (`folders/N`, `projects/P`, `billingAccounts/B`)."""

    resource: str
    role: str
    member: str
    condition: str | None = None


def granted_in_team_projects(settings: StackSettings) -> list[str]:
    """Project roles TeamProject grants in the teams' projects: what the deployer's
    projectIamAdmin on the folder is limited to (modifiedGrantsByRole). The preview
    account's roles are among them: a team's CiIdentity grants them in its project.
    A custom role's name is its project's (projects/P/roles/ID), so each team project's
    are listed: its deployer's storage role and the budget stop's TPU role (listed for
    every team, so turning `budgetAction: stop` on needs no new bootstrap; a condition
    naming a role nobody grants admits nothing more)."""
    roles = (STORAGE_ROLE, BUDGET_STOP_ROLE,
             *((CONTROLLER_ROLE,) if function_accounts.controller_enabled(settings) else ()))
    custom = [f"projects/{settings.naming.team_project(team)}/roles/"
              f"{settings.naming.custom_role_id(role)}"
              for team in settings.teams for role in roles]
    return sorted({*PROJECT_ROLES, *MEMBER_PROJECT_ROLES, *TEAM_DEPLOYER_ROLES, *PREVIEW_ROLES,
                   *custom})


def granted_in_host_project(settings: StackSettings) -> list[str]:
    """Project roles the stack grants in its own project, the deployer's own excepted:
    the runtime account's, the preview account's and, with teams, the teams' TPU
    service agents' tpu.xpnAgent, and with the controller on its roles there."""
    roles = {*PROJECT_ROLES, *PREVIEW_ROLES, *(r.name for r in controller_host_roles(settings))}
    return sorted(roles | ({TPU_XPN_AGENT_ROLE} if settings.teams else set()))


def grants_condition(settings: StackSettings) -> dict[str, str]:
    """The condition file of the deployer's folder-level projectIamAdmin (gcloud
    --condition-from-file: the expression holds commas, which --condition splits on)."""
    return {"title": "tpu-stack team grants",
            "expression": grants_only(granted_in_team_projects(settings))}


def host_condition(settings: StackSettings) -> dict[str, str]:
    return {"title": "tpu-stack host grants",
            "expression": grants_only(granted_in_host_project(settings))}


def deployer_grants(settings: StackSettings, deployer: str,
                    host_parent: str = UNKNOWN_HOST_PARENT) -> list[Grant]:
    """Every grant the bootstrap gives the platform deployer (`deployer`: its email)."""
    assert settings.team_projects is not None and settings.team_projects.folder_id
    member = f"serviceAccount:{deployer}"
    folder = f"folders/{settings.team_projects.folder_id}"
    host = f"projects/{settings.gcp_project}"
    grants = [Grant(folder, role, member, grants_condition(settings)["expression"]
                    if role == PROJECT_IAM_ADMIN else None) for role in PLATFORM_FOLDER_ROLES]
    grants += [Grant(host, role, member, host_condition(settings)["expression"]
                     if role == PROJECT_IAM_ADMIN else None)
               for role in (*DEPLOYER_ROLES, HOST_STORAGE_ROLE, *function_host_roles(settings),
                            METRICS_SCOPE_ROLE)]
    grants.append(Grant(host_parent, XPN_ADMIN, member))
    if settings.team_projects.state_bucket:  # the teams' state grants and outputs objects
        grants.append(Grant(f"projects/_/buckets/{settings.team_projects.state_bucket}",
                            HOST_STORAGE_ROLE, member))
    if settings.teams and settings.team_billing_account:  # the teams' budgets (platform.py)
        grants.append(Grant(f"billingAccounts/{settings.team_billing_account}", BUDGETS_ROLE,
                            member))
    return grants


def function_account_grants(settings: StackSettings, deployer: str,
                            teams: list[str] | None = None) -> list[Grant]:
    """The functions' accounts the bootstrap makes (model/function_accounts.py: the budget
    stops' and, when on, the controller's): the deployer acts as each (on that account's
    own allow policy), the build account builds in the host project. `teams`: only those
    teams' accounts (and not the controller's, which is the stack's)."""
    pairs = [(function_accounts.runtime_account(settings, team),
              function_accounts.build_account(settings, team))
             for team in function_accounts.stop_teams(settings)
             if teams is None or team in teams]
    if teams is None and function_accounts.controller_enabled(settings):
        pairs.append((function_accounts.controller_account(settings),
                      function_accounts.controller_build_account(settings)))
    grants = []
    for runtime, build in pairs:
        for email in (runtime, build):
            grants.append(Grant(function_accounts.account_name(settings, email), ACT_AS_ROLE,
                                f"serviceAccount:{deployer}"))
        grants.append(Grant(f"projects/{settings.gcp_project}", function_accounts.BUILDER_ROLE,
                            f"serviceAccount:{build}"))
    return grants


def function_host_roles(settings: StackSettings) -> list[str]:
    """BUDGET_STOP_HOST_ROLES when a team's budget stops its TPUs, and CONTROLLER_HOST_ROLES
    when the controller is on: the host roles the functions need, each once."""
    stops = any(team.budget_action == "stop" for team in settings.teams.values())
    roles = set(BUDGET_STOP_HOST_ROLES) if stops else set()
    if function_accounts.controller_enabled(settings):
        roles |= set(CONTROLLER_HOST_ROLES)
    return sorted(roles)


def quota_contact_grant(settings: StackSettings, kind: str = "group") -> Grant | None:
    """Cloud Quotas: "The Google account for the email address must have quota update
    permission for the project, folder or organization this quota preference is for"
    (QuotaPreference.contact_email, Cloud Quotas v1): Quota Administrator on the teams'
    folder for `teamProjects.quotaContact` (a `group` or a `user`)."""
    projects = settings.team_projects
    if projects is None or not projects.folder_id or not projects.quota_contact:
        return None
    return Grant(f"folders/{projects.folder_id}", QUOTA_CONTACT_ROLE,
                 f"{kind}:{projects.quota_contact}")
