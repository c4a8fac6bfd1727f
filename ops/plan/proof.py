"""The permission proof of an offline plan (policy/permissions.py): who applies the stack,
with which grants, and what GCP would refuse them (docs/teams.md, "The permission proof").

Who applies what:
- a stack with `tpu-stack:ci`: its CI deployer, with the grants the plan gives it; the
  deployer's own identity (the `ci` CiIdentity: pool, provider, accounts, custom role and
  their grants) is an admin's first `up` (components/ci.py, BOOTSTRAP_ROLES), not proved;
- a platform stack (`tpu-stack:teams`): its deployer (`teamProjects.deployer`, else the
  CI deployer), with the bootstrap's grants (model/bootstrap.py) and the plan's; the
  teams' projects are in `teamProjects.folderId`, made there by the bootstrap;
- a team stack: the team's deployer the platform declares, with the platform plan's
  grants (this repo's Pulumi.<platform>.yaml, planned offline) and the team plan's;
- a single-team stack without `tpu-stack:ci`: whoever runs `up` (a person): not proved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from components.stack_config import settings_for
from model.bootstrap import (
    UNKNOWN_HOST_PARENT,
    Grant,
    custom_roles,
    deployer_grants,
    function_account_grants,
    quota_contact_grant,
)
from model.pulumi_types import COMPONENT_CI_IDENTITY
from model.settings.schema import StackSettings
from model.shared_reservations import owners_allowed
from ops.plan import platform_facts
from ops.plan.mock_engine import ProgramRun, planned_stack_run
from policy.acting import Sharing, prove_acting
from policy.iam import Binding, IamModel
from policy.permissions import Applier, Finding, prove


@dataclass
class Proof:
    identity: str | None  # None: the stack names no deployer
    findings: list[Finding] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    why_unproved: str | None = None

    def lines(self) -> list[str]:
        if self.identity is None:
            return [f"permission proof: not run ({self.why_unproved})"]
        head = (f"permission proof: {self.identity} may apply every resource"
                if not self.findings else
                f"permission proof: {len(self.findings)} refusal(s) for {self.identity}")
        lines = [head, *(f"  {finding.line()}" for finding in self.findings)]
        if self.unchecked:  # a type without a row in policy/permissions.py TABLE
            lines.append(f"  not proved (no row in policy/permissions.py): "
                         f"{', '.join(self.unchecked)}")
        return lines


def plan_proof(settings: StackSettings, run: ProgramRun,
               extra_grants: tuple[Grant, ...] = ()) -> Proof:
    """The proof of `run`, the plan of `settings`' stack (`extra_grants`: tests)."""
    resources = [_as_dict(r) for r in run.registrations]
    runs = [run]
    grants: list[Grant] = list(extra_grants)
    owner = _platform_settings(settings.platform_stack or "") if settings.is_team_stack \
        else settings  # the settings that declare the bootstrap's roles and sharing
    roles = {role.name: role.permissions for role in custom_roles(owner)}
    sharing = Sharing(tuple(owner.shared_reservations), tuple(owners_allowed(owner)))
    if settings.is_team_stack:
        platform = planned_stack_run(settings.platform_stack or "")
        runs.insert(0, platform)
        entry = platform.outputs.get("teams", {}).get(settings.team, {})
        deployer = (entry.get("deployer") or {}).get("serviceAccount")
        if deployer is None:
            return Proof(None, why_unproved=f"the platform declares no deployer for team "
                                            f"{settings.team} (tpu-stack:teams.{settings.team}.ci)")
    else:
        deployer = _stack_deployer(settings, run)
        if deployer is None:
            return Proof(None, why_unproved="no tpu-stack:ci and no teamProjects.deployer: "
                                            "whoever runs `pulumi up` applies it")
        if settings.teams and settings.team_projects and settings.team_projects.folder_id:
            grants += deployer_grants(settings, deployer)
            grants += function_account_grants(settings, deployer)
            contact = quota_contact_grant(settings)
            grants += [contact] if contact else []
    model = IamModel.of(_as_dict(r) for plan in runs for r in plan.registrations)
    model.custom_roles.update({name: frozenset(p) for name, p in roles.items()})
    _add_grants(model, grants)
    _place_projects(model, settings, runs)
    applier = Applier(f"serviceAccount:{deployer}", _admin_applied(settings, run),
                      frozenset({f"projects/{settings.gcp_project}"}))
    findings = prove(resources, model, applier) + prove_acting(resources, model, applier, roles,
                                                              sharing)
    return Proof(applier.identity, findings, sorted(set(applier.unchecked)))


def _platform_settings(reference: str) -> StackSettings:
    stack = reference.rsplit("/", 1)[-1]
    # The same read a team's plan makes of its platform; an unreadable one raises its error.
    return platform_facts.read_platform(stack) or settings_for(stack)


def _stack_deployer(settings: StackSettings, run: ProgramRun) -> str | None:
    if settings.team_projects and settings.team_projects.deployer:
        return settings.team_projects.deployer
    return run.outputs.get("ciDeployerServiceAccount") if settings.ci else None


def _admin_applied(settings: StackSettings, run: ProgramRun) -> frozenset[str]:
    """The stack's own CI identity and everything under it (an admin's first `up`)."""
    if not settings.ci:
        return frozenset()
    by_urn = run.by_urn()
    roots = {r.urn for r in run.registrations if r.type == COMPONENT_CI_IDENTITY and r.name == "ci"}

    def under(urn: str | None) -> bool:
        while urn:
            if urn in roots:
                return True
            urn = by_urn[urn].parent if urn in by_urn else None
        return False

    return frozenset(r.urn for r in run.registrations if under(r.urn))


def _add_grants(model: IamModel, grants: list[Grant]) -> None:
    for grant in grants:
        model.bindings.setdefault(grant.resource, []).append(
            Binding(grant.resource, grant.role, frozenset({grant.member}), grant.condition))


def _place_projects(model: IamModel, settings: StackSettings, runs: list[ProgramRun]) -> None:
    """Team projects sit in the teams' folder (the bootstrap made them there), the host
    project wherever it lives (the bootstrap's --host-parent)."""
    projects = settings.team_projects
    folder = f"folders/{projects.folder_id}" if projects and projects.folder_id else None
    for plan in runs if folder else ():  # a team stack's deployer holds nothing there
        for entry in (plan.outputs.get("teams") or {}).values():
            if entry.get("projectId"):
                model.parents.setdefault(f"projects/{entry['projectId']}", folder)
    model.parents.setdefault(f"projects/{settings.gcp_project}", UNKNOWN_HOST_PARENT)


def _as_dict(r: Any) -> dict[str, Any]:
    return {"type": r.type, "name": r.name, "urn": r.urn, "custom": r.custom,
            "inputs": r.inputs, "outputs": r.outputs}
