"""The runtime service account a stack's TPU nodes run as, and what it may do."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from model.naming import Naming
from model.pulumi_types import COMPONENT_RUNTIME_IDENTITY
from model.roles import (
    BUCKET_METADATA_ROLE,
    BUCKET_ROLES,
    MEMBER_BUCKET_ROLES,
    PROJECT_ROLES,
)

TYPE = COMPONENT_RUNTIME_IDENTITY


@dataclass(frozen=True)
class IdentityArgs:
    project_id: pulumi.Input[str]
    naming: Naming
    buckets: dict[str, pulumi.Input[str]]  # purpose → bucket name
    team: str | None = None
    # A team's members (group:…, user:…); a list, or a platform stack's output.
    members: pulumi.Input[Sequence[str]] | None = None
    # A team's account, which the platform declares in the team's project with its
    # project roles and who may act as it (components/teams.py, TeamProject): here
    # only its grants on the buckets.
    email: pulumi.Input[str] | None = None


class RuntimeIdentity(pulumi.ComponentResource):
    """A service account with bucket-scoped grants and the few project roles a
    job needs. No keys: on the node it is the VM's identity through the
    metadata server."""

    account: gcp.serviceaccount.Account
    email: pulumi.Output[str]
    member: pulumi.Output[str]

    def __init__(self, name: str, args: IdentityArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        # Pulumi URNs leave out the parent's name: a team's children carry the team.
        prefix = f"{args.team}-" if args.team else ""
        if args.email is None:
            account_id = args.naming.account_id("runtime", args.team)
            self.account = gcp.serviceaccount.Account(
                f"{prefix}runtime",
                account_id=account_id,
                display_name=f"tpu-stack runtime ({account_id})",
                project=args.project_id,
                opts=child,
            )
            self.email = self.account.email
        else:
            self.email = pulumi.Output.from_input(args.email)
        self.member = self.email.apply(lambda email: f"serviceAccount:{email}")
        # What a node's job needs before it boots: it waits for these, not for
        # the whole component.
        self.grants: list[pulumi.CustomResource] = []
        for purpose, bucket in args.buckets.items():
            for role in (BUCKET_ROLES[purpose], BUCKET_METADATA_ROLE):
                self.grants.append(gcp.storage.BucketIAMMember(
                    f"{prefix}{purpose}-{role.rsplit('.', 1)[-1]}",
                    bucket=bucket,
                    role=role,
                    member=self.member,
                    opts=child,
                ))
        for role in PROJECT_ROLES if args.email is None else ():
            self.grants.append(gcp.projects.IAMMember(
                prefix + role.split("/", 1)[1].replace(".", "-"),
                project=args.project_id,
                role=role,
                member=self.member,
                opts=child,
            ))
        if args.members is not None:
            self._grant_members(args, prefix, child)
        self.register_outputs({"email": self.email})

    def _grant_members(self, args: IdentityArgs, prefix: str,
                       child: pulumi.ResourceOptions) -> None:
        """Authoritative bindings: the stack owns these buckets, so the listed
        members are exactly who holds these roles (who may act as a team's account
        the platform's TeamProject binds)."""
        for purpose, role in MEMBER_BUCKET_ROLES.items():
            gcp.storage.BucketIAMBinding(
                f"{prefix}members-{purpose}-{role.rsplit('.', 1)[-1]}",
                bucket=args.buckets[purpose],
                role=role,
                members=args.members,
                opts=child,
            )
