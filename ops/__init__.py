"""tpuctl: the ops CLI (plan, preflight, status, wait, recover, janitor, logs, rehearse)."""
