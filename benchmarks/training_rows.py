"""The harness's training rows alone: ``python -m benchmarks.training_rows --device cuda [--out FILE]``.

The same code as the training table of ``python -m benchmarks.run`` (``run.training`` for both sizes, fp32,
bf16, and fp16 on a GPU, each with fairseq's loss and with the plugin's fused loss), then the vocabulary
step alone (projection, loss, backward) with either loss and the bound it puts on the iwslt fp32 row
(``run.training_limits``), for checking a change to the loss or the training path without the whole grid.
Prints the rows and writes them as JSON (``training_<device>.json`` in the results folder by default,
``training_<device>_quick.json`` with ``--quick``);
BENCHMARKS.md is left alone.
"""

import argparse
import json
from pathlib import Path

import torch

from . import measure, run
from .arguments import device_name, positive_int, size_names
from .pair import SIZES


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", type=device_name, default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--repeats", type=positive_int, default=5, help="timed repeats per configuration (medians)")
    p.add_argument("--src-len", type=int, default=25)
    p.add_argument("--sizes", type=size_names, default="iwslt,wmt_en_de", help=f"comma-separated, of {sorted(SIZES)}")
    p.add_argument("--quick", action="store_true", help="16 sentences an update, 2 repeats: to check the script")
    p.add_argument("--out", default=None, help="JSON file (default benchmarks/results/training_<device>[_quick].json)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    run.add_alone_flags(p)  # on a CPU the fp32 rows again with each model in a fresh process, as the harness
    measure.add_malloc_flag(p)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    measure.use_threads(args.threads)
    machine = run.describe_run(args, device)
    peaks = run.matmul_peaks(device)
    rows = [row for name in args.sizes.split(",") for row in run.training(name, args, device, peaks)]
    vocab_s, bounds = run.training_limits(args, device, rows, peaks)
    print(f"vocabulary step (iwslt, s): {vocab_s}")
    # a --quick check writes beside the full run's file, as benchmarks.run --quick does, not over it
    tag = args.device + ("_quick" if args.quick else "")
    out = Path(args.out) if args.out else run.RESULTS / f"training_{tag}.json"
    result = {"machine": machine, "args": vars(args), "peaks": peaks, "vocabulary_step_s": vocab_s}
    result.update(training=rows, bounds=bounds)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    run.log(f"wrote {out}")


if __name__ == "__main__":
    main()
