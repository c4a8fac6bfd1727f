"""Can a node's hang cost less than its checkpoint interval? A preview warning if not.

The node agent stops a job whose execution goes longer than its deadline without a
progress line (docs/design.md, "Deadlines"), and the job starts again from its last
checkpoint: a hang costs the deadline plus the work since that checkpoint, up to one
interval. When the deadline alone is longer than the interval, every hang loses more
than an interval. Pure, like model/stop_save.py, whose estimates it reuses:

- the deadline: `progressDeadlineSeconds`, else the agent's default for an execution,
  a multiple of the longest one (stop_save's estimate), never under the floor
  (node_agent/deadlines.py holds both numbers);
- the interval: `checkpointEveryMinutes`, the bound on lost work the job is given in
  time. Saves by `checkpointEverySteps` may come sooner (seconds apart on a TPU for a
  small model); measured against those, every deadline the agent can keep without
  stopping healthy jobs would warn.

A `progressDeadlineSeconds` under the longest execution is warned of too (a healthy
job would be stopped as hung), and one under the stop (that execution, then the save:
stop_save's estimates), which it bounds as well: the save would be killed. The job
schema bounds it (`MAX_PROGRESS_DEADLINE_SECONDS`: the stop must end inside the unit's
systemd stop timeout), so no advice here names more than that.
"""

from __future__ import annotations

from model.settings.schema import NodeSettings, StackSettings
from model.stop_save import longest_execution_seconds, stop_save_seconds
from node_agent.deadlines import EXECUTION_FLOOR_SECONDS, EXECUTION_MULTIPLE
from tpu_training.config import MAX_PROGRESS_DEADLINE_SECONDS, JobConfig


def execution_deadline_seconds(node: NodeSettings, job: JobConfig) -> float:
    """The agent's deadline for one execution of `job` on `node`, in steady state."""
    if job.progressDeadlineSeconds is not None:
        return job.progressDeadlineSeconds
    return max(EXECUTION_FLOOR_SECONDS, EXECUTION_MULTIPLE * longest_execution_seconds(node, job))


def checkpoint_interval_seconds(job: JobConfig) -> float:
    """The longest time training runs between two interval checkpoints."""
    return 60 * job.checkpointEveryMinutes


def progress_deadline_warning(node: NodeSettings, job: JobConfig) -> str | None:
    """Why a hang of `node`'s job would lose more than it must, or None."""
    deadline = execution_deadline_seconds(node, job)
    execution = longest_execution_seconds(node, job)
    given = job.progressDeadlineSeconds is not None
    source = "progressDeadlineSeconds" if given else (
        f"the agent's default: {EXECUTION_MULTIPLE:g} x its longest execution of about "
        f"{execution:.1f} s, at least {EXECUTION_FLOOR_SECONDS:.0f} s")
    if given and deadline < execution:
        return (f"node {node.name}: job {node.job}'s progressDeadlineSeconds ({deadline:g} s) "
                f"is shorter than its longest execution (about {execution:.1f} s): the agent "
                f"would stop a healthy job as hung; {_enough(execution)}")
    stop = execution + stop_save_seconds(job)
    if given and deadline < stop:
        return (f"node {node.name}: job {node.job}'s progressDeadlineSeconds ({deadline:g} s) "
                f"also bounds its stop, which takes about {stop:.0f} s (an execution, then "
                f"the save): the agent would kill the job before its stop save is written")
    interval = checkpoint_interval_seconds(job)
    if deadline <= interval:
        return None
    return (f"node {node.name}: job {node.job}'s deadline for an execution without progress "
            f"is {deadline:.0f} s ({source}), longer than its checkpoint interval of "
            f"{interval:.0f} s (checkpointEveryMinutes), so a hang would always lose more "
            f"than one interval (up to {deadline + interval:.0f} s); give "
            f"progressDeadlineSeconds of at most "
            f"{min(interval, MAX_PROGRESS_DEADLINE_SECONDS):.0f} s (above the longest "
            f"execution), or fewer stepsPerExecution")


def _enough(execution: float) -> str:
    """The advice for a deadline under the longest execution, within the schema's bound."""
    wanted = EXECUTION_MULTIPLE * execution
    if wanted <= MAX_PROGRESS_DEADLINE_SECONDS:
        return f"give at least {EXECUTION_MULTIPLE:g} times that"
    return (f"give more, up to the {MAX_PROGRESS_DEADLINE_SECONDS:g} s the key allows, or "
            f"leave it unset (the agent's default: {EXECUTION_MULTIPLE:g} times the longest "
            f"execution), or fewer stepsPerExecution")


def stack_warnings(settings: StackSettings) -> list[str]:
    """The progress-deadline warning of every node of the stack that has one."""
    return [w for node, job in settings.node_jobs
            if (w := progress_deadline_warning(node, job))]
