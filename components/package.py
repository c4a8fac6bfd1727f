"""The training package, uploaded to the artifacts bucket under its sha256."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_gcp as gcp

from model.archive import REPO_ROOT, Archive, build_archive
from model.pulumi_types import COMPONENT_TRAINING_PACKAGE

TYPE = COMPONENT_TRAINING_PACKAGE
PACKAGE_PREFIX = "packages/"
# How many hex digits of a sha256 a logical name carries (docs/design.md, contract C1).
HASH_IN_NAME = 16
DEFAULT_STAGING = REPO_ROOT / ".cache" / "packages"


@dataclass(frozen=True)
class PackageArgs:
    bucket: str  # the artifacts bucket's name
    # The bucket resource's `name` output, which the object takes: a replaced bucket's
    # dependents are then replaced with it, deleted before it and created in the new
    # one (pulumi/pulumi step_generator.go calculateDependentReplacements, through the
    # propertyDependencies an Output carries). A plain string would leave the objects
    # behind: the bucket's delete then fails (not empty) or destroys them for good.
    bucket_name: pulumi.Input[str] | None = None
    archive: Archive | None = None  # built from training/ when not given
    staging_dir: Path = DEFAULT_STAGING


def stage(archive: Archive, staging_dir: Path) -> Path:
    """Write the archive where Pulumi's FileAsset can read it (once per digest). Written
    beside it and renamed into place, so a process planning at the same time (tests on
    several pytest-xdist workers) never reads a half-written archive."""
    staging_dir.mkdir(parents=True, exist_ok=True)
    path = staging_dir / archive.filename
    if not path.exists():
        partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        partial.write_bytes(archive.data)
        os.replace(partial, path)
    return path


class TrainingPackage(pulumi.ComponentResource):
    """`training/` as a deterministic archive, named by its sha256. A code change is
    a new object under a new logical name (`archive-<sha16>`), never a replacement:
    the engine creates it, then the nodes' new releases (components/tpu_node.py),
    and deletes the old object only after every create and update (pulumi/pulumi
    pkg/resource/deploy/deployment_executor.go, performPostSteps: GenerateDeletes
    runs once the program has registered everything). A replacement would delete
    first: pulumi-gcp autonames BucketObject.name (provider/resources.go,
    SetAutonaming), and the bridge makes a resource whose autonamed property is set
    explicitly delete-before-replace (pulumi-terraform-bridge pkg/tfbridge/provider.go
    Diff and schema.go nameRequiresDeleteBeforeReplace; pulumi-terraform#383/#465),
    even when the name changes: pulumi-terraform-bridge#532's UniqueNameFields, which
    would create first then, is set only for compute InstanceTemplate in pulumi-gcp."""

    uri: str
    sha256: str
    bucket: str
    bucket_name: pulumi.Input[str]  # what objects in the package's bucket take
    object: gcp.storage.BucketObject

    def __init__(self, name: str, args: PackageArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        archive = args.archive or build_archive()
        object_name = PACKAGE_PREFIX + archive.filename
        self.sha256 = archive.sha256
        self.bucket = args.bucket
        self.bucket_name = args.bucket if args.bucket_name is None else args.bucket_name
        self.uri = f"gs://{args.bucket}/{object_name}"
        self.object = gcp.storage.BucketObject(
            f"archive-{archive.sha256[:HASH_IN_NAME]}",
            bucket=args.bucket if args.bucket_name is None else args.bucket_name,
            name=object_name,
            source=pulumi.FileAsset(str(stage(archive, args.staging_dir))),
            content_type="application/gzip",
            metadata={"sha256": archive.sha256},
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"uri": self.uri, "sha256": self.sha256})
