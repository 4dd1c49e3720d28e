"""The harness's training rows alone: ``python -m benchmarks.training_rows --device cuda [--out FILE]``.

The same code as the training table of ``python -m benchmarks.run`` (``run.training`` for both sizes, fp32,
bf16, and fp16 on a GPU, each with fairseq's loss and with the plugin's fused loss), preceded by the
vocabulary step alone (projection, loss, backward) with either loss, for checking a change to the loss
without the whole grid. Prints the rows and writes them as JSON (``training_<device>.json`` in the results
folder by default); BENCHMARKS.md is left alone.
"""

import argparse
import json
from pathlib import Path

import torch

from . import measure, run
from .pair import SIZES, make_dictionary


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per configuration (medians)")
    p.add_argument("--src-len", type=int, default=25)
    p.add_argument("--sizes", default="iwslt,wmt_en_de", help=f"comma-separated, of {sorted(SIZES)}")
    p.add_argument("--quick", action="store_true", help="16 sentences an update, 2 repeats: to check the script")
    p.add_argument("--out", default=None, help="JSON file (default benchmarks/results/training_<device>.json)")
    run.add_malloc_flag(p)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    machine = run.describe_run(args, device)
    size = SIZES["iwslt"]
    dictionary = make_dictionary(size.vocab)
    sample = measure.train_sample(dictionary, 16 if args.quick else 64, args.src_len, device)
    vocab_s = measure.vocabulary_step_seconds(sample, size.out_embed_dim, size.vocab, dictionary.pad(), 11, device)
    print(f"vocabulary step (iwslt, s): {vocab_s}")
    peaks = run.matmul_peaks(device)
    cfg = argparse.Namespace(quick=args.quick, repeats=args.repeats, src_len=args.src_len)
    rows = [row for name in args.sizes.split(",") for row in run.training(name, cfg, device, peaks)]
    bounds = run.training_bounds(rows, vocab_s, sample["ntokens"], peaks)
    out = Path(args.out) if args.out else run.RESULTS / f"training_{args.device}.json"
    result = {"machine": machine, "peaks": peaks, "vocabulary_step_s": vocab_s, "training": rows, "bounds": bounds}
    out.write_text(json.dumps(result, indent=1) + "\n")
    run.log(f"wrote {out}")


if __name__ == "__main__":
    main()
