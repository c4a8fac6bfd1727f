"""The training package, uploaded to the artifacts bucket under its sha256."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_gcp as gcp

from components.archive import REPO_ROOT, Archive, build_archive

TYPE = "tpu-stack:index:TrainingPackage"
PACKAGE_PREFIX = "packages/"
DEFAULT_STAGING = REPO_ROOT / ".cache" / "packages"


@dataclass(frozen=True)
class PackageArgs:
    bucket: str  # the artifacts bucket's name
    archive: Archive | None = None  # built from training/ when not given
    staging_dir: Path = DEFAULT_STAGING


def stage(archive: Archive, staging_dir: Path) -> Path:
    """Write the archive where Pulumi's FileAsset can read it (once per digest)."""
    staging_dir.mkdir(parents=True, exist_ok=True)
    path = staging_dir / archive.filename
    if not path.exists():
        path.write_bytes(archive.data)
    return path


class TrainingPackage(pulumi.ComponentResource):
    """`training/` as a deterministic archive, named by its sha256, so a code
    change is a new object and a new metadata value on the nodes: an in-place
    update, never a node replacement."""

    uri: str
    sha256: str
    object: gcp.storage.BucketObject

    def __init__(self, name: str, args: PackageArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        archive = args.archive or build_archive()
        object_name = PACKAGE_PREFIX + archive.filename
        self.sha256 = archive.sha256
        self.uri = f"gs://{args.bucket}/{object_name}"
        self.object = gcp.storage.BucketObject(
            "archive",
            bucket=args.bucket,
            name=object_name,
            source=pulumi.FileAsset(str(stage(archive, args.staging_dir))),
            content_type="application/gzip",
            metadata={"sha256": archive.sha256},
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"uri": self.uri, "sha256": self.sha256})
