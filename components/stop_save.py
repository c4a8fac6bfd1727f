"""Will a node's stop save fit in its stop notice? A preview warning if not.

Pure and without TensorFlow: the checkpoint's bytes from the job schema's table
(training/tpu_training/config.py, `checkpoint_bytes`), the notice from the node's
provisioning and the GCS write rate from components/catalog.py.
"""

from __future__ import annotations

from components import catalog
from components.settings import NodeSettings, StackSettings
from tpu_training.config import JobConfig, checkpoint_bytes


def stop_save_seconds(job: JobConfig) -> float:
    """About how long one checkpoint of `job` takes to write to GCS."""
    return checkpoint_bytes(job) / catalog.GCS_STREAM_WRITE_BYTES_PER_SECOND


def stop_save_warning(node: NodeSettings, job: JobConfig) -> str | None:
    """Why `node`'s stop save may not fit its notice, or None when it fits."""
    notice = catalog.stop_notice_seconds(spot=node.spot)
    budget = notice * catalog.STOP_SAVE_SHARE_OF_NOTICE
    seconds = stop_save_seconds(job)
    if seconds <= budget:
        return None
    rate = catalog.GCS_STREAM_WRITE_BYTES_PER_SECOND / 2**20
    return (f"node {node.name}: a checkpoint of job {node.job} ({job.model}) is about "
            f"{checkpoint_bytes(job) / 2**20:,.0f} MiB, about {seconds:.0f} s to GCS at "
            f"{rate:.0f} MiB/s; a {'spot' if node.spot else 'standard'} node's stop notice is "
            f"{notice} s and its save should fit in {budget:.0f} s, so a preemption may lose "
            f"the work since the last periodic checkpoint (checkpointEveryMinutes bounds it)")


def stack_warnings(settings: StackSettings) -> list[str]:
    """The stop-save warning of every node of the stack that has one."""
    nodes = [(node, settings.job(node.job)) for node in settings.nodes]
    nodes += [(node, team.job(node.job)) for team in settings.teams.values()
              for node in team.nodes]
    return [warning for node, job in nodes if (warning := stop_save_warning(node, job))]
