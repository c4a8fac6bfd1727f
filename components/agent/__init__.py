"""The node agent: the `startup-script` every TPU worker runs at boot.

`startup_script()` is the exact metadata value: the bash bootstrap
(`bootstrap.sh`) with the standard-library agent (`agent.py`) embedded, so the
node needs nothing but its image's Python and TensorFlow. The metadata keys are
the contract with components/tpu_node.py (docs/design.md, "What a TPU node carries
in metadata").
"""

from __future__ import annotations

from pathlib import Path

from components.agent.agent import (
    JOB_KEY,
    NODE_KEY,
    PACKAGE_KEY,
    PACKAGE_SHA256_KEY,
    RUNTIME_KEY,
    STARTUP_SCRIPT_KEY,
    STATUS_KEY,
    WORKERS_KEY,
)

__all__ = ["JOB_KEY", "MAX_METADATA_VALUE_BYTES", "NODE_KEY", "PACKAGE_KEY", "PACKAGE_SHA256_KEY",
           "RUNTIME_KEY", "STARTUP_SCRIPT_KEY", "STATUS_KEY", "WORKERS_KEY", "startup_script"]

HERE = Path(__file__).resolve().parent
AGENT_MARKER = "@AGENT_SOURCE@"
HEREDOC_END = "TPU_STACK_AGENT_SOURCE"
# Compute Engine metadata: "the size of each value must be less than or equal to
# 262144 bytes (256 KiB)" (cloud.google.com/compute/docs/reference/rest/v1/Metadata).
MAX_METADATA_VALUE_BYTES = 262_144


def startup_script() -> str:
    """The bootstrap with the agent embedded: the `startup-script` metadata value."""
    bootstrap = (HERE / "bootstrap.sh").read_text()
    agent = (HERE / "agent.py").read_text().rstrip("\n")
    if HEREDOC_END in agent.splitlines():
        raise ValueError(f"agent.py has a line {HEREDOC_END!r}, which would end its heredoc")
    script = bootstrap.replace(AGENT_MARKER, agent, 1)
    size = len(script.encode())
    if size > MAX_METADATA_VALUE_BYTES:
        raise ValueError(f"startup-script is {size} bytes; GCP allows "
                         f"{MAX_METADATA_VALUE_BYTES} per metadata value")
    return script
