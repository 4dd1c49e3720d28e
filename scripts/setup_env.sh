#!/usr/bin/env bash
# Create ./.venv and install everything the plugin, its tests and its demo need, on a machine that has only
# Python 3.11. Safe to run again: it does nothing once the same requirements are installed.
#
#   PYTHON=python3.11 TORCH_SPEC="torch==2.13.0" scripts/setup_env.sh
#
# Why the order matters: fairseq-fixed compiles C++ extensions against torch; with pip's build isolation it would
# download a second, multi-GB torch to build against. So torch, cython and numpy go in first, then fairseq-fixed
# with --no-build-isolation.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}  # on this project's machines a CPU build of 2.13 lies on disk
FAIRSEQ_SPEC=${FAIRSEQ_SPEC:-fairseq-fixed==0.12.3.1}
VENV=${VENV:-.venv}

stamp="$VENV/.fairseq-convs2s-installed"
want="$(cat setup.py scripts/setup_env.sh | sha256sum | cut -c1-16) $TORCH_SPEC $FAIRSEQ_SPEC"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "[setup] $VENV is up to date"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }

echo "[setup] installing $TORCH_SPEC, cython, numpy"
pip install "$TORCH_SPEC" cython numpy setuptools wheel
echo "[setup] building $FAIRSEQ_SPEC against that torch (takes about 3 minutes on 2 cores)"
pip install --no-build-isolation "$FAIRSEQ_SPEC"
echo "[setup] installing fairseq-convs2s (editable) with its test, demo and recipes extras"
pip install --no-build-isolation -e ".[test,demo,recipes]"
echo "$want" > "$stamp"
echo "[setup] done: $("$VENV/bin/python" -c 'import torch, fairseq; print("torch", torch.__version__, "fairseq", fairseq.__version__)' 2>/dev/null)"
