"""A reviewer is told when a stack creates projects or turns its project into a Shared
VPC host (issue 29 item 6): the plan's warnings, the same text the program logs."""

from __future__ import annotations

from components.stack_config import file_config
from model.settings.load import load_settings
from model.warnings import project_warnings as stack_warnings
from tests.infra.stack_fixtures import as_cli, config


def test_a_single_team_stack_that_adopts_its_project_has_no_project_warning() -> None:
    assert stack_warnings(load_settings(as_cli(config()), "test")) == []


def test_a_stack_that_creates_its_project_says_where_and_what_it_takes() -> None:
    settings = load_settings(as_cli(config(tpu_stack_project={
        "create": True, "billingAccount": "01AB23-45CD67-89EF01", "folderId": "1234"})), "test")
    assert stack_warnings(settings) == [
        "the stack CREATES project acme-ml-test in folder 1234, billed to 01AB23-45CD67-89EF01: "
        "the deployer needs roles/resourcemanager.projectCreator there and roles/billing.user "
        "on the account; `pulumi destroy` will not delete it (protect, deletion_policy PREVENT)"]


def test_a_platform_stack_says_it_makes_a_shared_vpc_host_of_the_bootstrapped_team_projects(
) -> None:
    [warning] = stack_warnings(load_settings(file_config("platform"), "platform"))
    assert warning.startswith(
        "the stack turns project acme-ml-shared into a Shared VPC HOST project and attaches "
        "one project per team (acme-ml-shared-nlp, acme-ml-shared-vision) as its service "
        "projects: the bootstrap step (scripts/bootstrap_team_projects.py, an admin) must "
        "have made them first")
    assert "CREATES" not in warning  # the platform's deployer makes no project (issue 26)


def test_a_team_stack_creates_no_project() -> None:
    assert stack_warnings(load_settings(file_config("team-vision"), "team-vision")) == []
