"""tpu-stack guardrails: the policies of the pack, importable without starting it.

`policy/__main__.py` hands `POLICIES` to a `PolicyPack` (which blocks serving
gRPC); tests and `policy/evaluate.py` call the policies directly.

Properties arrive camelCase, as the engine sends them. Each policy reads its
config through `settings(args, name)`: the defaults below, overridden by the
policy config file (policy/README.md, policy/config.example.json).
"""

from __future__ import annotations

import fnmatch
import functools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from components.stack_config import program_config
from model import catalog
from model.pulumi_types import (
    DYNAMIC_PREFIX,
    ORGANIZATIONS_PROJECT,
    PROJECTS_IAM_BINDING,
    PROJECTS_IAM_MEMBER,
    PROJECTS_IAM_POLICY,
    PROJECTS_SERVICE,
    SERVICEACCOUNT_KEY,
    STORAGE_BUCKET,
    TPU_V2_VM,
)
from model.settings.load import ENVIRONMENTS, environment_of
from model.settings.rules.teams import DEFAULT_TEAM
from node_agent.contract import IDLE_STOP_KEY, MAX_RUNTIME_KEY
from policy.iam import binding_target

PROJECT_IAM_TYPES = frozenset({
    PROJECTS_IAM_MEMBER,
    PROJECTS_IAM_BINDING,
    PROJECTS_IAM_POLICY,
})
# Resources whose pulumi-gcp inputs carry `labels`.
LABELLED_TYPES = frozenset({STORAGE_BUCKET, TPU_V2_VM, ORGANIZATIONS_PROJECT})
PUBLIC_MEMBERS = ("allUsers", "allAuthenticatedUsers")
COMPUTE_DEFAULT_SA_SUFFIX = "-compute@developer.gserviceaccount.com"
# A V2Vm with neither acceleratorType nor acceleratorConfig gets v2-8 from the
# provider (docs/tpu-facts.md, "The API and the resources").
PROVIDER_DEFAULT_ACCELERATOR = "v2-8"


def is_tpu_node(resource_type: str, props: Mapping[str, Any] | None = None) -> bool:
    """A V2Vm, or a queued TPU node (components/queued_tpu.py: a Python dynamic
    resource, recognised by its node_id and runtime_version inputs)."""
    if resource_type == TPU_V2_VM:
        return True
    return (resource_type.startswith(DYNAMIC_PREFIX) and props is not None
            and "node_id" in props and "runtime_version" in props)


def tpu_view(resource_type: str, props: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A TPU node's inputs in V2Vm shape (camelCase), or None for any other resource.

    The queued node's dynamic provider takes flat snake_case inputs."""
    if resource_type == TPU_V2_VM:
        return props
    if not is_tpu_node(resource_type, props):
        return None
    view: dict[str, Any] = {
        "runtimeVersion": props.get("runtime_version"),
        "acceleratorType": props.get("accelerator_type"),
        "serviceAccount": {"email": props.get("service_account_email")},
        "networkConfig": {"enableExternalIps": props.get("enable_external_ips")},
        "schedulingConfig": {"spot": props.get("spot")},
        "labels": props.get("labels"),
        "metadata": props.get("metadata"),
    }
    if props.get("accelerator_config_type"):
        view["acceleratorConfig"] = {"type": props["accelerator_config_type"],
                                     "topology": props.get("accelerator_topology")}
    return view


# The stack config of the stack under review, where evaluate() sets it (an
# offline plan); None: the config the engine hands the pack.
_STACK_CONFIG: ContextVar[Mapping[str, Any] | None] = ContextVar("stack_config", default=None)


def stack_environment() -> str:
    """dev or prod, by the rule settings use (model/settings/,
    environment_of: `tpu-stack:environment`, never the stack's name). The engine
    hands a policy pack the stack's config in PULUMI_CONFIG (pulumi/pulumi
    pkg/resource/plugin/analyzer_plugin.go, constructEnv; since pulumi 1.8.0,
    #3612) and pulumi-policy loads it into pulumi's runtime config
    (_configure_runtime_settings)."""
    config = _STACK_CONFIG.get()
    return environment_of(program_config() if config is None else config)


@contextmanager
def reviewing(stack_config: Mapping[str, Any]) -> Iterator[None]:
    """Run policies as if the engine had handed the pack `stack_config`."""
    token = _STACK_CONFIG.set(dict(stack_config))
    try:
        yield
    finally:
        _STACK_CONFIG.reset(token)


def stack_in(stack: str, entries: Iterable[str], environment: str | None = None) -> bool:
    """Whether a config's stack list names `stack`. An entry is an environment
    (`dev`, `prod`: stacks whose tpu-stack:environment it is), a stack name, or a
    shell pattern of names such as `team-*`."""
    environment = environment or stack_environment()
    return any(entry == environment if entry in ENVIRONMENTS
               else fnmatch.fnmatchcase(stack, entry) for entry in entries)


def stack_limit(stack: str, limits: Mapping[str, int],
                environment: str | None = None) -> int | None:
    """The limit for `stack`: its own name's key, else the longest pattern matching
    it, else its environment's key (`dev`, `prod`), else `*`."""
    environment = environment or stack_environment()
    names = [key for key in limits if key not in (*ENVIRONMENTS, "*")]
    if stack in names:
        return limits[stack]
    for pattern in sorted(names, key=len, reverse=True):
        if fnmatch.fnmatchcase(stack, pattern):
            return limits[pattern]
    return limits.get(environment, limits.get("*"))


def stack_of(urn: str) -> str:
    """`urn:pulumi:dev::tpu-stack::…` → `dev`."""
    return urn.split("::", 1)[0].rsplit(":", 1)[-1]


# --- configuration ---------------------------------------------------------

Schema = dict[str, dict[str, Any]]

# Stack lists take names or shell patterns (`team-*`).
_STRINGS = {"type": "array", "items": {"type": "string"}}

CONFIG_SCHEMAS: dict[str, Schema] = {
    "tpu-no-external-ip": {
        "allowedStacks": {**_STRINGS, "default": [],
                          "description": "environments (dev, prod) or stacks whose TPU nodes "
                                         "may have external IPs"},
    },
    "no-privileged-project-roles": {
        "forbiddenRoles": {**_STRINGS,
                           "default": ["roles/editor", "roles/owner", "roles/storage.admin"],
                           "description": "roles never granted at project level"},
    },
    "required-labels": {
        "requiredLabels": {**_STRINGS, "default": ["stack", "managed-by"],
                           "description": "labels every labelled resource carries"},
        "teamLabel": {"type": "string", "default": "team",
                      "description": "required everywhere once any resource of the stack has it"},
    },
    "protected-data-buckets": {
        "bucketPurposes": {**_STRINGS, "default": ["checkpoints", "data"],
                           "description": "`purpose` labels (else logical names) of data buckets"},
        "exemptStacks": {**_STRINGS, "default": ["dev"],
                         "description": "environments (dev, prod) or stacks whose data "
                                        "buckets may be deleted"},
    },
    "tpu-accelerator-allowlist": {
        "allowedAcceleratorTypes": {**_STRINGS, "default": [],
                                    "description": "accelerator types allowed; empty: any"},
    },
    "tpu-max-chips": {
        "maxChips": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0},
                     "default": {"dev": 32, "*": 256},
                     "description": "TPU chips per stack: by stack name or pattern, else by "
                                    "environment (dev, prod), else '*'"},
    },
    "tpu-spot-stacks": {
        "spotStacks": {**_STRINGS, "default": ["dev"],
                       "description": "environments (dev, prod) or stacks that may run spot "
                                      "or preemptible TPUs"},
    },
}


def settings(args: ResourceValidationArgs | StackValidationArgs, policy: str) -> dict[str, Any]:
    """The policy's config: schema defaults overridden by the pack's config file."""
    values = {key: spec["default"] for key, spec in CONFIG_SCHEMAS.get(policy, {}).items()}
    values.update(args.get_config() or {})
    return values


def _schema(policy: str) -> PolicyConfigSchema | None:
    properties = CONFIG_SCHEMAS.get(policy)
    return PolicyConfigSchema(properties=properties) if properties else None


# --- helpers over camelCase properties -----------------------------------

def _get(props: Mapping[str, Any], path: str) -> Any:
    """`_get(props, "networkConfig.enableExternalIps")`, None when any part is missing."""
    value: Any = props
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _members(props: Mapping[str, Any]) -> Iterable[str]:
    """Every IAM member a resource grants: `member`, `members`, and `policyData` bindings."""
    if isinstance(props.get("member"), str):
        yield props["member"]
    yield from (m for m in props.get("members") or () if isinstance(m, str))
    policy_data = props.get("policyData")
    if isinstance(policy_data, str):
        try:
            bindings = json.loads(policy_data).get("bindings", [])
        except (ValueError, AttributeError):
            bindings = []
        for binding in bindings:
            yield from binding.get("members", ())


def _roles(props: Mapping[str, Any]) -> Iterable[str]:
    if isinstance(props.get("role"), str):
        yield props["role"]
    policy_data = props.get("policyData")
    if isinstance(policy_data, str):
        try:
            yield from (b.get("role", "") for b in json.loads(policy_data).get("bindings", []))
        except (ValueError, AttributeError):
            return


def tpu_slice(props: Mapping[str, Any]) -> catalog.Slice:
    """The node's slice from `acceleratorType` or `acceleratorConfig{type, topology}`."""
    config = props.get("acceleratorConfig")
    if isinstance(config, Mapping) and config.get("type"):
        by_api_type = {g.api_type: g.name for g in catalog.GENERATIONS.values()}
        if config["type"] not in by_api_type:
            raise catalog.CatalogError(
                f"acceleratorConfig.type {config['type']!r} is unknown; allowed: "
                f"{', '.join(by_api_type)}")
        return catalog.slice_for(by_api_type[config["type"]], str(config.get("topology")))
    accelerator = props.get("acceleratorType") or PROVIDER_DEFAULT_ACCELERATOR
    return catalog.parse_accelerator_type(accelerator)


def is_spot(props: Mapping[str, Any]) -> bool:
    scheduling = props.get("schedulingConfig") or {}
    return bool(scheduling.get("spot") or scheduling.get("preemptible"))


# --- resource policies ----------------------------------------------------

NodeCheck = Callable[[ResourceValidationArgs, Mapping[str, Any], ReportViolation], None]


def _on_tpu_nodes(check: NodeCheck) -> Callable[[ResourceValidationArgs, ReportViolation], None]:
    """A resource validation that runs `check` on TPU nodes only, with their V2Vm-shaped view."""
    @functools.wraps(check)
    def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
        node = tpu_view(args.resource_type, args.props)
        if node is not None:
            check(args, node, report)
    return validate


def _bucket_access(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type != STORAGE_BUCKET:
        return
    if args.props.get("uniformBucketLevelAccess") is not True:
        report(f"bucket {args.name}: set uniformBucketLevelAccess=true "
               "(object ACLs could make objects public)", None)
    if args.props.get("publicAccessPrevention") != "enforced":
        report(f"bucket {args.name}: set publicAccessPrevention='enforced' "
               f"(it is {args.props.get('publicAccessPrevention')!r})", None)


def _no_public_members(args: ResourceValidationArgs, report: ReportViolation) -> None:
    public = sorted({m for m in _members(args.props) if m in PUBLIC_MEMBERS})
    if public:
        report(f"{args.name} grants access to {', '.join(public)}: "
               "grant named principals only", None)


def _no_sa_keys(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type == SERVICEACCOUNT_KEY:
        report(f"service-account key {args.name}: keys are forbidden; "
               "use Workload Identity Federation (components/ci.py)", None)


@_on_tpu_nodes
def _tpu_service_account(args: ResourceValidationArgs, node: Mapping[str, Any],
                         report: ReportViolation) -> None:
    email = _get(node, "serviceAccount.email")
    if not email:
        report(f"TPU node {args.name}: serviceAccount.email is missing, so it would run as "
               "the Compute default service account; give it the stack's runtime account", None)
    elif str(email).endswith(COMPUTE_DEFAULT_SA_SUFFIX):
        report(f"TPU node {args.name}: runs as the Compute default service account {email}; "
               "give it the stack's runtime account", None)


@_on_tpu_nodes
def _team_node_limits(args: ResourceValidationArgs, node: Mapping[str, Any],
                      report: ReportViolation) -> None:
    """A team's node (in its team's project, `<platform project>-<team>`,
    model/naming.py team_project; one whose id was shortened with a hash is not
    recognised) with neither run-time limit bills until someone deletes it (docs/design.md,
    "Run-time limits, idle stops and stop requests")."""
    team = (node.get("labels") or {}).get("team")
    project = str(args.props.get("project") or "")
    metadata = node.get("metadata") or {}
    if team and team != DEFAULT_TEAM and project.endswith(f"-{team}") and not (
            MAX_RUNTIME_KEY in metadata or IDLE_STOP_KEY in metadata):
        report(f"TPU node {args.name} of team {team} has neither maxRuntime nor idleStop: "
               "nothing stops it when its job ends or stalls; set one on the node "
               "(tpu-stack:nodes[].maxRuntime, idleStop)", None)


@_on_tpu_nodes
def _tpu_external_ip(args: ResourceValidationArgs, node: Mapping[str, Any],
                     report: ReportViolation) -> None:
    allowed = settings(args, "tpu-no-external-ip")["allowedStacks"]
    stack = stack_of(args.urn)
    if _get(node, "networkConfig.enableExternalIps") and not stack_in(stack, allowed):
        report(f"TPU node {args.name}: networkConfig.enableExternalIps is true in stack "
               f"{stack!r} (environment {stack_environment()}); external IPs are allowed "
               f"only in {allowed or 'no stack'} "
               "(policy config tpu-no-external-ip.allowedStacks)", None)


def _privileged_project_roles(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type not in PROJECT_IAM_TYPES:
        return
    forbidden = settings(args, "no-privileged-project-roles")["forbiddenRoles"]
    for role in sorted(set(_roles(args.props)) & set(forbidden)):
        report(f"{args.name} grants {role} on the whole project; grant a narrower role "
               "on the resource that needs it", None)


def _bucket_purpose(args: ResourceValidationArgs) -> str:
    """The `purpose` label components/storage.py sets, else the logical name."""
    labels = args.props.get("labels") or {}
    return str(labels.get("purpose") or args.name)


def _protected_data_buckets(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type != STORAGE_BUCKET:
        return
    config = settings(args, "protected-data-buckets")
    stack = stack_of(args.urn)
    exempt = stack_in(stack, config["exemptStacks"])
    if exempt or _bucket_purpose(args) not in config["bucketPurposes"]:
        return
    where = f"stack {stack!r} (environment {stack_environment()})"
    if not args.opts.protect:
        report(f"bucket {args.name} holds data in {where}: create it with "
               "protect=True so no command deletes it", None)
    if args.props.get("forceDestroy"):
        report(f"bucket {args.name} holds data in {where}: forceDestroy must be "
               "false outside " + ", ".join(config["exemptStacks"]), None)


def _apis_kept(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type == PROJECTS_SERVICE and args.props.get("disableOnDestroy") is not False:
        # The SDK defaults disableOnDestroy to true
        # (docs/tpu-facts.md, "The API and the resources").
        report(f"API {args.props.get('service', args.name)}: set disableOnDestroy=false; "
               "destroying this stack must not switch APIs off in a shared project", None)


@_on_tpu_nodes
def _accelerator_allowlist(args: ResourceValidationArgs, node: Mapping[str, Any],
                           report: ReportViolation) -> None:
    allowed = settings(args, "tpu-accelerator-allowlist")["allowedAcceleratorTypes"]
    try:
        accelerator = tpu_slice(node).accelerator_type
    except catalog.CatalogError as error:
        report(f"TPU node {args.name}: {error}", None)
        return
    if allowed and accelerator not in allowed:
        report(f"TPU node {args.name}: accelerator type {accelerator} is not allowed; "
               f"allowed: {', '.join(allowed)} "
               "(policy config tpu-accelerator-allowlist.allowedAcceleratorTypes)", None)


@_on_tpu_nodes
def _spot_stacks(args: ResourceValidationArgs, node: Mapping[str, Any],
                 report: ReportViolation) -> None:
    if not is_spot(node):
        return
    allowed = settings(args, "tpu-spot-stacks")["spotStacks"]
    stack = stack_of(args.urn)
    if not stack_in(stack, allowed):
        report(f"TPU node {args.name}: spot/preemptible capacity in stack {stack!r} "
               f"(environment {stack_environment()}); allowed only in {allowed or 'no stack'} "
               "(policy config tpu-spot-stacks.spotStacks)", None)


# --- stack policies -------------------------------------------------------

def _required_labels(args: StackValidationArgs, report: ReportViolation) -> None:
    config = settings(args, "required-labels")
    labelled = [r for r in args.resources
                if r.resource_type in LABELLED_TYPES or is_tpu_node(r.resource_type, r.props)]
    required = list(config["requiredLabels"])
    team = config["teamLabel"]
    if team and any(team in (r.props.get("labels") or {}) for r in labelled):
        required.append(team)
    for resource in labelled:
        labels = resource.props.get("labels") or {}
        missing = [key for key in required if not labels.get(key)]
        if missing:
            report(f"{resource.name} is missing labels {', '.join(missing)} "
                   f"(required: {', '.join(required)})", resource.urn)


def _max_chips(args: StackValidationArgs, report: ReportViolation) -> None:
    nodes = [(r.urn, view) for r in args.resources
             if (view := tpu_view(r.resource_type, r.props)) is not None]
    if not nodes:
        return
    stack = stack_of(nodes[0][0])
    limits = settings(args, "tpu-max-chips")["maxChips"]
    limit = stack_limit(stack, limits)
    chips = 0
    for _urn, view in nodes:
        try:
            chips += tpu_slice(view).chips
        except catalog.CatalogError:
            continue  # tpu-accelerator-allowlist reports it
    if limit is not None and chips > limit:
        report(f"stack {stack!r} asks for {chips} TPU chips; the limit is {limit} "
               f"(policy config tpu-max-chips.maxChips)", None)


def _iam_grant(resource_type: str, props: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(kind, target, role) of an IAMBinding or IAMMember of any pulumi-gcp module,
    or None (another resource, or inputs still unknown at preview)."""
    module, _, name = resource_type.partition(":")[2].partition("/")
    kind = name.split(":", 1)[0].lower()
    if kind not in ("iambinding", "iammember") or not isinstance(props.get("role"), str):
        return None
    try:
        target = binding_target(module, props)
    except KeyError:
        return None
    return None if target is None else (kind, target, props["role"])


def _no_binding_beside_member(args: StackValidationArgs, report: ReportViolation) -> None:
    """pulumi-gcp (every `*IAMBinding`/`*IAMMember` page): "IAMBinding resources can
    be used in conjunction with IAMMember resources only if they do not grant
    privilege to the same role". The authoritative binding removes the member's
    grant at its next update and the member puts it back: access flaps."""
    kinds: dict[tuple[str, str], set[str]] = {}
    for resource in args.resources:
        grant = _iam_grant(resource.resource_type, resource.props)
        if grant is not None:
            kinds.setdefault(grant[1:], set()).add(grant[0])
    for (target, role), found in sorted(kinds.items()):
        if found == {"iambinding", "iammember"}:
            report(f"{role} on {target} is granted by an IAMBinding and an IAMMember: the "
                   "binding is authoritative and removes the member's grant; use IAMMember "
                   "for every grant of that role", None)


# --- the pack's policy list ------------------------------------------------

Validation = Callable[..., None]

_RESOURCE_POLICIES: tuple[tuple[str, str, Validation], ...] = (
    ("bucket-uniform-access",
     "Buckets use uniform bucket-level access and enforce public access prevention.",
     _bucket_access),
    ("no-public-members", "No IAM grant to allUsers or allAuthenticatedUsers.", _no_public_members),
    ("no-service-account-keys", "No service-account keys; CI uses Workload Identity.", _no_sa_keys),
    ("tpu-not-default-service-account",
     "TPU nodes never run as the Compute default service account.", _tpu_service_account),
    ("tpu-no-external-ip", "TPU nodes have no external IPs unless the stack allows it.",
     _tpu_external_ip),
    ("no-privileged-project-roles",
     "No editor, owner or storage.admin grants at project level.", _privileged_project_roles),
    ("protected-data-buckets",
     "Checkpoint and data buckets are protected and not force-destroyable outside dev.",
     _protected_data_buckets),
    ("apis-kept-on-destroy", "APIs are never disabled when the stack is destroyed.", _apis_kept),
    ("tpu-accelerator-allowlist", "TPU nodes use a known, allowed accelerator type.",
     _accelerator_allowlist),
    ("tpu-spot-stacks", "Spot and preemptible TPUs only in stacks configured for them.",
     _spot_stacks),
)

# Advisory: `pulumi preview` prints them as warnings and goes on; `tpuctl plan` shows
# them without failing (policy/evaluate.py Violation.advisory).
_ADVISORY_POLICIES: tuple[tuple[str, str, Validation], ...] = (
    ("tpu-team-node-limits", "A team's TPU node sets maxRuntime or idleStop.",
     _team_node_limits),
)

_STACK_POLICIES: tuple[tuple[str, str, Validation], ...] = (
    ("required-labels", "Labelled resources carry stack, managed-by (and team where teams exist).",
     _required_labels),
    ("tpu-max-chips", "A stack's TPU nodes stay within its chip budget.", _max_chips),
    ("no-binding-beside-member",
     "No authoritative IAMBinding beside an IAMMember for the same role and resource.",
     _no_binding_beside_member),
)


def build_policies() -> list[ResourceValidationPolicy | StackValidationPolicy]:
    mandatory = EnforcementLevel.MANDATORY
    resource = [
        ResourceValidationPolicy(name=name, description=text, validate=check,
                                 enforcement_level=mandatory, config_schema=_schema(name))
        for name, text, check in _RESOURCE_POLICIES
    ]
    stack = [
        StackValidationPolicy(name=name, description=text, validate=check,
                              enforcement_level=mandatory, config_schema=_schema(name))
        for name, text, check in _STACK_POLICIES
    ]
    advisory = [
        ResourceValidationPolicy(name=name, description=text, validate=check,
                                 enforcement_level=EnforcementLevel.ADVISORY,
                                 config_schema=_schema(name))
        for name, text, check in _ADVISORY_POLICIES
    ]
    return [*resource, *advisory, *stack]


POLICIES = build_policies()
