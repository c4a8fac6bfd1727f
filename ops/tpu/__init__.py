"""The verbs that talk to the TPU API (preflight, status, wait, recover, janitor, logs)."""
