"""Two ways of training the same model on real data, side by side: words/s and the loss curve, same seed, same
batches. ``--compare bf16`` (the default): fp32 against ``--bf16`` on a CPU; ``--compare fused-loss``: fairseq's
``label_smoothed_cross_entropy`` against the plugin's ``fused_label_smoothed_cross_entropy``; ``--compare malloc``:
glibc's default malloc (``MALLOC_MMAP_MAX_=65536``, its default value, set so that the training entry leaves malloc
alone) against the training entry's ``keep_freed_memory``.

    python -m benchmarks.bf16_curve DATA_BIN [--compare bf16|fused-loss|malloc] [--swap] [--updates 200] [--out FILE]

Trains the model twice from the same initialization with ``python -m fairseq_convs2s.train`` (stock
fairseq-train cannot run ``--bf16`` on a CPU), then scores both final checkpoints with ``fairseq-validate`` in
fp32 on the valid set. Prints, and writes as JSON: the median words/s of the logged intervals (the first one,
warm-up, left out), the training loss every ``--log-interval`` updates side by side, and the two validation
losses. DATA_BIN is a ``fairseq-preprocess`` folder, e.g. the Multi30k recipe's ``outputs/multi30k/data-bin``.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .arguments import data_bin_path, positive_int

REPO = Path(__file__).resolve().parent.parent
USER_DIR = REPO / "fairseq_convs2s"
_RECORD = re.compile(r"\| train_inner \| (\{.*\})\s*$")
_VALID = re.compile(r"\| valid on '[^']*' subset \| loss ([0-9.]+) \| nll_loss ([0-9.]+)")
# the two runs of each comparison: (name, extra flags, environment); later flags win over the common ones
COMPARISONS = {
    "bf16": (("fp32", [], {}), ("bf16", ["--bf16"], {})),
    "fused-loss": (
        ("label_smoothed_cross_entropy", [], {}),
        ("fused_label_smoothed_cross_entropy", ["--criterion", "fused_label_smoothed_cross_entropy"], {}),
    ),
    "malloc": (("glibc_default", [], {"MALLOC_MMAP_MAX_": "65536"}), ("freed_memory_kept", [], {})),
}


def train(data: Path, save_dir: Path, args, extra, env):
    cmd = [sys.executable, "-m", "fairseq_convs2s.train", str(data), "--user-dir", str(USER_DIR)]
    cmd += ["--arch", args.arch, "--optimizer", "nag", "--momentum", "0.99", "--lr", "0.25", "--clip-norm", "0.1"]
    cmd += ["--dropout", "0.2", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
    cmd += ["--max-tokens", "4000", "--max-update", str(args.updates), "--seed", "1", "--cpu"]
    cmd += ["--disable-validation", "--no-epoch-checkpoints", "--save-dir", str(save_dir)]
    cmd += ["--log-format", "json", "--log-interval", str(args.log_interval)]
    cmd += extra
    print("$ " + " ".join([f"{k}={v}" for k, v in env.items()] + cmd[1:]), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
    if proc.returncode != 0:  # its own words say why, not a CalledProcessError
        raise SystemExit(f"training failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return [json.loads(m.group(1)) for m in map(_RECORD.search, proc.stdout.splitlines()) if m]


def validate(data: Path, checkpoint: Path):
    cmd = [sys.executable, "-m", "fairseq_cli.validate", str(data), "--user-dir", str(USER_DIR), "--cpu"]
    cmd += ["--task", "translation"]  # fairseq-validate has no default task
    cmd += ["--path", str(checkpoint), "--max-tokens", "4000", "--required-batch-size-multiple", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    match = _VALID.search(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not match:
        raise SystemExit(f"fairseq-validate failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return float(match.group(1)), float(match.group(2))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=data_bin_path)
    parser.add_argument("--updates", type=positive_int, default=200)
    parser.add_argument("--log-interval", type=int, default=20)
    parser.add_argument("--arch", default="convs2s_iwslt_de_en")
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="bf16")
    parser.add_argument("--swap", action="store_true", help="train the second of the pair first")
    parser.add_argument("--out", type=Path, help="JSON file (default benchmarks/results/<compare>_curve[_swap].json)")
    args = parser.parse_args(argv)
    if args.updates < 2 * args.log_interval:  # the first interval is left out as warm-up: one more must follow
        parser.error(f"--updates {args.updates} gives fewer than two --log-interval {args.log_interval} intervals")
    name = args.compare.replace("-", "_") + ("_curve_swap" if args.swap else "_curve")
    out = args.out or REPO / "benchmarks" / "results" / f"{name}.json"
    runs = COMPARISONS[args.compare][::-1] if args.swap else COMPARISONS[args.compare]
    results = {"data": str(args.data), "updates": args.updates, "arch": args.arch, "compare": args.compare}
    with tempfile.TemporaryDirectory() as checkpoints:  # the checkpoints are not kept
        for name, extra, env in runs:
            save_dir = Path(checkpoints) / name
            records = train(args.data, save_dir, args, extra, env)
            wps = [float(r["wps"]) for r in records[1:]]
            results[name] = {
                "words_per_s": statistics.median(wps),
                "loss": {int(r["num_updates"]): float(r["loss"]) for r in records},
                "valid_loss_nll": validate(args.data, save_dir / "checkpoint_last.pt"),
            }
    (a, *_), (b, *_) = runs
    results["speedup"] = results[b]["words_per_s"] / results[a]["words_per_s"]
    print(f"\n{args.arch}, {args.updates} updates on {args.data}")
    print(
        f"words/s: {a} {results[a]['words_per_s']:.0f}, {b} {results[b]['words_per_s']:.0f} = {results['speedup']:.2f}x"
    )
    print(f"update | train loss, {a} | train loss, {b}")
    for update in results[a]["loss"]:
        print(f"{update:6d} | {results[a]['loss'][update]:.3f} | {results[b]['loss'].get(update, float('nan')):.3f}")
    for name, *_ in runs:
        loss, nll = results[name]["valid_loss_nll"]
        print(f"valid after {args.updates} updates, {name} model (scored in fp32): loss {loss:.3f}, nll {nll:.3f}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
