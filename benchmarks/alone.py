"""Each model's training update in a process of its own, as one ``fairseq-train`` run has it.

``python -m benchmarks.alone [--sizes iwslt] [--rounds 3] [--updates 15] [--threads 0] [--keep-freed-memory]``
starts, per round, one fresh Python process per variant, in turn: fconv with fairseq's
``label_smoothed_cross_entropy``, convs2s with it, and convs2s with the plugin's fused criterion (the harness's
pair, ``benchmarks.pair``: the same weights; 64 x 26 target tokens, dropout 0.2, backward, clip 0.1, NAG:
``measure.TrainStep``). Each process builds its models, runs two updates untimed, then times ``--updates`` updates
one after the other and reports their median; the variants' figures are the medians over the rounds, beside each
round's ratio to fconv. The other training benchmarks alternate both models' updates in one process, where one
model's allocations shape the malloc state the next update meets (glibc's mmap threshold moves with what was freed
last); here no update runs beside another model.
"""

import argparse
import json
import time
from typing import Dict, List

import torch

from fairseq_convs2s.train import keep_freed_memory

from . import measure
from .arguments import positive_int, size_names
from .pair import SIZES

# variant: (model, the fused criterion)
VARIANTS = {"fconv": ("fconv", False), "convs2s": ("convs2s", False), "convs2s-fused": ("convs2s", True)}


def update_seconds(variant: str, size_name: str, updates: int, warmup: int = 2) -> List[float]:
    """Seconds of each of ``updates`` consecutive training updates of ``variant`` at ``size_name``, after
    ``warmup`` untimed ones; the other model of the pair is dropped before the first update."""
    model_name, fused = VARIANTS[variant]
    fconv, convs2s, sample, pad = measure.training_pair(size_name, torch.device("cpu"))
    model = fconv if model_name == "fconv" else convs2s
    del fconv, convs2s
    step = measure.TrainStep(model, sample, pad, fused_loss=fused)
    for _ in range(warmup):
        step()
    seconds = []
    for _ in range(updates):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    return seconds


def round_medians(size_name: str, rounds: int, updates: int, keep: bool, threads: int = 0) -> Dict[str, List[float]]:
    """Per variant, the median update seconds of each round's fresh process (variants in turn within a round)."""
    medians: Dict[str, List[float]] = {v: [] for v in VARIANTS}
    for _ in range(rounds):
        for variant in VARIANTS:
            medians[variant].append(measure.median(_worker(variant, size_name, updates, keep, threads)))
    return medians


def summary(medians: Dict[str, List[float]]) -> Dict[str, Dict[str, object]]:
    """Per variant: the median over the rounds, its speed-up over fconv's median, and each round's ratio to fconv
    with their median (a round's processes run within a minute or two; the machine's pace drifts more over a
    whole run)."""
    fconv = measure.median(medians["fconv"])
    out = {}
    for variant, m in medians.items():
        per_round = [f / s for f, s in zip(medians["fconv"], m)]
        out[variant] = {
            "seconds_per_update": measure.median(m),
            "round_seconds": m,
            "speedup": fconv / measure.median(m),
            "round_speedups": per_round,
            "round_speedup_median": measure.median(per_round),
        }
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=size_names, default="iwslt", help=f"comma-separated, of {sorted(SIZES)}")
    p.add_argument("--rounds", type=positive_int, default=3, help="fresh processes per variant, variants in turn")
    p.add_argument("--updates", type=positive_int, default=15, help="timed updates per process (their median)")
    p.add_argument("--threads", type=int, default=0, help="torch threads in each process (0: torch's default)")
    measure.add_malloc_flag(p)
    p.add_argument("--worker", nargs=2, metavar=("VARIANT", "SIZE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    kept = args.keep_freed_memory and keep_freed_memory()
    measure.use_threads(args.threads)
    if args.worker:
        print(json.dumps(update_seconds(*args.worker, args.updates)))
        return
    print(f"{measure.machine_line(kept)}; one process per variant and round", flush=True)
    for size_name in args.sizes.split(","):
        rows = summary(round_medians(size_name, args.rounds, args.updates, args.keep_freed_memory, args.threads))
        for v, r in rows.items():
            print(
                f"{size_name} {v:14s} {1e3 * r['seconds_per_update']:6.0f} ms an update, {r['speedup']:.2f}x fconv's "
                f"median; per round {', '.join(f'{1e3 * s:.0f}' for s in r['round_seconds'])} ms, "
                f"{', '.join(f'{x:.2f}' for x in r['round_speedups'])}x (median {r['round_speedup_median']:.2f}x)"
            )


def _worker(variant: str, size_name: str, updates: int, keep: bool, threads: int = 0) -> List[float]:
    """The update seconds of ``update_seconds`` run in a fresh Python process (malloc kept and threads as asked)."""
    args = ["--worker", variant, size_name, "--updates", str(updates), "--threads", str(threads)]
    return measure.fresh_process_json("benchmarks.alone", args + (["--keep-freed-memory"] if keep else []))


if __name__ == "__main__":
    main()
