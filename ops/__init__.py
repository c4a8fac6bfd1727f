"""tpuctl, the ops CLI, as xpk lays out a CLI: cli.py imports every verb by name;
parser/ the typer app; commands/ the thin verbs; the core they call: plan/ (the offline
plan), tpu/ (the TPU API: status reading and its views, wait, recover, janitor, logs),
rehearse/ (a node booted here); local/ the fakes (metadata server, GCS emulator, local
node). Arrows go cli -> commands -> core -> local, never back (tests/test_layers.py).
May import every layer below: policy, components, model, functions, cloud, node_agent,
tpu_training.
"""

import warnings

# google-api-core warns on every import about Python 3.11's end of life (2027): silenced
# here, before any piece of ops imports it.
warnings.filterwarnings("ignore", message="You are using a Python version",
                        category=FutureWarning)
