"""`tpuctl`'s verbs, thin: each module's `register(app)` adds its commands and options
and calls the core (ops/plan/, ops/tpu/, ops/rehearse/). Only ops/cli.py imports these."""
