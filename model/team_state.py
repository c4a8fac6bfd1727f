"""Where each team's Pulumi state may be written on a shared self-managed `gs://`
backend (docs/teams.md, "State"): pure, the IAM conditions TeamProject grants with.

Pulumi's DIY backend leaves access control to the bucket and keeps a project's
stacks side by side (pulumi/pulumi pkg/backend/diy, project layout, meta.yaml version 1):
- the checkpoint `.pulumi/stacks/<project>/<stack>.json`, or `.json.gz` / `.json.zst`
  when compressed (backend.go stackPath), and a `.bak` copy of each beside it;
- the tags file `.pulumi/stacks/<project>/<stack>.pulumi-tags` (stack_tags.go,
  stackTagsPath: StackBasePath() + ".pulumi-tags"), read on every preview and up since
  CLI 3.211 (pulumi/pulumi#21203);
- `.pulumi/history/<project>/<stack>/`, `.pulumi/backups/<project>/<stack>/`,
  `.pulumi/journal/<project>/<stack>/` (store.go, projectReferenceStore) and the locks
  `.pulumi/locks/organization/<project>/<stack>/` (lock.go, stackLockDir);
- `.pulumi/meta.yaml` (meta.go): `version: 1` for this layout. The legacy layout
  (version 0, or no meta.yaml beside existing stacks) keeps `.pulumi/stacks/<stack>.json`,
  which no condition here admits: `pulumi state upgrade` moves a bucket to the project
  layout (legacy_problem).
Cloud Storage supplies `resource.name` to IAM conditions, as
`projects/_/buckets/<bucket>/objects/<object>` (cloud.google.com/iam/docs/
conditions-resource-attributes; conditions need uniform bucket-level access on
the bucket), so one bucket can hold every stack and each team's deployer writes
its own stack's files only. Stack files are named exactly, never by prefix: a stack
name may hold dots (`team-a.json.x` is a stack name), so a prefix `team-a.json` would
reach another stack's files. Listing objects is a bucket-level permission a prefix
condition cannot narrow: names are visible, contents are not.
"""

from __future__ import annotations

PULUMI_PROJECT = "tpu-stack"  # Pulumi.yaml's name
DIY_ORGANIZATION = "organization"  # the DIY backend's only organization (store.go)


def team_stack(team: str) -> str:
    """A team's stack name, by convention (docs/teams.md: Pulumi.team-<team>.yaml)."""
    return f"team-{team}"


def object_name(bucket: str, path: str) -> str:
    return f"projects/_/buckets/{bucket}/objects/{path}"


# The checkpoint's names (plain, gzip, zstd) and the `.bak` copy of each, and the tags file.
CHECKPOINT_SUFFIXES = (".json", ".json.gz", ".json.zst")
STACK_FILE_SUFFIXES = (*CHECKPOINT_SUFFIXES, *(f"{s}.bak" for s in CHECKPOINT_SUFFIXES),
                       ".pulumi-tags")
# IAM allows at most 12 logical operators in a condition expression
# (cloud.google.com/iam/docs/conditions-overview, "Limits").
MAX_OPERATORS = 12


OUTPUTS_PREFIX = "tpu-stack/platform-outputs"  # outside .pulumi/: not the backend's


def outputs_object(platform_stack: str, team: str) -> str:
    """The object the platform writes a team's outputs to, in its state bucket: what the
    team stack reads instead of the platform's stack file (every team's outputs)."""
    return f"{OUTPUTS_PREFIX}/{platform_stack}/{team}.json"


def team_view(outputs: dict, team: str) -> dict | None:
    """The platform outputs a team stack consumes (components/team_stack.py), its own
    team's entry only; None for a team the platform does not serve (no object)."""
    if team not in (outputs.get("teams") or {}):
        return None
    entry = outputs["teams"][team]
    view = {"projectId": outputs.get("projectId"), "network": _team_network(outputs, entry),
            "teams": {team: entry}}
    if outputs.get("controller"):  # the platform's controller: it reads the team's manifest
        view["controller"] = outputs["controller"]
    return view


def _team_network(outputs: dict, entry: dict) -> dict | None:
    """The platform's network as the team sees it: its subnets in the team's own regions
    only, so a region another team adds leaves this team's object as it is (issue 45)."""
    network = outputs.get("network")
    if not isinstance(network, dict) or not isinstance(entry.get("subnets"), dict):
        return network
    subnets = network.get("subnets") or {}
    return {**network, "subnets": {region: link for region, link in subnets.items()
                                   if region in entry["subnets"]}}


def stack_files(bucket: str, stack: str) -> list[str]:
    """The exact resource names of `stack`'s own files beside its checkpoint."""
    return [object_name(bucket, f".pulumi/stacks/{PULUMI_PROJECT}/{stack}{suffix}")
            for suffix in STACK_FILE_SUFFIXES]


def stack_directories(bucket: str, stack: str) -> list[str]:
    """Resource-name prefixes of the stack's own directories (each ends with `/`)."""
    project = PULUMI_PROJECT
    return [object_name(bucket, path) for path in (
        f".pulumi/history/{project}/{stack}/",
        f".pulumi/backups/{project}/{stack}/",
        f".pulumi/journal/{project}/{stack}/",
        f".pulumi/locks/{DIY_ORGANIZATION}/{project}/{stack}/",
    )]


def write_condition(bucket: str, stack: str) -> str:
    """The stack's own files and directories, and nothing else."""
    clauses = [f"resource.name == '{name}'" for name in stack_files(bucket, stack)]
    clauses += [f"resource.name.startsWith('{prefix}')"
                for prefix in stack_directories(bucket, stack)]
    assert len(clauses) - 1 <= MAX_OPERATORS, "IAM's limit of logical operators"
    return " || ".join(clauses)


def read_condition(bucket: str, stacks: list[str], objects: tuple[str, ...] = ()) -> str:
    """The checkpoints of `stacks` (each as the CLI may name it), `objects` (paths in
    the bucket) and the backend's meta.yaml."""
    names = [object_name(bucket, f".pulumi/stacks/{PULUMI_PROJECT}/{stack}{suffix}")
             for stack in stacks for suffix in CHECKPOINT_SUFFIXES]
    names += [object_name(bucket, path) for path in objects]
    names.append(object_name(bucket, ".pulumi/meta.yaml"))
    assert len(names) - 1 <= MAX_OPERATORS, "IAM's limit of logical operators"
    return " || ".join(f"resource.name == '{name}'" for name in names)


def legacy_problem(bucket: str, meta_yaml: str | None, has_stacks: bool) -> str | None:
    """The refusal of a bucket still on the legacy DIY layout, with the step that moves
    it: meta.yaml's `version:` 0 (or none), or no meta.yaml beside existing stacks
    (meta.go: a missing meta.yaml on a non-empty bucket is version 0)."""
    if meta_yaml is None and not has_stacks:
        return None  # an empty bucket: the CLI starts it in the project layout
    version = 0
    for line in (meta_yaml or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "version" and value.strip().isdigit():
            version = int(value.strip())
    if version >= 1:
        return None
    return (f"gs://{bucket} holds Pulumi state in the legacy layout (.pulumi/stacks/<stack>.json, "
            f"meta.yaml version 0): no team's conditions admit it. Move it to the project layout "
            f"first: `pulumi login gs://{bucket} && pulumi state upgrade` (as an admin; every "
            f"stack of the bucket moves to .pulumi/stacks/<project>/<stack>.json)")
