"""The accounts a budget-stop function (components/budget_stop.py) runs and builds as:
made by the bootstrap (scripts/bootstrap_team_projects.py), never by the plan, so the
platform deployer grants itself nothing on them (issue 44).

In the host project the deployer holds iam.serviceAccountCreator only: an account it
made there it could not administer, and granting itself actAs on it is a setIamPolicy
on that account, which GCP refuses. So the bootstrap (an admin) makes, per team with
`budgetAction: stop`, the function's runtime account and its build account, and grants
the deployer actAs on each (that account only). Per team, so a bootstrap for one team
(`--team`) makes all it needs and nothing another team's run made.

The build account: a Cloud Run function (gen2) without `buildConfig.serviceAccount`
builds as the Compute Engine default account (cloud.google.com/functions/docs/securing/
build-custom-sa), which iam.automaticIamGrantsForDefaultServiceAccounts (enforced by the
bootstrap) leaves without roles: its build fails. A build account of its own holds
roles/cloudbuild.builds.builder on the host project (same page), which also holds
storage.objects.get there, i.e. read on the function's source object in the host's
artifacts bucket (iann0036/iam-dataset gcp/roles/cloudbuild.builds.builder.json);
the deployer needs actAs on it (same page: "the deployer needs the
iam.serviceAccounts.actAs permission on the build service account").
"""

from __future__ import annotations

from model.settings.schema import StackSettings

BUILDER_ROLE = "roles/cloudbuild.builds.builder"
BUILD_ACCOUNT = "function-build"
RUNTIME_ACCOUNT = "budget-stop"
# The controller's own accounts (components/controller.py), one pair per stack that
# enables it: it runs as the first and is built as the second, for the reasons above.
CONTROLLER_ACCOUNT = "controller"
CONTROLLER_BUILD_ACCOUNT = "controller-build"
# (logical name, display name) of each: the bootstrap's and a standalone stack's plan's.
CONTROLLER_ACCOUNTS = ((CONTROLLER_ACCOUNT, "tpu-stack controller"),
                       (CONTROLLER_BUILD_ACCOUNT, "tpu-stack controller build"))


def stop_teams(settings: StackSettings) -> list[str]:
    return sorted(t for t, spec in settings.teams.items() if spec.budget_action == "stop")


def account_email(settings: StackSettings, logical: str, team: str | None = None) -> str:
    account_id = settings.naming.account_id(logical, team)
    return f"{account_id}@{settings.gcp_project}.iam.gserviceaccount.com"


def account_name(settings: StackSettings, email: str) -> str:
    """The account's IAM resource name (its allow policy's)."""
    return f"projects/{settings.gcp_project}/serviceAccounts/{email}"


def controller_enabled(settings: StackSettings) -> bool:
    return settings.controller is not None and settings.controller.enabled


def bootstrap_made(settings: StackSettings) -> bool:
    """Whether the bootstrap (scripts/bootstrap_team_projects.py, a platform stack's)
    makes the functions' accounts and custom roles; a standalone stack has none, so its
    plan declares the controller's itself, applied by whoever runs `pulumi up`."""
    return settings.team_projects is not None


def controller_account(settings: StackSettings) -> str:
    """The email the controller runs as: every stack that reads or grants to it (its
    own, a team stack granting it read on the team's objects) derives it here."""
    return account_email(settings, CONTROLLER_ACCOUNT)


def controller_build_account(settings: StackSettings) -> str:
    return account_email(settings, CONTROLLER_BUILD_ACCOUNT)


def runtime_account(settings: StackSettings, team: str) -> str:
    return account_email(settings, RUNTIME_ACCOUNT, team)


def build_account(settings: StackSettings, team: str) -> str:
    return account_email(settings, BUILD_ACCOUNT, team)


def accounts(settings: StackSettings, teams: list[str] | None = None) -> list[tuple[str, str]]:
    """(account id, display name) of every account the bootstrap makes in the host
    project for `teams` (default: every team, and the controller's when it is on)."""
    chosen = [t for t in stop_teams(settings) if teams is None or t in teams]
    made = [(settings.naming.account_id(logical, t), f"{what} of team {t}")
            for t in chosen for logical, what in ((RUNTIME_ACCOUNT, "tpu-stack budget stop"),
                                                  (BUILD_ACCOUNT, "tpu-stack budget stop build"))]
    if teams is None and controller_enabled(settings):
        made += [(settings.naming.account_id(logical), display)
                 for logical, display in CONTROLLER_ACCOUNTS]
    return made
