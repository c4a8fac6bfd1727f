"""A TPU node on this machine (loopback metadata server, GCS emulator, a worker running the real
bootstrap) and `tpuctl rehearse`, which boots a stack's node on it; bench/boot.py and the agent's
end-to-end tests share them."""
