#!/usr/bin/env bash
# Build every Python environment tpu-stack needs, idempotently (docs/design.md,
# "Two Python environments"):
#   .venv/infra   pulumi, pulumi-gcp, policy, ops CLI, infra tests
#   .venv/tf218   training package + TensorFlow 2.18 (the TPU image's TF) + tf-keras
#   .venv/tf220   training package + TensorFlow 2.20 (newest tensorflow-tpu) + tf-keras
#   .venv/image   TensorFlow 2.18 only: stands in for the TPU VM image in agent tests
# Usage: scripts/setup.sh [infra|tf218|tf220|image ...]   (default: all)
#        scripts/setup.sh --which [ENV...]   the Python each (default: every one) would be
#                                            built with; builds nothing
#        scripts/setup.sh --stamp [ENV...]   the stamp each would be built under (its
#                                            .venv/ENV/.installed): a hash of its pip
#                                            arguments and of the requirement files they
#                                            name, so a changed file rebuilds; builds nothing
#        scripts/setup.sh --check-references ENV [MODULE=PACKAGE...]
#                                            that each test reference (default: every one
#                                            of REFERENCE_IMPORTS) imports in .venv/ENV
#                                            (exit 2 naming each that does not); builds
#                                            nothing
set -euo pipefail
cd "$(dirname "$0")/.."

# The Pythons each environment runs on (README.md, "Two commands", states them). PyPI's
# wheels decide (pip download --no-deps --only-binary=:all: --python-version 3.X, checked
# 2026-12): tensorflow-cpu 2.18.1 has wheels for cp39-cp312, 2.20.0 for cp39-cp313; the
# training package requires 3.10 (training/pyproject.toml, the TPU image's Python); the
# infra side 3.11 (.ci/run proves it), with no upper bound: pulumi and pulumi-gcp are pure
# Python and grpcio has cp314 wheels.
python_range() {  # NAME -> "MIN MAX WHY" (MAX - : none)
  case $1 in
    infra) echo "3.11 - pulumi" ;;
    tf218|image) echo "3.10 3.12 TensorFlow 2.18" ;;
    tf220) echo "3.10 3.13 TensorFlow 2.20" ;;
    *) echo "setup.sh: unknown environment '$1' (infra, tf218, tf220, image)" >&2; return 2 ;;
  esac
}

minor_of() { local major=${1%%.*} minor=${1#*.}; echo $((major * 100 + ${minor%%.*})); }

version_of() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }

# .venv/image stands in for the TPU VM image, whose Python is 3.10 (docs/tpu-facts.md):
# it takes a python3.10 when there is one, unless $PYTHON names another.
IMAGE_PYTHON=3.10

pyenv_pythons() {  # [3.X]: pyenv's Pythons (of that minor), newest first
  find "${PYENV_ROOT:-$HOME/.pyenv}/versions" -maxdepth 3 -path "*/${1:-3.}*/bin/python" \
    2>/dev/null | sort -rV || true
}

candidate_pythons() {
  # NAME: $PYTHON first; for image, python3.10 on PATH, then pyenv's 3.10; then python3,
  # python3.X on PATH and pyenv's, newest first.
  [[ -n ${PYTHON:-} ]] && echo "$PYTHON"
  if [[ $1 == image ]]; then
    command -v "python$IMAGE_PYTHON" || true
    pyenv_pythons "$IMAGE_PYTHON."
  fi
  echo python3
  local minor
  for minor in 13 12 11 10; do command -v "python3.$minor" || true; done
  pyenv_pythons
}

pick_python() {
  # The first candidate Python in NAME's range, or one line naming what to install.
  local name=$1 low high why python version minor first="" first_version=""
  read -r low high why < <(python_range "$name")
  while read -r python; do
    version=$(version_of "$python") || continue
    [[ -z $first ]] && first=$python first_version=$version
    minor=$(minor_of "$version")
    if ((minor >= $(minor_of "$low"))) && { [[ $high == - ]] || ((minor <= $(minor_of "$high"))); }; then
      echo "$python"
      return 0
    fi
  done < <(candidate_pythons "$name")
  local wanted="$low-$high" reason="no Python found"
  [[ $high == - ]] && wanted="$low or newer"
  if [[ -n $first ]]; then
    reason="$first is Python $first_version"
    [[ $high != - ]] && (($(minor_of "$first_version") > $(minor_of "$high"))) &&
      reason="$why has no wheels for $first_version"
  fi
  echo "setup.sh: .venv/$name needs Python $wanted ($reason); install one or set PYTHON" >&2
  return 2
}

quiet_pip() {
  # pip.conf on some machines names local indexes that do not exist; drop the noise.
  "$@" 2> >(grep -v "is neither a file nor a directory" >&2)
}

progress() {
  # One line per package pip collects, then one while it installs: a build takes minutes.
  sed -un -E -e "s|^Collecting ([^ ]+).*|  .venv/$1: collecting \1|p" \
    -e "s|^Processing ([^ ]*/)?([^/ ]+).*|  .venv/$1: collecting \2|p" \
    -e "s|^Installing collected packages.*|  .venv/$1: installing (this takes a while)|p"
}

requirement_files() {
  # PIP_ARGS...: the files pip reads the package list from: each `-r FILE` and the
  # files it includes with `-r` in turn, and the pyproject.toml of a local project
  # (`./training[tf218,test]`).
  local arg previous="" path
  for arg in "$@"; do
    if [[ $previous == -r && -f $arg ]]; then  # a missing one: pip says so
      echo "$arg"
      sed -n -E 's/^-r[[:space:]]*([^[:space:]]+).*/\1/p' "$arg" | while read -r path; do
        requirement_files -r "$(dirname "$arg")/$path"
      done
    elif [[ $arg == ./* ]]; then
      path=${arg%%\[*}
      [[ -f $path/pyproject.toml ]] && echo "$path/pyproject.toml"
    fi
    previous=$arg
  done
}

stamp_of() {
  # PIP_ARGS...: what an environment was built from, the arguments and the contents of
  # the requirement files they name (a changed file rebuilds the environment).
  local file
  {
    printf '%s\n' "$@"
    requirement_files "$@" | while read -r file; do
      printf '== %s\n' "$file"
      cat "$file"
    done
  } | sha256sum | cut -c1-16
}

make_venv() {
  # make_venv NAME PIP_ARGS... [-- NO_DEPS_PIP_ARGS...]: the packages after `--` are
  # installed in a second step with --no-deps.
  local name=$1; shift
  local stamp=".venv/$name/.installed"
  local want
  want=$(stamp_of "$@")
  local with_deps=() no_deps=()
  while [[ $# -gt 0 && $1 != -- ]]; do with_deps+=("$1"); shift; done
  if [[ $# -gt 0 ]]; then shift; no_deps=("$@"); fi
  if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
    return 0
  fi
  local started=$SECONDS python
  python=$(pick_python "$name") || exit 2
  echo "setting up .venv/$name ($("$python" --version 2>&1), $python)" >&2
  # A fresh venv: installing over an old one keeps what the old package list pulled in
  # (e.g. the second TensorFlow tf-keras brought).
  rm -rf ".venv/$name"
  "$python" -m venv ".venv/$name"
  quiet_pip ".venv/$name/bin/python" -m pip install --quiet --upgrade pip
  quiet_pip ".venv/$name/bin/python" -m pip install --progress-bar off "${with_deps[@]}" |
    progress "$name" >&2
  if [[ ${#no_deps[@]} -gt 0 ]]; then
    quiet_pip ".venv/$name/bin/python" -m pip install --quiet --no-deps "${no_deps[@]}"
  fi
  echo "$want" > "$stamp"
  echo "  .venv/$name ready in $((SECONDS - started)) s" >&2
}

TEST_REFERENCES=('tensorflow-hub==0.16.1' 'tf-models-official==2.18.0' 'gin-config==0.5.0'
                 'scipy==1.14.1')

# What the BERT tests check the job against (training/tests/test_bert_checkpoint.py,
# test_bert_hub.py), as MODULE=PACKAGE: every setup of a training environment imports each
# and stops, naming the package, when one fails. They go in with --no-deps (above), so a
# dependency of theirs that goes missing shows here, not as a test that cannot run.
REFERENCE_IMPORTS=(
  tensorflow_hub=tensorflow-hub
  official.nlp.modeling=tf-models-official
  official.nlp.tools.tf2_bert_encoder_checkpoint_converter=tf-models-official
  official.legacy.bert.configs=tf-models-official
  gin=gin-config
  scipy=scipy
)

# Imports each MODULE=PACKAGE argument; one line per failure, naming the package and why.
IMPORT_CHECK='
import importlib, sys
failed = 0
for pair in sys.argv[2:]:
    module, package = pair.split("=", 1)
    try:
        importlib.import_module(module)
    except Exception as error:
        failed += 1
        print(f"setup.sh: .venv/{sys.argv[1]}: {package} does not import ({module}: "
              f"{type(error).__name__}: {error}); reinstall it, or what it names, with "
              "scripts/setup.sh after rm -r .venv/" + sys.argv[1], file=sys.stderr)
sys.exit(2 if failed else 0)
'

check_references() {
  # NAME [MODULE=PACKAGE...]: every reference (default: REFERENCE_IMPORTS) imports in
  # .venv/NAME, with Keras 2 as the job has it (tpu_training/tf_env.py).
  local name=$1; shift
  [[ $# -gt 0 ]] || set -- "${REFERENCE_IMPORTS[@]}"
  TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL=3 ".venv/$name/bin/python" -c "$IMPORT_CHECK" \
    "$name" "$@"
}

pip_args() {
  # NAME: the pip arguments of its environment, into PIP_ARGS.
  case $1 in
    infra) PIP_ARGS=(-r requirements-dev.txt -e ./training) ;;
    # tf-keras declares a dependency on `tensorflow`, which pip would install beside
    # tensorflow-cpu (two TensorFlows in one venv); it needs nothing else, so it goes
    # in with --no-deps, as the agent installs it on a node.
    # tensorflow-hub and tf-models-official (the BERT export's and checkpoint tests'
    # references, training/pyproject.toml) pull a full tensorflow likewise: --no-deps,
    # with gin-config and scipy, which official.nlp.modeling imports.
    tf218) PIP_ARGS=(-e './training[tf218,test]' -- 'tf-keras>=2.18,<2.19' "${TEST_REFERENCES[@]}") ;;
    tf220) PIP_ARGS=(-e './training[tf220,test]' -- 'tf-keras>=2.20,<2.21' "${TEST_REFERENCES[@]}") ;;
    image) PIP_ARGS=('tensorflow-cpu>=2.18,<2.19') ;;
  esac
}

setup_one() {
  pip_args "$1"
  make_venv "$1" "${PIP_ARGS[@]}"
  # Every time, not only after a build: a package removed since is caught too.
  if [[ $1 == tf2* ]]; then check_references "$1" || exit 2; fi
}

ALL_ENVS=(infra tf218 tf220 image)
if [[ ${1:-} == --which ]]; then  # the Python each environment would be built with
  shift
  [[ $# -gt 0 ]] || set -- "${ALL_ENVS[@]}"
  for env in "$@"; do python_range "$env" > /dev/null || exit 2; done
  status=0
  for env in "$@"; do
    if python=$(pick_python "$env"); then echo "$env $python"; else status=2; fi
  done
  exit $status
fi
if [[ ${1:-} == --stamp ]]; then  # what each environment's .installed would hold
  shift
  [[ $# -gt 0 ]] || set -- "${ALL_ENVS[@]}"
  for env in "$@"; do python_range "$env" > /dev/null || exit 2; done
  for env in "$@"; do pip_args "$env"; echo "$env $(stamp_of "${PIP_ARGS[@]}")"; done
  exit 0
fi
if [[ ${1:-} == --check-references ]]; then  # the test references import in ENV
  [[ $# -ge 2 ]] || { echo "usage: setup.sh --check-references ENV [MODULE=PACKAGE...]" >&2; exit 2; }
  python_range "$2" > /dev/null || exit 2
  env=$2; shift 2
  check_references "$env" "$@" || exit 2
  exit 0
fi
if [[ $# -eq 0 ]]; then set -- "${ALL_ENVS[@]}"; fi
for env in "$@"; do python_range "$env" > /dev/null || exit 2; done  # a typo before any build
for env in "$@"; do setup_one "$env"; done
