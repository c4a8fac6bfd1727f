"""Where each team's Pulumi state may be written on a shared self-managed `gs://`
backend (docs/teams.md, "State"): pure, the IAM conditions TeamProject grants with.

Pulumi's DIY backend leaves access control to the bucket and keeps a project's
stacks side by side (pulumi/pulumi pkg/backend/diy/store.go, projectReferenceStore:
`.pulumi/stacks/<project>/<stack>.json` (also .json.gz, .json.zst, .json.bak),
`.pulumi/history/<project>/<stack>/`, `.pulumi/backups/<project>/<stack>/`,
`.pulumi/journal/<project>/<stack>/`; lock.go, stackLockDir:
`.pulumi/locks/organization/<project>/<stack>/`; meta.go: `.pulumi/meta.yaml`).
Cloud Storage supplies `resource.name` to IAM conditions, as
`projects/_/buckets/<bucket>/objects/<object>` (cloud.google.com/iam/docs/
conditions-resource-attributes; conditions need uniform bucket-level access on
the bucket), so one bucket can hold every stack and each team's deployer writes
its own stack's files only, and reads the platform's stack file, which its
StackReference reads (and the backend's meta.yaml). Listing objects is a
bucket-level permission a prefix condition cannot narrow: names are visible,
contents are not.
"""

from __future__ import annotations

PULUMI_PROJECT = "tpu-stack"  # Pulumi.yaml's name
DIY_ORGANIZATION = "organization"  # the DIY backend's only organization (store.go)


def team_stack(team: str) -> str:
    """A team's stack name, by convention (docs/teams.md: Pulumi.team-<team>.yaml)."""
    return f"team-{team}"


def object_name(bucket: str, path: str) -> str:
    return f"projects/_/buckets/{bucket}/objects/{path}"


def stack_prefixes(bucket: str, stack: str) -> list[str]:
    """Resource-name prefixes of every object the DIY backend writes for `stack`."""
    project = PULUMI_PROJECT
    return [object_name(bucket, path) for path in (
        f".pulumi/stacks/{project}/{stack}.json",
        f".pulumi/history/{project}/{stack}/",
        f".pulumi/backups/{project}/{stack}/",
        f".pulumi/journal/{project}/{stack}/",
        f".pulumi/locks/{DIY_ORGANIZATION}/{project}/{stack}/",
    )]


def write_condition(bucket: str, stack: str) -> str:
    """The stack's own files (five prefixes, four ||: IAM allows 12 logical operators)."""
    return " || ".join(f"resource.name.startsWith('{prefix}')"
                       for prefix in stack_prefixes(bucket, stack))


def read_condition(bucket: str, stacks: list[str]) -> str:
    """The stack files of `stacks` and the backend's meta.yaml."""
    names = [object_name(bucket, f".pulumi/stacks/{PULUMI_PROJECT}/{stack}.json")
             for stack in stacks]
    clauses = [f"resource.name.startsWith('{name}')" for name in names]
    clauses.append(f"resource.name == '{object_name(bucket, '.pulumi/meta.yaml')}'")
    return " || ".join(clauses)
