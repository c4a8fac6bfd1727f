"""tpu-stack's node agent: the standard-library program every TPU worker runs at boot.

Modules by concern: `contract` (metadata keys, exit codes: what infra code imports),
`common` (errors, retries, HTTP), `metadata`, `storage`, `desired` (the release to
run), `install`, `environment` (the job's variables), `job` and `job_lines`
(supervision), `devices`, `status`, `goodput`, `watchers`, `lifecycle` (the job's
life as one table), `life` (its states' observers and its actions' handlers), `agent`
(the wiring) and `build` (the zipapp inside the startup script; infra side only).

`import node_agent` gives the contract's names and, lazily, `startup_script`, so
`import node_agent as agent; agent.STATUS_KEY, agent.startup_script()` works.
"""

from __future__ import annotations

from node_agent.contract import *  # noqa: F403  (the contract is this package's interface)


def __getattr__(name: str) -> object:
    if name == "startup_script":  # only infra code builds the script: no zipfile on the node
        from node_agent.build import startup_script

        return startup_script
    raise AttributeError(f"module 'node_agent' has no attribute {name!r}")
