"""Fakes only: a TPU node on this machine (loopback metadata server, GCS emulator, a
worker running the real bootstrap). `tpuctl rehearse` (ops/rehearse/), bench/boot.py and
the agent's end-to-end tests use them. May import node_agent; nothing else of ops."""
