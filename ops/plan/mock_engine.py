"""Run the Pulumi program under Pulumi's mock engine and record what it declares.

No cloud, no CLI, no credentials: `run_program` hands the program the config
the CLI would, records every resource registration with its inputs and the
options `Mocks` cannot see (protect, parent, delete-before-replace), and
returns the resolved stack outputs. Offline plans, `tpuctl rehearse` and the
tests all use it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import gc
import json
import logging
import runpy
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import mocks, rpc
from pulumi.runtime import settings as runtime_settings
from pulumi.runtime.config import set_all_config
from pulumi.runtime.stack import wait_for_rpcs

from model.archive import REPO_ROOT
from model.pulumi_types import (
    COMPUTE_NETWORK,
    COMPUTE_SUBNETWORK,
    IAM_WORKLOAD_IDENTITY_POOL,
    IAM_WORKLOAD_IDENTITY_POOL_PROVIDER,
    ORGANIZATIONS_GET_PROJECT,
    ORGANIZATIONS_PROJECT,
    PULUMI_STACK,
    PULUMI_STACK_REFERENCE,
    SERVICEACCOUNT_ACCOUNT,
    STORAGE_BUCKET,
    STORAGE_GET_BUCKET_OBJECT_CONTENT,
    STORAGE_GET_BUCKET_OBJECTS,
)

PROJECT = "tpu-stack"


@dataclass
class Registration:
    """One resource as the program registered it."""

    urn: str
    type: str
    name: str
    custom: bool
    parent: str | None
    inputs: dict[str, Any]
    protect: bool
    delete_before_replace: bool | None  # None: the option is not set, the provider decides
    dependencies: list[str]
    outputs: dict[str, Any] = field(default_factory=dict)
    ignore_changes: list[str] = field(default_factory=list)  # property paths, as sent
    # Input key → URNs of the resources whose outputs the value took (the engine's
    # propertyDependencies, which its dependent-replacement diff reads).
    property_dependencies: dict[str, list[str]] = field(default_factory=dict)
    provider: str | None = None  # the explicit provider's URN, if any
    secrets: list[str] = field(default_factory=list)  # input keys sent as secrets
    replace_on_changes: list[str] = field(default_factory=list)
    retain_on_delete: bool = False  # a delete only drops it from the state


class RecordingMonitor(mocks.MockMonitor):
    """A MockMonitor that keeps each RegisterResource request, options included."""

    def __init__(self, mock: mocks.Mocks) -> None:
        super().__init__(mock)
        self.registrations: list[Registration] = []

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 (gRPC name)
        response = super().RegisterResource(request)
        if request.type != PULUMI_STACK:
            urn = response.urn
            inputs = rpc.deserialize_properties(request.object)
            secrets = sorted(k for k, v in inputs.items() if rpc.is_rpc_secret(v))
            for key in secrets:
                inputs[key] = rpc.unwrap_rpc_secret(inputs[key])
            self.registrations.append(Registration(
                urn=urn,
                type=request.type,
                name=request.name,
                custom=bool(request.custom),
                parent=request.parent or None,
                inputs=inputs,
                protect=bool(request.protect),
                delete_before_replace=(bool(request.deleteBeforeReplace)
                                       if request.deleteBeforeReplaceDefined else None),
                dependencies=list(request.dependencies),
                ignore_changes=list(request.ignoreChanges),
                outputs=dict(self.resources[urn].state) if urn in self.resources else {},
                property_dependencies={key: list(deps.urns) for key, deps
                                       in request.propertyDependencies.items() if deps.urns},
                # A provider reference is `<urn>::<id>`.
                provider=request.provider.rsplit("::", 1)[0] or None,
                secrets=secrets,
                replace_on_changes=list(request.replaceOnChanges),
                retain_on_delete=bool(request.retainOnDelete),
            ))
        return response


# Config keys whose value names a stack the program reads through a
# StackReference (docs/teams.md: a team stack's platform stack).
STACK_REFERENCE_KEYS = (f"{PROJECT}:platformStack",)


class GcpMocks(mocks.Mocks):
    """Computed outputs the way GCP returns them, for what the program reads back.

    A StackReference (`org/project/stack`) resolves to `stack_outputs[name]`.
    """

    def __init__(self, project_number: str = "123456789012",
                 stack_outputs: Mapping[str, dict[str, Any]] | None = None,
                 bucket_objects: Mapping[str, list[str]] | None = None) -> None:
        self.project_number = project_number
        self.stack_outputs = dict(stack_outputs or {})
        # Object names per bucket, as GCS lists them (the budget-stop markers).
        self.bucket_objects = dict(bucket_objects or {})

    def new_resource(self, args: mocks.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        inputs = dict(args.inputs)
        if args.typ == PULUMI_STACK_REFERENCE:
            name = inputs["name"]
            if name not in self.stack_outputs:
                raise KeyError(f"no outputs for stack reference {name!r}: give GcpMocks "
                               f"stack_outputs (known: {', '.join(self.stack_outputs) or 'none'})")
            return name, {"name": name, "outputs": self.stack_outputs[name],
                          "secretOutputNames": []}
        project = inputs.get("project") or inputs.get("projectId") or "mock-project"
        name = inputs.get("name") or args.name
        computed = _COMPUTED.get(args.typ)
        resource_id, outputs = computed(self, project, name, inputs) if computed else (
            f"{args.name}-id", {})
        return resource_id, {**inputs, **outputs}

    def call(self, args: mocks.MockCallArgs) -> dict[str, Any]:
        # A dict, not (dict, None): MockMonitor.Invoke iterates a tuple's failures.
        if args.token == ORGANIZATIONS_GET_PROJECT:
            project = args.args.get("projectId") or "mock-project"
            return {"projectId": project, "number": self.project_number}
        if args.token == STORAGE_GET_BUCKET_OBJECT_CONTENT:
            return {**args.args, "content": self._object_content(args.args)}
        if args.token == STORAGE_GET_BUCKET_OBJECTS:
            bucket, prefix = args.args["bucket"], args.args.get("prefix") or ""
            return {"bucket": bucket, "bucketObjects": [
                {"name": name} for name in self.bucket_objects.get(bucket, [])
                if name.startswith(prefix)]}
        return {}

    def _object_content(self, where: Mapping[str, Any]) -> str | None:
        """A platform's outputs object for a team (team_state.outputs_object), from the
        outputs of the platform stack planned for the StackReference keys."""
        from model import team_state

        parts = str(where.get("name", "")).removeprefix(team_state.OUTPUTS_PREFIX + "/")
        stack, _, team = parts.partition("/")
        for reference, outputs in self.stack_outputs.items():
            view = team_state.team_view(outputs, team.removesuffix(".json"))
            if reference.rsplit("/", 1)[-1] == stack and view is not None:
                return json.dumps(view)
        return None  # no such object: the platform serves no such team


@functools.cache
def planned_stack_run(reference: str) -> ProgramRun:
    """`org/project/<stack>` as an offline plan of this repo's Pulumi.<stack>.yaml
    runs it (once per process): its outputs, and its grants for the permission proof."""
    from components.stack_config import file_config  # the program's config reader

    stack = reference.rsplit("/", 1)[-1]
    return run_program(file_config(stack), stack)


def planned_stack_outputs(reference: str) -> dict[str, Any]:
    """The outputs of `org/project/<stack>` (planned_stack_run)."""
    return planned_stack_run(reference).outputs


def referenced_stack_outputs(config: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Outputs of every stack `config` references, planned from this repo's
    stack files. Planned before the program runs: Pulumi's runtime state is
    per process, so a plan cannot start inside another one's mock call."""
    return {config[key]: planned_stack_outputs(config[key])
            for key in STACK_REFERENCE_KEYS if config.get(key)}


def _account(m: GcpMocks, project: str, name: str, inputs: dict) -> tuple[str, dict]:
    email = f"{inputs['accountId']}@{project}.iam.gserviceaccount.com"
    return (f"projects/{project}/serviceAccounts/{email}",
            {"email": email, "member": f"serviceAccount:{email}",
             "name": f"projects/{project}/serviceAccounts/{email}"})


def _network(m: GcpMocks, project: str, name: str, inputs: dict) -> tuple[str, dict]:
    link = f"projects/{project}/global/networks/{name}"
    return link, {"selfLink": f"https://www.googleapis.com/compute/v1/{link}"}


def _subnetwork(m: GcpMocks, project: str, name: str, inputs: dict) -> tuple[str, dict]:
    link = f"projects/{project}/regions/{inputs['region']}/subnetworks/{name}"
    return link, {"selfLink": f"https://www.googleapis.com/compute/v1/{link}"}


def _bucket(m: GcpMocks, project: str, name: str, inputs: dict) -> tuple[str, dict]:
    return name, {"url": f"gs://{name}", "selfLink": f"https://www.googleapis.com/storage/v1/b/{name}"}


def _project(m: GcpMocks, project: str, name: str, inputs: dict) -> tuple[str, dict]:
    return f"projects/{inputs['projectId']}", {"number": m.project_number}


def _pool(m: GcpMocks, project: str, name: str, inputs: dict) -> tuple[str, dict]:
    full = (f"projects/{m.project_number}/locations/global/workloadIdentityPools/"
            f"{inputs['workloadIdentityPoolId']}")
    return full, {"name": full}


def _pool_provider(m: GcpMocks, project: str, name: str, inputs: dict) -> tuple[str, dict]:
    full = (f"projects/{m.project_number}/locations/global/workloadIdentityPools/"
            f"{inputs['workloadIdentityPoolId']}/providers/"
            f"{inputs['workloadIdentityPoolProviderId']}")
    return full, {"name": full}


_COMPUTED: dict[str, Callable[[GcpMocks, str, str, dict], tuple[str, dict]]] = {
    SERVICEACCOUNT_ACCOUNT: _account,
    COMPUTE_NETWORK: _network,
    COMPUTE_SUBNETWORK: _subnetwork,
    STORAGE_BUCKET: _bucket,
    ORGANIZATIONS_PROJECT: _project,
    IAM_WORKLOAD_IDENTITY_POOL: _pool,
    IAM_WORKLOAD_IDENTITY_POOL_PROVIDER: _pool_provider,
}


@dataclass
class ProgramRun:
    registrations: list[Registration]
    outputs: dict[str, Any]
    # What the program logged through the engine (pulumi.log.warn ...): (level, message).
    logs: list[tuple[str, str]] = field(default_factory=list)

    def of_type(self, type_token: str) -> list[Registration]:
        return [r for r in self.registrations if r.type == type_token]

    def by_urn(self) -> dict[str, Registration]:
        return {r.urn: r for r in self.registrations}


def run_program(config: Mapping[str, str], stack: str,
                program: Callable[[], None] | None = None,
                mock: mocks.Mocks | None = None,
                organization: str | None = None) -> ProgramRun:
    """Run `program` (default: the repo's __main__.py) as stack `stack`.

    Runs in a fresh context and event loop, so runs never share Pulumi state.
    Exceptions the program raises (e.g. pulumi.RunError for a bad config)
    propagate to the caller. `organization` is what pulumi.get_organization()
    answers ("organization" on a self-managed backend); None: the backend is
    unknown, as offline.
    """
    if mock is None:
        mock = GcpMocks(stack_outputs=referenced_stack_outputs(config))
    try:
        return contextvars.Context().run(_run, dict(config), stack,
                                         program or _main_program, mock, organization)
    finally:
        _collect_run_garbage()


def _collect_run_garbage() -> None:
    """Free the run's cyclic garbage now, at a safe point, and quietly.

    Collected later, its finalizers and weakref callbacks (asyncio's task
    registry; futures of a failed run whose exception nobody retrieved, which
    log) run Python code in the middle of whatever runs then: inside CPython
    3.11's ast.parse (pytest's assertion rewriting) that raises "AST
    constructor recursion depth mismatch" (cpython gh-106905).
    """
    asyncio_logger = logging.getLogger("asyncio")
    level = asyncio_logger.level
    asyncio_logger.setLevel(logging.CRITICAL)
    try:
        gc.collect()
    finally:
        asyncio_logger.setLevel(level)


def _main_program(path: Path = REPO_ROOT / "__main__.py") -> None:
    runpy.run_path(str(path), run_name="__main__")


class _RpcThreads(ThreadPoolExecutor):
    """The run's worker threads (Pulumi runs mock RPCs there), each with an
    event loop of its own that the run closes. Left open, such loops are
    closed by the garbage collector at any later moment, running Python code
    in the middle of whatever runs then: inside CPython 3.11's ast.parse that
    raises "AST constructor recursion depth mismatch" (cpython gh-106905)."""

    def __init__(self) -> None:
        self.loops: list[asyncio.AbstractEventLoop] = []
        super().__init__(thread_name_prefix="mock-rpc", initializer=self._new_loop)

    def _new_loop(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self.loops.append(loop)

    def close(self) -> None:
        self.shutdown(wait=True)
        for loop in self.loops:
            loop.close()


def _run(config: dict[str, str], stack: str, program: Callable[[], None],
         mock: mocks.Mocks, organization: str | None) -> ProgramRun:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    quiet = _QuietAfterFailure()
    loop.set_exception_handler(quiet)
    threads = _RpcThreads()
    loop.set_default_executor(threads)
    # A run allocates many short-lived Outputs and tasks; collecting while it
    # runs costs more the bigger the stack (plan time grew faster than the node
    # count). Collect once, at the end, instead.
    collecting = gc.isenabled()
    gc.disable()
    try:
        monitor = RecordingMonitor(mock)
        log = _EngineLog()
        mocks.set_mocks(mock, project=PROJECT, stack=stack, preview=False, monitor=monitor,
                        organization=organization, logger=log.logger)
        set_all_config(config)
        program()
        loop.run_until_complete(wait_for_rpcs())
        outputs = loop.run_until_complete(_stack_outputs())
        return ProgramRun(monitor.registrations, outputs, log.records)
    except BaseException:
        quiet.failed = True
        raise
    finally:
        _finish_tasks(loop)
        threads.close()
        # MockSettings leaves the process-wide set of pending outputs as it is:
        # a run that raised leaves tasks of this loop there, and the next
        # program's wait_for_rpcs would wait on them after the loop is closed.
        runtime_settings.SETTINGS.outputs.clear()
        asyncio.set_event_loop(None)
        loop.close()
        if collecting:
            gc.enable()


class _EngineLog(logging.Handler):
    """The run's engine log. pulumi's MockEngine logs to the root logger by default
    (pulumi/runtime/mocks.py, MockEngine.Log), so a program's warnings would reach
    stderr, in the middle of the CLI's own output, even for a stack a plan only
    references; they are kept here, on the run, instead."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[str, str]] = []
        self.logger = logging.Logger("tpu-stack.mock-engine")  # unregistered: no parent
        self.logger.propagate = False
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelname.lower(), record.getMessage()))


class _QuietAfterFailure:
    """The loop's exception handler: once the program has failed, the futures of every
    Output that depended on the failed one hold its error unretrieved, and each logs
    "Future exception was never retrieved" with the traceback when freed (112 of them
    for one bad team stack). The caller gets the error once; these logs are dropped."""

    failed = False

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if self.failed and context.get("message") == "Future exception was never retrieved":
            return
        loop.default_exception_handler(context)


def _finish_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what a run left pending (a failed run leaves registrations),
    as asyncio.run does: a pending task destroyed later logs from wherever
    the garbage collector happens to run (see _RpcThreads)."""
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))


async def _stack_outputs() -> dict[str, Any]:
    root = pulumi.runtime.get_root_resource()
    exported = getattr(root, "outputs", {}) or {}
    return {key: await pulumi.Output.from_input(value).future()
            for key, value in exported.items()}
