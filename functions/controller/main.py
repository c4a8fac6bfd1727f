"""Cloud Run function: one run of the placement and limits controller (controller/).

Deployed by components/controller.py, invoked over HTTP by Cloud Scheduler (every
interval) and by the teams' budget topics' push subscriptions: any call is one run
(ops/controller/run.py run_once: lease, list, plan, apply, audit); the body is not read.
Answers 200 with the run's summary, also when another run holds the lease, and logs it
on stdout as one JSON line, then the run's budget lines (`run_lines`: what the stack's
controller-runs, team-spend and budget-runout log metrics count, model/monitoring.py).

Environment (set by the stack): TPU_STACK_CONTROLLER_BUCKET (its bucket: manifests,
lease, moves, audit, budget markers), TPU_STACK_CONTROLLER_INTERVAL_SECONDS;
TPU_STACK_TPU_ENDPOINT points the TPU client at another endpoint and
STORAGE_EMULATOR_HOST the storage client at an emulator (tests).
"""

from __future__ import annotations

import json
import os
from typing import Any

import functions_framework

from cloud.tpu import ENDPOINT_ENV, tpu_client
from model.monitoring import CONTROLLER_RUN_LINE
from ops.controller.run import DEFAULT_INTERVAL_SECONDS, run_once
from ops.controller.store import Store
from ops.tpu.api import TpuApi

BUCKET_ENV = "TPU_STACK_CONTROLLER_BUCKET"
INTERVAL_ENV = "TPU_STACK_CONTROLLER_INTERVAL_SECONDS"


def _tpu() -> TpuApi:
    if os.environ.get(ENDPOINT_ENV):
        return TpuApi(client=tpu_client())
    from google.cloud import tpu_v2

    return TpuApi(client=tpu_v2.TpuClient())  # the function's own account (ADC)


@functions_framework.http
def controller(_request: Any) -> tuple[str, int, dict[str, str]]:
    from google.cloud import storage

    store = Store(storage.Client(), os.environ[BUCKET_ENV])
    interval = float(os.environ.get(INTERVAL_ENV) or DEFAULT_INTERVAL_SECONDS)
    result = run_once(store, _tpu(), interval_seconds=interval)
    summary = {key: result.record.get(key) for key in
               ("run", "leased", "note", "stacks", "problems", "unread", "audit")}
    summary["steps"] = len(result.record.get("steps") or [])
    for line in run_lines(result.record, summary):
        print(json.dumps(line, default=str), flush=True)
    return json.dumps(summary), 200, {"Content-Type": "application/json"}


def run_lines(record: dict[str, Any], summary: dict[str, Any]) -> list[dict[str, Any]]:
    """What a run logs, one JSON object a line on stdout (as the budget-stop function's
    `log`): the run line, then each budget line (ops/controller/spend_lines.py); the
    contract the log-based metrics count (model/monitoring.py CONTROLLER_RUN_LINE)."""
    return [{"message": CONTROLLER_RUN_LINE, **summary}, *(record.get("budgets") or [])]
