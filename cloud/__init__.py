"""Clients of Google Cloud's APIs (no pulumi): credentials and the one TPU client.

Used by the dynamic providers in `components/`, by `tpuctl` and by the functions.
May import nothing else of tpu-stack.
"""
