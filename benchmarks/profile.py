"""Where one model's time goes, operator by operator: ``torch.profiler`` over training updates or a generation run.

``python -m benchmarks.profile [--impl convs2s|fconv] [--size iwslt|wmt_en_de] [--what train|generate]
[--dtype bf16] [--fused-loss] [--threads N] [--keep-freed-memory]`` builds
the pair of ``benchmarks.pair`` (same weights), warms up, then profiles ``--runs`` training updates (64 x 26
target tokens, as the harness) or beam-5 generation runs (``--batch`` sentences a batch, 8 sentences), and
prints the operators by self CPU time, per update or run. The profiler adds its own overhead, so the totals
are above the harness's timings; the shares are what it is for.

``--keep-freed-memory`` profiles under the malloc setting of ``python -m fairseq_convs2s.train``, the training
command: without it, under glibc's default, a loss that stores N x V log-probabilities (fairseq's) also pays
their fresh pages every update, which the command never does (examples/multi30k/README.md, "The fastest training
by default").
"""

import argparse

import torch

from fairseq_convs2s.train import keep_freed_memory

from . import measure
from .arguments import positive_int
from .pair import SIZES, build_pair, make_dictionary


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", choices=("convs2s", "fconv"), default="convs2s")
    p.add_argument("--size", choices=sorted(SIZES), default="iwslt")
    p.add_argument("--what", choices=("train", "generate"), default="train")
    p.add_argument("--batch", type=positive_int, default=1, help="sentences per generation batch")
    p.add_argument("--runs", type=positive_int, default=3)
    p.add_argument("--rows", type=int, default=20)
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="train: bf16 as fairseq's --bf16")
    p.add_argument("--fused-loss", action="store_true", help="train: the loss by the plugin's fused criterion")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    measure.add_malloc_flag(p)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    kept = args.keep_freed_memory and keep_freed_memory()
    print(measure.machine_line(kept))
    cpu = torch.device("cpu")
    size = SIZES[args.size]
    dictionary = make_dictionary(size.vocab)
    fconv, convs2s = build_pair(size, dictionary, dropout=0.2 if args.what == "train" else 0.0)
    model = convs2s if args.impl == "convs2s" else fconv
    if args.what == "train":
        sample = measure.train_sample(dictionary, 64, 25, cpu)
        dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
        run = measure.TrainStep(model, sample, dictionary.pad(), dtype, fused_loss=args.fused_loss)
    else:
        model = measure.prepare_for_generation(model, 5)  # as fairseq-generate prepares it
        samples = measure.source_batches(dictionary, 8, 25, args.batch, cpu)
        run, _ = measure.generator_fn(model, dictionary, samples, 5, 25)
    run()  # warm-up
    with torch.profiler.profile() as prof:
        for _ in range(args.runs):
            run()
    print_operators(prof, f"{args.impl}, {args.size} size, {args.what}, {args.dtype}", args.runs, args.rows)


def print_operators(prof, title: str, runs: int, rows: int) -> None:
    """The ``rows`` operators of a finished ``torch.profiler`` run by self CPU time, per run, as a markdown table."""
    events = prof.key_averages()
    total_ms = sum(e.self_cpu_time_total for e in events) / 1e3 / runs
    print(f"{title}: {total_ms:.0f} ms of self CPU time per run ({runs} runs)")
    print("| operator | self CPU ms per run | share | calls per run |")
    print("|---|---|---|---|")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:rows]:
        ms = e.self_cpu_time_total / 1e3 / runs
        print(f"| {e.key} | {ms:.1f} | {ms / total_ms:.1%} | {e.count / runs:.0f} |")


if __name__ == "__main__":
    main()
