#!/usr/bin/env bash
# The main job on the embedded default stack (dev), offline: the plan of what
# `pulumi up` would create and what it costs, then a rehearsal of the node's
# whole boot on this machine (GCS emulator, metadata server, the real job on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh infra image  # the image's Python also writes the synthetic dataset
stack=${1:-dev}
./tpuctl plan --stack "$stack"
./tpuctl rehearse --stack "$stack"
