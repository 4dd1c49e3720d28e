#!/usr/bin/env bash
# Here, on a machine with pip and a registry: pack what the GPU checks need into .gpu_kit/ (ignored by git), for a
# GPU machine that reaches no registry and already has Python 3.12 with a CUDA torch (this workplace's lent ones).
#
#   scripts/gpu_kit.sh                       # .gpu_kit/whl: the wheels fairseq needs beside that torch
#                                            # .gpu_kit/multi30k: the recipe's raw corpus
#   KIT_PYTHON=3.12 MULTI30K=../shared/data/multi30k scripts/gpu_kit.sh
#
# Then, there, scripts/gpu_checks.sh runs DEVELOPERS.md's list from it (carry .gpu_kit with the working tree).
# Only wheels: pip builds nothing there. fairseq-fixed publishes a cp312 manylinux wheel; antlr4-python3-runtime is
# a source package, made a wheel here (pure Python). The rest of what fairseq imports (numpy, regex, sacrebleu,
# sentencepiece, scikit-learn, tqdm, pyyaml) is in the image already (KINDS.md of the device tool lists it).
set -euo pipefail
cd "$(dirname "$0")/.."

KIT=${KIT:-.gpu_kit}
KIT_PYTHON=${KIT_PYTHON:-3.12}
MULTI30K=${MULTI30K:-../shared/data/multi30k}
PY=${PY:-python3}
WHEELS=(fairseq-fixed==0.12.3.1 hydra-core==1.3.2 omegaconf==2.3.0 bitarray==3.8.0 cffi==2.0.0 pycparser==2.23)

rm -rf "$KIT/whl"
mkdir -p "$KIT/whl"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
echo "[kit] downloading wheels for CPython $KIT_PYTHON: ${WHEELS[*]}"
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --implementation cp \
  --python-version "$KIT_PYTHON" "${platforms[@]}" -d "$KIT/whl" "${WHEELS[@]}"
echo "[kit] building antlr4-python3-runtime==4.9.3 into a wheel (omegaconf's parser; a source package on PyPI)"
"$PY" -m pip wheel -q --disable-pip-version-check --no-deps -w "$KIT/whl" antlr4-python3-runtime==4.9.3

if [ -d "$MULTI30K" ]; then
  rm -rf "$KIT/multi30k"
  cp -r "$MULTI30K" "$KIT/multi30k"
  echo "[kit] copied $MULTI30K to $KIT/multi30k"
else
  echo "[kit] no $MULTI30K: the recipe stage of scripts/gpu_checks.sh will need --raw-dir files of its own"
fi
ls -1 "$KIT/whl"
echo "[kit] $(du -sh "$KIT" | cut -f1) in $KIT (a device call carries 64 MiB at most)"
