"""A team stack hands its platform's controller its desired state (issue 43; docs/design.md,
"The controller").

The controller's bucket is the platform's artifacts bucket, which a team's deployer
cannot write; so a team stack writes its manifest (model/manifest.py, the same format)
into its own artifacts bucket, at `controller/manifests/<stack>.json`, and grants the
platform's controller account read on that object alone; where its nodes have idle stops,
also read on its logs bucket's `status/` objects and the listing there (the agents' status,
ops/controller/agents.py). The platform's manifest names where each team's manifest is
(`teamManifests`, model/manifest.py team_manifest_ref), so both sides derive the place
from model/naming.py.

Which account: the platform's outputs object for the team (model/team_state.py team_view)
carries `controller.serviceAccount` while the platform runs a controller, read at
program time as the budget hold is (components/budget_hold.py team_stack_hold), so a
team stack whose platform runs none declares nothing here (a grant to an account that
does not exist fails). On Pulumi Cloud (a StackReference, no outputs object) it is not
read: nothing is declared, and the controller reports the manifest missing.
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from components.team_stack import read_outputs_object
from components.teams import TeamSpace
from model import team_state
from model.fleet import target_for
from model.manifest import manifest_json, object_name, status_buckets
from model.roles import CONTROLLER_READ_ROLE
from model.settings.schema import StackSettings

# objects.get and objects.list (cloud.google.com/storage/docs/access-control/iam-roles).
STATUS_PREFIX = "status/"  # components/platform.py: <logs bucket>/status/<node id>/


def platform_controller(settings: StackSettings) -> str | None:
    """The email of the platform's controller account, as its outputs object for this
    team says; None without one (no controller, Pulumi Cloud, no object yet)."""
    try:
        email = read_outputs_object(settings)["controller"]["serviceAccount"]
    except (KeyError, TypeError):
        return None
    return email if isinstance(email, str) and email else None


def declare_team_manifest(settings: StackSettings, space: TeamSpace,
                          opts: pulumi.ResourceOptions) -> gcp.storage.BucketObject | None:
    """The team stack's manifest and the controller's read grants; None (nothing
    declared) while its platform runs no controller."""
    email = platform_controller(settings)
    if email is None:
        return None
    member = f"serviceAccount:{email}"
    artifacts = space.buckets.buckets["artifacts"].name
    name = object_name(settings.stack)
    buckets = status_buckets(settings)
    text = manifest_json(target_for(settings), status_buckets=buckets)
    manifest = gcp.storage.BucketObject(
        "controller-manifest", bucket=artifacts, name=name, content=text,
        content_type="application/json", opts=opts)
    # IAM conditions see an object as projects/_/buckets/<b>/objects/<name>
    # (cloud.google.com/iam/docs/conditions-resource-attributes; model/team_state.py).
    gcp.storage.BucketIAMMember(
        "controller-reads-manifest", bucket=artifacts, role=CONTROLLER_READ_ROLE, member=member,
        condition=gcp.storage.BucketIAMMemberConditionArgs(
            title="the team stack's controller manifest",
            expression=artifacts.apply(
                lambda b: f'resource.name == "{team_state.object_name(b, name)}"')),
        opts=opts)
    if buckets:
        logs = space.buckets.buckets["logs"].name
        gcp.storage.BucketIAMMember(
            "controller-reads-status", bucket=logs, role=CONTROLLER_READ_ROLE, member=member,
            condition=gcp.storage.BucketIAMMemberConditionArgs(
                title="the agents' status objects",
                # objects.list is checked on the bucket itself (components/controller.py).
                expression=logs.apply(lambda b: (
                    f'resource.type == "storage.googleapis.com/Bucket" || '
                    f'resource.name.startsWith("{team_state.object_name(b, STATUS_PREFIX)}")'))),
            opts=opts)
    return manifest
