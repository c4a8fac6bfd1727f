"""The core of the verbs that talk to the TPU API (preflight, status, wait, recover,
janitor, logs): status.py reads and analyses, status_views.py renders; the verbs are in
ops/commands/tpu.py. May import ops.terminal, components, model, cloud and below."""
