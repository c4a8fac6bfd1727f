#!/usr/bin/env bash
# The main job on the embedded default stack (dev), offline: the plan of what
# `pulumi up` would create and what it costs, then a rehearsal of the node's
# whole boot on this machine (GCS emulator, metadata server, the real job on CPU);
# it ends with the commands to try next.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh infra image  # the image's Python also writes the synthetic dataset
stack=${1:-dev}
./tpuctl plan --stack "$stack"
./tpuctl rehearse --stack "$stack"
cat <<NEXT

Next:
  ./tpuctl status --stack $stack --offline    the rehearsed node as \`tpuctl status\` shows it
  ./tpuctl logs --stack $stack --offline      its agent's and job's log
  scripts/test.sh                          every check (README.md, "Two commands")
  README.md, "The real path"               \`pulumi up\` on GCP, your own stack
NEXT
