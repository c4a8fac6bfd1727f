"""The core of `tpuctl rehearse`: a stack's nodes booted on this machine from its
offline plan, over the fakes of ops/local/. May import ops.plan, ops.tpu, ops.local."""
