"""Will a node's stop fit in its stop notice? A preview warning if not.

After the notice the job finishes the execution under way, then saves. Pure and
without TensorFlow:

- the save: the checkpoint's bytes from the job schema's table (training/tpu_training/
  config.py, `checkpoint_bytes`) at the GCS write rate of model/catalog.py;
- the longest execution: the job sizes its executions to a share of the node's notice
  (`noticeSeconds`, contract C3; `EXECUTION_SHARE_OF_NOTICE`), unless one step takes
  longer; no longer than `stepsPerExecution` steps either. A step's seconds are estimated
  from the model's FLOPs per example (`train_flops_per_example`) and the slice's peak
  FLOPs at an assumed utilisation (catalog, both partly unconfirmed).

The worst case counts two saves: an asynchronous interval save may have started just
before the notice, and the stop save first waits for it (training/tpu_training/
train.py, `_save` -> `_report_written(wait=True)` -> `CheckpointManager.sync()`), so
the stop is one execution, the save in flight, then the stop save. Together they must
fit the shares of the notice they may use; the rest is the agent noticing, the
process exit and the OS shutting down.
"""

from __future__ import annotations

from model import catalog
from model.settings.schema import NodeSettings, StackSettings
from tpu_training.config import (
    EXECUTION_SHARE_OF_NOTICE,
    JobConfig,
    checkpoint_bytes,
    train_flops_per_example,
)


def stop_save_seconds(job: JobConfig) -> float:
    """About how long one checkpoint of `job` takes to write to GCS."""
    return checkpoint_bytes(job) / catalog.GCS_STREAM_WRITE_BYTES_PER_SECOND


def step_seconds(node: NodeSettings, job: JobConfig) -> float:
    """About how long one training step of `job` takes on `node`'s slice."""
    return job.globalBatchSize * train_flops_per_example(job) / (
        catalog.peak_flops_per_second(node.tpu) * catalog.ASSUMED_FLOPS_UTILIZATION)


def longest_execution_seconds(node: NodeSettings, job: JobConfig) -> float:
    """The longest execution the job runs on `node`: bounded by the notice's share,
    but never less than one step, nor more than stepsPerExecution steps."""
    step = step_seconds(node, job)
    bound = catalog.stop_notice_seconds(spot=node.spot) * EXECUTION_SHARE_OF_NOTICE
    return min(job.stepsPerExecution * step, max(bound, step))


SAVES_IN_A_STOP = 2  # the interval save still being written, then the stop save


def worst_stop_seconds(node: NodeSettings, job: JobConfig) -> float:
    """The longest stop: the execution under way, a save in flight, the stop save."""
    return longest_execution_seconds(node, job) + SAVES_IN_A_STOP * stop_save_seconds(job)


def stop_save_warning(node: NodeSettings, job: JobConfig) -> str | None:
    """Why `node`'s stop (the execution under way, a save in flight, then the stop
    save) may not fit its notice, or None when it fits."""
    notice = catalog.stop_notice_seconds(spot=node.spot)
    budget = notice * (EXECUTION_SHARE_OF_NOTICE + catalog.STOP_SAVE_SHARE_OF_NOTICE)
    execution, save = longest_execution_seconds(node, job), stop_save_seconds(job)
    if worst_stop_seconds(node, job) <= budget:
        return None
    rate = catalog.GCS_STREAM_WRITE_BYTES_PER_SECOND / 2**20
    return (f"node {node.name}: a checkpoint of job {node.job} ({job.model}) is about "
            f"{checkpoint_bytes(job) / 2**20:,.0f} MiB, about {save:.0f} s to GCS at "
            f"{rate:.0f} MiB/s; a stop may take an execution of up to {execution:.1f} s, "
            f"an interval save still being written and the stop save ({execution + 2 * save:.0f}"
            f" s); a {'spot' if node.spot else 'standard'} node's stop notice is {notice} s "
            f"and the stop should fit in {budget:.1f} s, so a preemption may lose the work "
            f"since the last periodic checkpoint (checkpointEveryMinutes bounds it)")


def stack_warnings(settings: StackSettings) -> list[str]:
    """The stop-save warning of every node of the stack that has one."""
    return [w for node, job in settings.node_jobs if (w := stop_save_warning(node, job))]
