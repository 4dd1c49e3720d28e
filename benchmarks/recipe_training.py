"""Words/s of the recipes' own training commands, convs2s against fconv, at several thread counts, side by side.

    python -m benchmarks.recipe_training DATA_BIN [--threads 1,2] [--updates 150] [--rounds 2] [--variants ...]

Each run is the ``fairseq-train`` command ``examples/multi30k/run.py`` gives the model (through
``python -m fairseq_convs2s.train`` on a CPU): the paper's optimizer, ``--max-tokens 4000``, dropout 0.2, and the
fastest path the recipe picks for the model on this machine (``examples/recipes/training.py``: convs2s with the
fused criterion and one embedding table, fconv with fairseq's criterion; bf16 on a CPU that computes it
natively), the paper's schedule (no validation, so the rate stays 0.25). ``--variants`` adds the recipe's choices
undone, to measure each: ``convs2s-fairseq-loss`` (fairseq's criterion), ``convs2s-separate`` (three embedding
tables), ``convs2s-fp32``, ``fconv-fp32``; and ``fconv-fused``, ``fconv-fp32-fused``: fconv with the plugin's
criterion (its loss from the stored logits in one pass).

The runs alternate: for each round, for each thread count, one process per variant, the order of the variants
reversed every round. A run's words/s is the median of fairseq's ``wps`` over its log intervals after the first
(warm-up); the table gives the median over rounds and each variant's ratio to the first. DATA_BIN is a
``fairseq-preprocess`` folder, e.g. the Multi30k recipe's ``outputs/multi30k/data-bin``. Writes
``benchmarks/results/recipe_training.json``.
"""

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "examples"))

from recipes import training  # noqa: E402

from benchmarks.arguments import data_bin_path, positive_int, positive_ints  # noqa: E402

# name -> (--arch, the recipe's --precision, a --criterion replacing the recipe's choice, --separate-embeddings)
VARIANTS = {
    "fconv": ("fconv_iwslt_de_en", "auto", None, False),
    "convs2s": ("convs2s_iwslt_de_en", "auto", None, False),
    "convs2s-fairseq-loss": ("convs2s_iwslt_de_en", "auto", training.FAIRSEQ_LOSS, False),
    "convs2s-separate": ("convs2s_iwslt_de_en", "auto", None, True),
    "convs2s-fp32": ("convs2s_iwslt_de_en", "fp32", None, False),
    "fconv-fp32": ("fconv_iwslt_de_en", "fp32", None, False),
    "fconv-fused": ("fconv_iwslt_de_en", "auto", training.FUSED, False),
    "fconv-fp32-fused": ("fconv_iwslt_de_en", "fp32", training.FUSED, False),
}
_RECORD = re.compile(r"\| train_inner \| (\{.*\})\s*$")


def command(
    data: Path, variant: str, updates: int, interval: int, save_dir: str, extra: str = "", validate: bool = False
):
    """The recipe's training command for ``variant`` (Multi30k's flags), cut to ``updates`` updates.

    Without ``validate`` it times the updates alone: no validation, no checkpoints.
    """
    import torch

    arch, precision, criterion, separate = VARIANTS[variant]
    given = ["--criterion", criterion] if criterion else []
    fastest, notes = training.fastest_flags(arch, given, precision, torch.cuda.is_available())
    fastest += given  # the variant's criterion replaces the recipe's choice
    embeddings, embedding_notes = training.embedding_flags(arch, [], True, separate)  # Multi30k shares its table
    fastest, notes = fastest + embeddings, notes + embedding_notes
    cmd = [sys.executable, "-m", "fairseq_convs2s.train", str(data), "--user-dir", str(REPO / "fairseq_convs2s")]
    cmd += ["--arch", arch, "--lr", "0.25", "--dropout", "0.2", "--max-tokens", "4000"]
    cmd += [*training.optimization_flags(), "--max-update", str(updates), *fastest]
    cmd += ["--seed", "1", "--cpu", "--save-dir", save_dir]
    cmd += [] if validate else ["--disable-validation", "--no-save"]
    cmd += ["--log-format", "json", "--log-interval", str(interval), *shlex.split(extra)]
    return [str(c) for c in cmd], notes


def words_per_second(cmd, threads: int) -> float:
    """The median ``wps`` of one training run's log intervals, the first left out."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"training failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    records = [json.loads(m.group(1)) for m in map(_RECORD.search, proc.stdout.splitlines()) if m]
    if len(records) < 2:
        raise SystemExit(f"fewer than two log intervals: raise --updates\n{proc.stdout[-2000:]}")
    return statistics.median(float(r["wps"]) for r in records[1:])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=data_bin_path)
    parser.add_argument(
        "--threads", type=positive_ints, default="1,2", help="comma-separated thread counts (default: %(default)s)"
    )
    parser.add_argument("--updates", type=positive_int, default=150)
    parser.add_argument("--log-interval", type=int, default=25)
    parser.add_argument("--rounds", type=positive_int, default=2)
    parser.add_argument("--variants", default="fconv,convs2s", help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--train-args", default="", help="more fairseq-train flags for every run; they win")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "recipe_training.json")
    args = parser.parse_args(argv)
    thread_counts = [int(t) for t in args.threads.split(",")]
    variants = args.variants.split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    runs = {(threads, name): [] for threads in thread_counts for name in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for threads in thread_counts:
                for name in variants if round_ % 2 == 0 else variants[::-1]:
                    cmd, notes = command(args.data, name, args.updates, args.log_interval, tmp, args.train_args)
                    if round_ == 0 and threads == thread_counts[0]:
                        print(f"{name}: {'; '.join(n for n in notes if not n.startswith('threads'))}", flush=True)
                    wps = words_per_second(cmd, threads)
                    runs[threads, name].append(wps)
                    print(f"round {round_ + 1}, {threads} thread(s), {name}: {wps:.0f} words/s", flush=True)
    first = variants[0]
    print(f"\n| threads | {' | '.join(f'{name} words/s' for name in variants)} | runs ({'; '.join(variants)}) |")
    print("|---|" + "---|" * (len(variants) + 1))
    rows = []
    for threads in thread_counts:
        medians = {name: statistics.median(runs[threads, name]) for name in variants}
        cells = [f"{medians[first]:.0f}"]
        cells += [f"{medians[name]:.0f} (**{medians[name] / medians[first]:.2f}x**)" for name in variants[1:]]
        each = "; ".join(", ".join(f"{w:.0f}" for w in runs[threads, name]) for name in variants)
        print(f"| {threads} | {' | '.join(cells)} | {each} |")
        rows.append({"threads": threads, **{name: runs[threads, name] for name in variants}})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"data": str(args.data), "updates": args.updates, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
