"""The stack's buckets: data, artifacts (code), checkpoints and logs."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from model.naming import PURPOSES, Naming
from model.pulumi_types import COMPONENT_TRAINING_BUCKETS
from model.settings.schema import StorageSettings

TYPE = COMPONENT_TRAINING_BUCKETS

# docs/design.md: prod data is never lost by a command. Data and checkpoints are
# what a team cannot rebuild from the repository.
PRECIOUS = ("data", "checkpoints")
VERSIONED = ("artifacts", "checkpoints")
# A package object is named by its sha256, so every code change is a new name:
# `num_newer_versions` counts newer versions of the *same* name and never matches
# (cloud.google.com/storage/docs/lifecycle#numnewerversions). The old package goes
# when Pulumi replaces its BucketObject (a new name replaces it: after the nodes'
# metadata points at the new one); in this versioned bucket that leaves a
# noncurrent version, which the rule below deletes this many days later. The
# package the nodes reference is the live version, and no rule touches live ones.
PACKAGE_NONCURRENT_DAYS = 30


@dataclass(frozen=True)
class BucketsArgs:
    project_id: pulumi.Input[str]
    naming: Naming
    settings: StorageSettings
    labels: dict[str, str]
    team: str | None = None
    # A team's own buckets are a subset (docs/teams.md): the shared data stays
    # the platform's.
    purposes: tuple[str, ...] = PURPOSES


def lifecycle_rules(purpose: str, settings: StorageSettings
                    ) -> list[gcp.storage.BucketLifecycleRuleArgs]:
    delete = gcp.storage.BucketLifecycleRuleActionArgs(type="Delete")
    rule = gcp.storage.BucketLifecycleRuleArgs
    condition = gcp.storage.BucketLifecycleRuleConditionArgs
    if purpose == "checkpoints":
        # Overwritten checkpoints stay recoverable for a while, then go.
        return [rule(action=delete, condition=condition(
            days_since_noncurrent_time=settings.checkpoint_versions_days, with_state="ARCHIVED"))]
    if purpose == "artifacts":
        return [rule(action=delete, condition=condition(
            days_since_noncurrent_time=PACKAGE_NONCURRENT_DAYS, with_state="ARCHIVED"))]
    if purpose == "logs":
        return [rule(action=delete, condition=condition(age=settings.log_retention_days))]
    return []


class TrainingBuckets(pulumi.ComponentResource):
    """Four buckets with uniform bucket-level access and public access
    prevention enforced; versioned where overwrites happen; data and
    checkpoints protected unless the stack opts out (dev only, settings)."""

    buckets: dict[str, gcp.storage.Bucket]
    names: dict[str, str]

    def __init__(self, name: str, args: BucketsArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        s = args.settings
        self.names = {p: args.naming.bucket(p, args.team) for p in args.purposes}
        self.buckets = {}
        for purpose in args.purposes:
            protect = s.protect and purpose in PRECIOUS
            self.buckets[purpose] = gcp.storage.Bucket(
                # Pulumi URNs leave out the parent's name: a team's children
                # carry the team so that several teams' buckets stay distinct.
                f"{args.team}-{purpose}" if args.team else purpose,
                name=self.names[purpose],
                project=args.project_id,
                location=s.location,
                uniform_bucket_level_access=True,
                public_access_prevention="enforced",
                versioning=gcp.storage.BucketVersioningArgs(enabled=purpose in VERSIONED),
                lifecycle_rules=lifecycle_rules(purpose, s),
                force_destroy=s.force_destroy,
                labels={**args.labels, "purpose": purpose},
                opts=pulumi.ResourceOptions(parent=self, protect=protect),
            )
        self.register_outputs({p: self.uri(p) for p in args.purposes})

    def uri(self, purpose: str) -> str:
        return f"gs://{self.names[purpose]}"
