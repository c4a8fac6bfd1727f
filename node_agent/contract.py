"""The node's contract with the infrastructure: metadata keys, notice paths, exit codes.

docs/design.md, "What a TPU node carries in metadata" and "Exit codes". Infra code
(components/tpu_node.py, ops/) imports the key names from here; the agent reads
nothing else from the node's metadata.
"""

from __future__ import annotations

import enum

# -- what the TpuNode component sets ----------------------------------------------
STARTUP_SCRIPT_KEY = "startup-script"
# gs://<artifacts>/releases/<node-id>/: the prefix under which every release of the
# node's code lands (contract C1); stable for the node's life.
RELEASE_KEY = "tpu-stack-release"
WORKERS_KEY = "tpu-stack-workers"
STATUS_KEY = "tpu-stack-status"
NODE_KEY = "tpu-stack-node"  # the TPU node's own id (instance/name is the worker VM's)
RUNTIME_KEY = "tpu-stack-runtime-version"  # the node's runtimeVersion, e.g. tpu-vm-tf-2.18.0-pjrt
# The node's run-time limits (node_agent/limits.py), whole seconds; absent: no limit.
MAX_RUNTIME_KEY = "tpu-stack-max-runtime"
IDLE_STOP_KEY = "tpu-stack-idle-stop"

# -- what others set on a running node through the TPU API ------------------------
# A stop request (any text, the reason): the agent stops the job with a save and does
# not start it again while the key is set. The budget-stop function sets it
# (functions/budget_stop/main.py STOP_KEY) before it deletes a team's nodes.
STOP_REQUEST_KEY = "tpu-stack-stop"

# -- what the TPU runtime puts on every worker --------------------------------------
WORKER_NUMBER_KEY = "agent-worker-number"
NETWORK_ENDPOINTS_KEY = "worker-network-endpoints"
TPU_ENV_KEY = "tpu-env"
GUEST_NAMESPACE = "tpu-stack"

# -- a release object (contract C1): release-<sha16 of its content>.json ----------
RELEASE_OBJECT_PREFIX = "release-"
RELEASE_OBJECT_SUFFIX = ".json"
RELEASE_POLL_SECONDS = 30.0

# Compute Engine metadata: "the size of each value must be less than or equal to
# 262144 bytes (256 KiB)" (cloud.google.com/compute/docs/reference/rest/v1/Metadata;
# docs/tpu-facts.md). The startup script is one value.
MAX_METADATA_VALUE_BYTES = 262_144

# Seam S2 (issue 39): the agent starts the job with this variable naming a file in its
# run/ folder; a job whose stdout or stderr breaks (EPIPE: its agent died) reopens both
# onto that file, prints `tpu_training output_orphaned log=<path>` there and trains on.
# A new agent stops it by run/job.pid with SIGTERM (a save, exit 75) and reads the file.
JOB_LOG_ENV = "TPU_STACK_JOB_LOG"
ORPHAN_LOG = "job-output.log"  # in <root>/run/

# The job's exit codes (docs/design.md, "The training package").
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2  # a bad setting: permanent
EXIT_BAD_RECORDS = 65  # records that do not fit the model: permanent
EXIT_NO_DATA = 66  # trainData matches no file yet: wait for it
EXIT_TRANSIENT = 69  # TPU not ready or in use, storage 5xx: retry
EXIT_PREEMPTED = 75  # stopped on SIGTERM after saving a checkpoint
EXIT_STOP_SAVE_FAILED = 76  # stopped on SIGTERM, the stop save failed (a pod losing hosts)
PERMANENT_EXITS = (EXIT_USAGE, EXIT_BAD_RECORDS)
STOPPED_EXITS = (EXIT_PREEMPTED, EXIT_STOP_SAVE_FAILED)


class JobState(str, enum.Enum):
    """The job's `state` in the node's status (docs/design.md, "Status"): the values are
    the strings published, so a status reads the same as before the enum."""

    IDLE = "idle"  # a pod worker other than 0: worker 0's client runs the job
    INSTALLING = "installing"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"  # stopped by the VM or systemd; resumes at the next start
    STOPPED = "stopped"  # a stop request or a limit holds the job
    RETRYING = "retrying"
    WAITING_FOR_DATA = "waiting-for-data"
    HUNG = "hung"

    def __str__(self) -> str:
        return self.value


# A job in one of these is not finished: it runs, or runs again when the node (or its
# agent) comes back, so the time since such a status counts as infrastructure_recovery
# (docs/design.md, "Goodput": "the time the node was down since the last status an
# unfinished agent wrote"). `preempted` is one: the job resumes from its checkpoint.
# Plain strings: a status read back from JSON is compared with them (a str enum member
# hashes by its name, so it would not be found in a set of members).
UNFINISHED_STATES = frozenset(state.value for state in JobState) - {"idle", "succeeded", "failed",
                                                                 "stopped"}
