#!/usr/bin/env bash
# Build every Python environment tpu-stack needs, idempotently (docs/design.md,
# "Two Python environments"):
#   .venv/infra   pulumi, pulumi-gcp, policy, ops CLI, infra tests
#   .venv/tf218   training package + TensorFlow 2.18 (the TPU image's TF) + tf-keras
#   .venv/tf220   training package + TensorFlow 2.20 (newest tensorflow-tpu) + tf-keras
#   .venv/image   TensorFlow 2.18 only: stands in for the TPU VM image in agent tests
# Usage: scripts/setup.sh [infra|tf218|tf220|image ...]   (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

quiet_pip() {
  # pip.conf on some machines names local indexes that do not exist; drop the noise.
  "$@" 2> >(grep -v "is neither a file nor a directory" >&2)
}

progress() {
  # One line per package pip collects, then one while it installs: a build takes minutes.
  sed -un -E -e "s|^Collecting ([^ ]+).*|  .venv/$1: collecting \1|p" \
    -e "s|^Processing (.*/)?([^/ ]+).*|  .venv/$1: collecting \2|p" \
    -e "s|^Installing collected packages.*|  .venv/$1: installing (this takes a while)|p"
}

make_venv() {
  # make_venv NAME PIP_ARGS... [-- NO_DEPS_PIP_ARGS...]: the packages after `--` are
  # installed in a second step with --no-deps.
  local name=$1; shift
  local stamp=".venv/$name/.installed"
  local want
  want=$(printf '%s\n' "$@" | sha256sum | cut -c1-16)
  local with_deps=() no_deps=()
  while [[ $# -gt 0 && $1 != -- ]]; do with_deps+=("$1"); shift; done
  if [[ $# -gt 0 ]]; then shift; no_deps=("$@"); fi
  if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
    return 0
  fi
  local started=$SECONDS minimum=3.10  # the agent and the job: the TPU image's Python
  [[ $name == infra ]] && minimum=3.11   # README.md, "Two commands"; .ci/run proves both
  if ! "$PYTHON" -c "import sys; sys.exit(sys.version_info[:2] < (${minimum/./, }))"; then
    echo "setup.sh: .venv/$name needs Python $minimum or newer; $PYTHON is" \
      "$("$PYTHON" --version 2>&1). Set PYTHON to a newer one." >&2
    exit 2
  fi
  echo "setting up .venv/$name ($("$PYTHON" --version))" >&2
  # A fresh venv: installing over an old one keeps what the old package list pulled in
  # (e.g. the second TensorFlow tf-keras brought).
  rm -rf ".venv/$name"
  "$PYTHON" -m venv ".venv/$name"
  quiet_pip ".venv/$name/bin/python" -m pip install --quiet --upgrade pip
  quiet_pip ".venv/$name/bin/python" -m pip install --progress-bar off "${with_deps[@]}" |
    progress "$name" >&2
  if [[ ${#no_deps[@]} -gt 0 ]]; then
    quiet_pip ".venv/$name/bin/python" -m pip install --quiet --no-deps "${no_deps[@]}"
  fi
  echo "$want" > "$stamp"
  echo "  .venv/$name ready in $((SECONDS - started)) s" >&2
}

setup_one() {
  case $1 in
    infra) make_venv infra -r requirements-dev.txt -e ./training ;;
    # tf-keras declares a dependency on `tensorflow`, which pip would install beside
    # tensorflow-cpu (two TensorFlows in one venv); it needs nothing else, so it goes
    # in with --no-deps, as the agent installs it on a node.
    tf218) make_venv tf218 -e './training[tf218,test]' -- 'tf-keras>=2.18,<2.19' ;;
    tf220) make_venv tf220 -e './training[tf220,test]' -- 'tf-keras>=2.20,<2.21' ;;
    image) make_venv image 'tensorflow-cpu>=2.18,<2.19' ;;
    *) echo "setup.sh: unknown environment '$1' (infra, tf218, tf220, image)" >&2; exit 2 ;;
  esac
}

if [[ $# -eq 0 ]]; then set -- infra tf218 tf220 image; fi
for env in "$@"; do setup_one "$env"; done
