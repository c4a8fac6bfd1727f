"""Rules on `tpu-stack:ci`: the GitHub repository, refs, environments and pool."""

from __future__ import annotations

import re

from pydantic.alias_generators import to_camel

from model.settings.schema import NAMESPACE, CiSettings
from model.settings.suggest import Problems

_GITHUB_REPO_RE = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
# A branch name as it follows refs/heads/ (no quotes: it is written into a CEL literal).
_GITHUB_REF_NAME_RE = re.compile(r"^[A-Za-z0-9._/-]+$")
_ENVIRONMENT_RE = re.compile(r"^[A-Za-z0-9._-]+$")
# Workload identity pool and provider ids: 4-32 lowercase letters, digits, dashes
# (cloud.google.com/iam/docs/manage-workload-identity-pools-providers).
_POOL_ID_RE = re.compile(r"^[a-z0-9-]{4,32}$")


def ci_problems(ci: CiSettings, key: str = f"{NAMESPACE}:ci") -> Problems:
    if not _GITHUB_REPO_RE.match(ci.github_repository):
        yield (f"{key}.githubRepository", f"{ci.github_repository!r} is not owner/name")
    for field in ("github_repository_id", "github_repository_owner_id"):
        if not getattr(ci, field).isdigit():
            yield (f"{key}.{to_camel(field)}", f"{getattr(ci, field)!r} is not a number: GitHub's "
                                               f"numeric id (api.github.com/repos/<owner>/<name>: "
                                               f"`id`, `owner.id`)")
    if not _GITHUB_REF_NAME_RE.match(ci.deploy_branch):
        yield (f"{key}.deployBranch", f"{ci.deploy_branch!r} is not a branch name")
    if ci.deploy_environment is not None and not _ENVIRONMENT_RE.match(ci.deploy_environment):
        yield (f"{key}.deployEnvironment", f"{ci.deploy_environment!r}: letters, digits, "
                                           f"'.', '_' or '-'")
    for field in ("pool_id", "provider_id"):
        value = getattr(ci, field)
        if not _POOL_ID_RE.match(value) or value.startswith("gcp-"):
            yield (f"{key}.{to_camel(field)}", f"{value!r}: 4-32 lowercase letters, digits or "
                                               f"dashes, not starting with gcp-")
