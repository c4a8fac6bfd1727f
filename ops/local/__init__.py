"""A TPU node on this machine: a loopback metadata server, a GCS emulator and
a worker that runs the real bootstrap. `tpuctl rehearse`, bench/boot.py and
the agent's end-to-end tests share them."""
