#!/usr/bin/env bash
# There, on a lent GPU machine (Python 3.12 with a CUDA torch, no registry): DEVELOPERS.md's list, one stage a call,
# each well inside the device tool's 10 minutes, from the kit that scripts/gpu_kit.sh packed here.
#
#   scripts/gpu_checks.sh bench    # benchmarks.run --device cuda
#   scripts/gpu_checks.sh distributed  # scripts/check_distributed_gpu.py
#   scripts/gpu_checks.sh recipe   # the Multi30k recipe, fairseq-generate --fp16 and --bf16 against fp32,
#                                  # benchmarks.bf16_generation
#   scripts/gpu_checks.sh budget   # the Multi30k recipe under update budgets, six runs at once: the anneal fraction
#                                  # of --lr-scheduler budget, the plateau schedule cut at the same update count,
#                                  # and the plateau rule to convergence (UPDATES=3000 2000 by default)
#   scripts/gpu_checks.sh embeddings [UPDATES]  # --share-all-embeddings against separate tables, fconv beside
#                                  # (ARCHS="convs2s fconv"), seeds 1 and 2, --update-budget UPDATES (3500)
#   scripts/gpu_checks.sh seeds    # the recipe's defaults against its earlier ones (the plateau rule, separate
#                                  # embeddings), three seeds each, each scored with checkpoint_best.pt and the average
#   scripts/gpu_checks.sh pending  # what has never run on a GPU, in one call (a session's 15 minutes): the recipe's
#                                  # defaults with seed 3, trained through python -m fairseq_convs2s.train, beside
#                                  # the distributed check
#   scripts/gpu_checks.sh forms    # benchmarks.train_forms: the compiled update against the eager one, bf16 and fp32
#   scripts/gpu_checks.sh memory   # benchmarks.checkpoint_activations: --checkpoint-activations' memory and time,
#                                  # the harness's batch and a 256 x 101-token one (DEVICE=cpu: on the CPU)
#   scripts/gpu_checks.sh runtime  # the fairseq-free runtime against fairseq-generate on the GPU
#
# How long each stage takes: DEVELOPERS.md's table.
#
# With the device tool: run(command="scripts/gpu_checks.sh bench", carry=[".gpu_kit"]). Logs and results go to
# $OUT (the tool's folder that comes back; ./gpu_out where it is unset), at most 8 files a stage.
set -uo pipefail
cd "$(dirname "$0")/.."

STAGE=${1:?usage: scripts/gpu_checks.sh bench|distributed|recipe|budget|embeddings|seeds|pending|forms|memory|runtime}
KIT=${KIT:-.gpu_kit}
OUT=${OUT:-gpu_out}
PY=${PY:-python3}
mkdir -p "$OUT"

# fairseq and what it needs beside the machine's torch, installed beside it (never over it): --no-deps
if ! "$PY" -c "import fairseq" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$KIT"/whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c "import sys, torch, fairseq; print('python', sys.version.split()[0], 'torch', torch.__version__,
'fairseq', fairseq.__version__, 'cuda', torch.cuda.is_available())"
  git log -1 --format='commit %h %s' 2>/dev/null
} | tee "$OUT/machine.txt"

step() {  # step NAME SECONDS CMD...: run CMD with a time limit, its output to $OUT/NAME.log; say how it ended
  local name=$1 limit=$2
  shift 2
  echo "[gpu_checks] $name: $*"
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "[gpu_checks] $name: exit $rc after $((SECONDS - start)) s (log: $OUT/$name.log)"
  tail -n 25 "$OUT/$name.log"
  return $rc
}

# the run folders of the stages that compare recipe settings, one per run: $RUNS/NAME. They outlive a call (a stage
# cut by the device tool's limit resumes its runs on the same warm machine) and are named by the code they ran, so
# that a folder another version of the plugin or the recipes left is never taken for this one's.
CODE=$(find fairseq_convs2s examples -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-12)
RUNS=/tmp/gpu_checks/$CODE/$STAGE
echo "[gpu_checks] run folders: $RUNS"
multi30k() {  # multi30k NAME SECONDS ARGS...: examples/multi30k/run.py ARGS with a time limit in $RUNS/NAME, its
  # console added to $OUT/NAME.log (a stage's recipe() empties that log first; seeds runs three commands into it)
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$PY" examples/multi30k/run.py --raw-dir "$KIT/multi30k" --out "$RUNS/$name" "$@" \
    >>"$OUT/$name.log" 2>&1
}

case "$STAGE" in
  bench)
    step bench 560 "$PY" -m benchmarks.run --device cuda
    cp BENCHMARKS.md benchmarks/results/cuda.json benchmarks/results/scaling_cuda.png "$OUT"/ 2>/dev/null
    ;;
  distributed)
    step distributed 300 "$PY" scripts/check_distributed_gpu.py
    ;;
  recipe)  # more arguments go to the recipe: DEVICE=cpu scripts/gpu_checks.sh recipe --train-args "--max-epoch 1"
    # tries the stage out on a CPU
    run=outputs/multi30k_gpu
    step recipe 300 "$PY" examples/multi30k/run.py --raw-dir "$KIT/multi30k" --out "$run" "${@:2}" || exit 1
    for precision in fp32 fp16 bf16 fp32 fp16 bf16; do  # twice each, in turn: the first of all warms CUDA up
      flag=$([ "$precision" != fp32 ] && echo "--$precision")
      "$PY" -m fairseq_cli.generate "$run/data-bin" --user-dir fairseq_convs2s \
        --path "$run/checkpoints/checkpoint_avg.pt" --gen-subset test --beam 5 --batch-size 128 \
        --required-batch-size-multiple 1 --remove-bpe sentencepiece --scoring sacrebleu $flag \
        >"$OUT/generate_$precision.txt" 2>&1
      for what in Translated BLEU; do
        line=$(grep -h "$what" "$OUT/generate_$precision.txt" | sed -E "s/.*($what)/\1/")
        echo "[gpu_checks] generate $precision: $line"
      done
    done
    hyps() { grep '^H-' "$1" | sed 's/^H-//' | sort -n | cut -f3; }
    for precision in fp16 bf16; do
      echo "[gpu_checks] $precision hypotheses that differ from fp32's: $(diff <(hyps "$OUT/generate_fp32.txt") \
        <(hyps "$OUT/generate_$precision.txt") | grep -c '^<') of $(grep -c '^H-' "$OUT/generate_fp32.txt")"
    done
    step bf16_generation 180 "$PY" -m benchmarks.bf16_generation --device "${DEVICE:-cuda}" --repeats 3 --out "$OUT"
    ;;
  budget)  # more arguments go to every recipe run, before the run's own (a try on a CPU: --max-train-lines 300);
    # every run with the separate embeddings of the runs in examples/multi30k/README.md, "The schedule"
    EXTRA=(--separate-embeddings "${@:2}")
    read -r big small <<<"${UPDATES:-3000 2000}"
    recipe() {  # recipe NAME ARGS...: one recipe run in the background, its console and its curve in $OUT/NAME.log
      local name=$1
      shift
      (
        : >"$OUT/$name.log"
        multi30k "$name" 540 --workers 2 "${EXTRA[@]}" "$@"
        echo "[gpu_checks] $name: exit $? $(grep -h '^test (' "$OUT/$name.log")"
        cat "$RUNS/$name/curve.tsv" >>"$OUT/$name.log" 2>/dev/null
      ) &
    }
    recipe plateau --update-budget 0
    recipe "plateau_$big" --update-budget 0 --train-args "--max-update $big"
    for fraction in 1.0 0.5 0.25; do
      recipe "anneal${fraction}_$big" --update-budget "$big" --train-args "--anneal-fraction $fraction"
    done
    recipe "anneal0.5_$small" --update-budget "$small" --train-args "--anneal-fraction 0.5"
    wait
    ;;
  embeddings)  # one embedding table against separate ones under --update-budget ${2:-3500}, seeds 1 and 2, both
    # models (ARCHS="convs2s fconv"; fconv: its own tables, and its decoder's tied), all runs at once
    updates=${2:-3500}
    recipe() {  # recipe NAME ARGS...: one recipe run in the background; its validation and test lines at the end
      local name=$1
      shift
      (
        : >"$OUT/$name.log"
        multi30k "$name" 520 --workers 1 --update-budget "$updates" "$@"
        echo "[gpu_checks] $name: exit $? $(grep "valid on 'valid'" "$OUT/$name.log" | tail -1 |
          grep -oE 'ppl [0-9.]+|num_updates [0-9]+' | tr '\n' ' ')$(grep -h '^test (' "$OUT/$name.log")"
      ) &
    }
    fconv="--arch fconv_iwslt_de_en"
    for seed in 1 2; do
      if [[ " ${ARCHS:-convs2s fconv} " == *" convs2s "* ]]; then
        recipe "one_table_${updates}_seed$seed" --train-args "--seed $seed"
        recipe "separate_${updates}_seed$seed" --train-args "--seed $seed" --separate-embeddings
      fi
      if [[ " ${ARCHS:-convs2s fconv} " == *" fconv "* ]]; then
        recipe "fconv_${updates}_seed$seed" --train-args "--seed $seed $fconv"
        recipe "fconv_tied_decoder_${updates}_seed$seed" --train-args "--seed $seed $fconv --share-input-output-embed"
      fi
    done
    wait
    ;;
  seeds)  # the recipe's defaults and its earlier ones, three seeds each, six runs at once; each run's test score
    # for checkpoint_best.pt and for the average besides the one its choice tested
    recipe() {  # recipe NAME SEED ARGS...
      local name=$1 seed=$2
      shift 2
      (
        : >"$OUT/$name.log"
        for checkpoint in auto best avg; do
          multi30k "$name" 500 --workers 2 --checkpoint "$checkpoint" --train-args "--seed $seed" "$@"
        done
        echo "[gpu_checks] $name: $(cut -f1 "$RUNS/$name/checkpoints/chosen.txt") chosen;" \
          "$(grep -h '^test (' "$OUT/$name.log" | tr '\n' ' ')"
      ) &
    }
    for seed in 1 2 3; do
      recipe "default_seed$seed" "$seed"
      recipe "plateau_separate_seed$seed" "$seed" --update-budget 0 --separate-embeddings
    done
    wait
    ;;
  pending)  # more arguments go to the recipe (a try on a CPU: DEVICE=cpu ... --max-train-lines 300 --update-budget 20)
    (
      : >"$OUT/default_seed3.log"
      multi30k default_seed3 480 --workers 2 --train-args "--seed 3" "${@:2}"
      echo "[gpu_checks] default_seed3: exit $? $(cut -f1 "$RUNS/default_seed3/checkpoints/chosen.txt" 2>/dev/null)" \
        "chosen; $(grep -h '^test (' "$OUT/default_seed3.log")"
    ) &
    [ "${DEVICE:-cuda}" = cuda ] && step distributed 300 "$PY" scripts/check_distributed_gpu.py
    wait
    ;;
  forms)
    for dtype in bf16 fp32; do
      step "forms_$dtype" 280 "$PY" -m benchmarks.train_forms --device cuda --variants torch-compile,fairseq-loss \
        --dtype "$dtype"
    done
    ;;
  runtime)
    step runtime 400 "$PY" -m benchmarks.runtime --device cuda --out "$OUT"
    ;;
  memory)
    ck=("$PY" -m benchmarks.checkpoint_activations --device "${DEVICE:-cuda}" --rounds 3)
    step memory_harness 320 "${ck[@]}" --json "$OUT/checkpoint_activations_harness.json"
    step memory_big 250 "${ck[@]}" --sizes wmt_en_de --sentences 256 --length 100 \
      --json "$OUT/checkpoint_activations_big.json"
    ;;
  *)
    echo "unknown stage $STAGE: bench, distributed, recipe, budget, embeddings, seeds, pending, forms, memory or runtime" >&2
    exit 2
    ;;
esac
