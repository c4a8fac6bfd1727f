"""README.md says what the code does: the deployer roles, the Pythons CI proves."""

from __future__ import annotations

import re

from components.archive import REPO_ROOT
from components.ci import DEPLOYER_ROLES

README = (REPO_ROOT / "README.md").read_text()


def test_the_deployer_roles_are_exactly_deployer_roles() -> None:
    listed = README.split("<!-- deployer-roles -->")[1].split("<!-- /deployer-roles -->")[0]
    assert re.findall(r"`(roles/[^`]+)`", listed) == list(DEPLOYER_ROLES)


def test_the_pythons_readme_claims_are_the_ones_ci_runs() -> None:
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    infra = re.search(r"^INFRA_MINIMUM=(\S+)", ci, re.M)[1]
    image = re.search(r"^IMAGE_PYTHON=(\S+)", ci, re.M)[1]
    assert f"Python {infra} or newer for the infra side" in README
    assert f"run on Python {image}, the Python of TPU VM images" in README
    assert "3.10+" not in README
