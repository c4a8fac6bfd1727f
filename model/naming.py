"""Every GCP name tpu-stack makes, derived from project, stack and logical name.

Names are made here and only here, so the rules GCP enforces live in one place.
A derived name that would be too long keeps a readable prefix and ends with a
short hash of the full name, so it stays unique and stable.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

# A logical name in the stack config (node, job, team): short, DNS-like.
LOGICAL_NAME_RE = re.compile(r"^[a-z]([a-z0-9-]{0,18}[a-z0-9])?$")
LOGICAL_NAME_RULE = "1-20 characters: lowercase letters, digits and dashes, starting with a letter"

# cloud.google.com/resource-manager/docs/labels-overview: keys and values at most
# 63 characters of lowercase letters, digits, '_' and '-'; keys start with a letter.
_LABEL_MAX = 63
_LABEL_BAD = re.compile(r"[^a-z0-9_-]")
# cloud.google.com/storage/docs/buckets#naming: 3-63 characters of lowercase
# letters, digits, '-', '_' and '.', starting and ending with a letter or digit;
# no "goog" prefix and no "google" inside.
_BUCKET_MAX = 63
# cloud.google.com/iam/docs/service-accounts-create: account ids are 6-30
# characters, [a-z]([-a-z0-9]*[a-z0-9]).
_ACCOUNT_MIN, _ACCOUNT_MAX = 6, 30
# RFC 1035 names (networks, subnets, firewalls, TPU node ids): at most 63.
_RFC1035_MAX = 63
# cloud.google.com/iam/docs/workload-identity-federation: pool and provider ids
# are 4-32 characters of lowercase letters, digits and dashes.
_POOL_ID_MIN, _POOL_ID_MAX = 4, 32
# cloud.google.com/iam/docs/reference/rest/v1/projects.roles/create: a custom role
# id is 3-64 letters, digits, '_' and '.'; ids are per project, so two stacks in
# one project need their own (a deleted one stays reserved: 7 days soft-deleted).
_ROLE_ID_MIN, _ROLE_ID_MAX = 3, 64
_ROLE_ID_BAD = re.compile(r"[^A-Za-z0-9_.]")
_LOG_METRIC_MAX = 100
_HASH_LEN = 6
_PROJECT_MAX = 30

MANAGED_BY = "pulumi"
PROJECT_NAME = "tpu-stack"


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:_HASH_LEN]


def fit(name: str, limit: int) -> str:
    """`name` itself when it fits in `limit`, else a prefix plus a stable hash."""
    if len(name) <= limit:
        return name
    prefix = name[: limit - _HASH_LEN - 1].rstrip("-_.")
    return f"{prefix}-{_short_hash(name)}"


def _slug(text: str) -> str:
    return re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-")


def label_value(text: str) -> str:
    return fit(_LABEL_BAD.sub("-", text.lower()), _LABEL_MAX)


@dataclass(frozen=True)
class Naming:
    """Names for one stack of one project; `team` prefixes what a team owns."""

    project: str
    stack: str

    def _base(self, logical: str, team: str | None) -> str:
        parts = [self.stack, team, logical] if team else [self.stack, logical]
        return _slug("-".join(parts))

    def tpu_node(self, logical: str, team: str | None = None) -> str:
        """The TPU node id (RFC 1035): `<stack>[-<team>]-<node>`."""
        return fit(_rfc1035(self._base(logical, team)), _RFC1035_MAX)

    def queued_resource(self, logical: str, team: str | None = None) -> str:
        return fit(_rfc1035(self._base(logical, team) + "-qr"), _RFC1035_MAX)

    def network_resource(self, logical: str) -> str:
        """Networks, subnets, firewall rules: `<stack>-<logical>`."""
        return fit(_rfc1035(self._base(logical, None)), _RFC1035_MAX)

    def cloud_function(self, logical: str, team: str | None = None) -> str:
        """A Cloud Run function or Pub/Sub topic id: `<stack>[-<team>]-<logical>`,
        RFC 1035, at most 63 (cloud.google.com/functions/docs/reference/rest/v2/
        projects.locations.functions: "lower case letters, digits and hyphens"; Pub/Sub
        topics allow more)."""
        return fit(_rfc1035(self._base(logical, team)), _RFC1035_MAX)

    def log_metric(self, logical: str, team: str | None = None) -> str:
        """A log-based metric id: `<stack>[-<team>]-<logical>`, at most 100 characters
        of letters, digits and _-.,+!*',()%/ (cloud.google.com/logging/docs/reference/
        v2/rest/v2/projects.metrics, LogMetric.name)."""
        return fit(self._base(logical, team), _LOG_METRIC_MAX)

    # ---- Cloud Monitoring dashboards (issue 46): ids fixed here, so `tpuctl status` knows
    # each dashboard's console link offline. The Dashboard API takes the id in the
    # dashboard's `name` (projects/<p>/dashboards/<id>; its CreateDashboardRequest.parent
    # "must match the dashboard resource name": google-cloud-monitoring-dashboards 2.22,
    # types/dashboards_service.py). The ids' character rule is not in a stored source:
    # RFC 1035 (lowercase letters, digits, dashes, at most 63) is assumed to be accepted.

    def dashboard_id(self, team: str | None = None) -> str:
        """A team's dashboard in its own project, `tpu-stack-team-<team>` (one per team
        project, whichever stack declares its nodes), or the stack's dashboard in its
        own project, `tpu-stack-<stack>` (a platform's fleet, a standalone stack's own)."""
        scope = f"team-{team}" if team else self.stack
        return fit(_rfc1035(_slug(f"{PROJECT_NAME}-{scope}")), _RFC1035_MAX)

    def own_dashboard_id(self) -> str:
        """A platform's dashboard of its own nodes (beside its fleet's), with own alerts."""
        return fit(_rfc1035(_slug(f"{PROJECT_NAME}-{self.stack}-own")), _RFC1035_MAX)

    def node_prefix(self, team: str | None = None) -> str:
        """What every node id of `team` (None: the stack's own) starts with."""
        return self._base("", team) + "-"

    def bucket(self, purpose: str, team: str | None = None) -> str:
        """Globally unique bucket name: `<project>-<stack>[-<team>]-<purpose>`."""
        name = _slug(f"{self.project}-{self._base(purpose, team)}")
        name = name.replace("google", "g00gle")
        if name.startswith("goog"):
            name = "b-" + name
        return fit(name, _BUCKET_MAX)

    def team_project(self, team: str) -> str:
        """A team's project id: `<platform project>-<team>`, 6-30 characters
        (cloud.google.com/resource-manager/docs/creating-managing-projects)."""
        return fit(f"{self.project}-{team}", _PROJECT_MAX)

    def account_id(self, logical: str, team: str | None = None) -> str:
        """Service account id: 6-30 chars, `<stack>[-<team>]-<logical>`."""
        return fit(_padded(_rfc1035(self._base(logical, team)), _ACCOUNT_MIN), _ACCOUNT_MAX)

    def pool_id(self, logical: str) -> str:
        """Workload identity pool or provider id: 4-32 characters."""
        return fit(_padded(_rfc1035(self._base(logical, None)), _POOL_ID_MIN), _POOL_ID_MAX)

    def custom_role_id(self, logical: str) -> str:
        """Project custom role id: `<stack>_<logical>`, `-` written `_` (3-64 characters)."""
        name = _ROLE_ID_BAD.sub("_", f"{self.stack}_{logical}")
        if len(name) <= _ROLE_ID_MAX:
            return name.ljust(_ROLE_ID_MIN, "_")
        return f"{name[: _ROLE_ID_MAX - _HASH_LEN - 1]}_{_short_hash(name)}"

    def labels(self, component: str, team: str | None = None,
               extra: dict[str, str] | None = None) -> dict[str, str]:
        """The labels every resource carries (docs/design.md, "Conventions")."""
        labels = {
            "stack": label_value(self.stack),
            "team": label_value(team or "platform"),
            "component": label_value(component),
            "managed-by": MANAGED_BY,
        }
        for key, value in (extra or {}).items():
            labels[key] = label_value(value)
        return labels


def _padded(name: str, minimum: int) -> str:
    """Names below GCP's minimum length get a readable suffix."""
    return name if len(name) >= minimum else f"{name}-id".ljust(minimum, "0")


def _rfc1035(name: str) -> str:
    if not name or not name[0].isalpha():
        name = "x-" + name
    return name.rstrip("-")


def label_key_problem(key: str) -> str | None:
    if not re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", key):
        return (f"{key!r} is not a label key: 1-63 lowercase letters, digits, '_' or '-', "
                f"starting with a letter")
    return None


def label_value_problem(value: str) -> str | None:
    if not re.fullmatch(r"[a-z0-9_-]{0,63}", value):
        return f"{value!r} is not a label value: 0-63 lowercase letters, digits, '_' or '-'"
    return None


PURPOSES = ("data", "artifacts", "checkpoints", "logs")


def candidate_request(queued_id: str, position: int) -> str:
    """The queued resource id of a fallback node's candidate `position` (1-based): the
    node's own id for the first, `<id>-c<position>` for the others, so two candidates in
    one zone never share a request name (issue 43, defect 1). The node id inside every
    request stays the same: the agent's contract does not change with the candidate."""
    if position <= 1:
        return queued_id
    return fit(_rfc1035(f"{queued_id}-c{position}"), _RFC1035_MAX)


CONSOLE = "https://console.cloud.google.com"


def dashboard_url(project: str, dashboard_id: str, node_id: str | None = None) -> str:
    """The Cloud Console page of a dashboard; with `node_id`, its `node_id` dashboard
    filter set to the node (`f.rlabel.<label>=<value>`: the form seen in
    chainguard-dev/terraform-infra-common PR #168, not in a Google page: unconfirmed)."""
    url = f"{CONSOLE}/monitoring/dashboards/builder/{dashboard_id}?project={project}"
    return url if node_id is None else f"{url}&f.rlabel.node_id={node_id}"
