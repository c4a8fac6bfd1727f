"""tpuctl, the ops CLI: cli.py (the verbs), plan/ (offline plan), tpu/ (TPU API verbs), local/."""
