"""Names GCP accepts, derived from project, stack and logical names."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from model.naming import Naming, fit, label_value

projects = st.from_regex(r"[a-z][a-z0-9-]{4,28}[a-z0-9]", fullmatch=True)
logical = st.from_regex(r"[a-z]([a-z0-9-]{0,18}[a-z0-9])?", fullmatch=True)
stacks = st.from_regex(r"[a-z][a-z0-9-]{0,40}", fullmatch=True)

BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
ACCOUNT_RE = re.compile(r"^[a-z]([-a-z0-9]{4,28})[a-z0-9]$")
RFC1035_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# cloud.google.com/iam/docs/reference/rest/v1/projects.roles/create, roleId.
ROLE_ID_RE = re.compile(r"^[A-Za-z0-9_.]{3,64}$")


# No per-example deadline on any property here (Hypothesis's default is 200 ms):
# generating from these regexes alone can pass 200 ms on a busy 2-core machine (a
# DeadlineExceeded there is the machine, not the names).
@settings(deadline=None)
@given(projects, stacks, logical, st.one_of(st.none(), logical))
def test_names_follow_gcp_rules(project: str, stack: str, name: str, team: str | None) -> None:
    naming = Naming(project, stack)
    bucket = naming.bucket(name, team)
    assert BUCKET_RE.match(bucket) and "google" not in bucket and not bucket.startswith("goog")
    assert ACCOUNT_RE.match(naming.account_id(name, team)), naming.account_id(name, team)
    assert RFC1035_RE.match(naming.tpu_node(name, team))
    assert RFC1035_RE.match(naming.network_resource(name))
    assert 4 <= len(naming.pool_id(name)) <= 32
    assert ROLE_ID_RE.match(naming.custom_role_id("tpuStackStorageDeployer"))


@settings(deadline=None)
@given(projects, stacks, stacks)
def test_custom_role_ids_differ_per_stack(project: str, one: str, other: str) -> None:
    """Role ids are per project: a second stack in the same project must not get 409."""
    if one != other:
        assert (Naming(project, one).custom_role_id("tpuStackStorageDeployer")
                != Naming(project, other).custom_role_id("tpuStackStorageDeployer"))


@settings(deadline=None)
@given(projects, stacks, logical)
def test_names_are_stable_and_distinct_per_team(project: str, stack: str, name: str) -> None:
    naming = Naming(project, stack)
    assert naming.bucket(name) == Naming(project, stack).bucket(name)
    assert naming.bucket(name, "vision") != naming.bucket(name, "speech")


def test_long_names_keep_a_prefix_and_a_hash() -> None:
    long = "a" * 80
    short = fit(long, 30)
    assert len(short) == 30 and short.startswith("a" * 20)
    assert fit(long, 30) != fit("a" * 81, 30)


def test_readable_names() -> None:
    naming = Naming("acme-ml-dev", "dev")
    assert naming.tpu_node("trainer") == "dev-trainer"
    assert naming.bucket("checkpoints") == "acme-ml-dev-dev-checkpoints"
    assert naming.account_id("runtime") == "dev-runtime"
    assert naming.custom_role_id("tpuStackStorageDeployer") == "dev_tpuStackStorageDeployer"
    assert Naming("p", "team-vision").custom_role_id("x") == "team_vision_x"
    assert naming.labels("storage", "research", {"cost-centre": "CC_12"}) == {
        "stack": "dev", "team": "research", "component": "storage",
        "managed-by": "pulumi", "cost-centre": "cc_12"}


@settings(deadline=None)
@given(st.text(max_size=100))
def test_label_values_are_always_valid(text: str) -> None:
    assert re.fullmatch(r"[a-z0-9_-]{0,63}", label_value(text))
