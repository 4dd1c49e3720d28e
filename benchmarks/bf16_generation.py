"""Beam search with the convs2s model in bf16 (``fairseq-generate --bf16``) against the same model in fp32.

    python -m benchmarks.bf16_generation [--sizes iwslt,wmt_en_de] [--batches 1,16,128] [--beam 5] [--repeats 5]

The harness's convs2s model (``benchmarks.pair``, random weights) prepared as fairseq-generate prepares it, once
as it is and once with ``--bf16`` (``ConvS2SModel.prepare_for_inference_``: weight norm folded in fp32, then
every weight rounded to bf16); both decode the same random sources with every hypothesis forced to ``--src-len``
tokens, so they do the same steps; their timings alternate (``measure.alternate``, medians). Prints sentences/s
of each and the ratio, and writes ``bf16_generation_<device>.json`` into ``--out``. Random weights say nothing of
translation quality: for that, ``fairseq-generate --bf16`` on a trained model (README, "Decoding in bf16").
"""

import argparse
import copy
import json
from pathlib import Path
from typing import Dict, List

import torch
from omegaconf import OmegaConf

from . import measure
from .pair import SIZES, build_pair, make_dictionary

RESULTS = Path(__file__).resolve().parent / "results"


def prepared(model, beam: int, bf16: bool):
    """A copy of ``model`` as fairseq-generate prepares it with ``--beam beam`` (``--bf16`` if ``bf16``)."""
    cfg = OmegaConf.create({"common": {"bf16": bf16}, "generation": {"beam": beam, "print_alignment": False}})
    model = copy.deepcopy(model).eval()
    model.prepare_for_inference_(cfg)
    return model


def compare(size_name: str, batches: List[int], beam: int, repeats: int, src_len: int, device) -> List[Dict]:
    size = SIZES[size_name]
    dictionary = make_dictionary(size.vocab)
    _, convs2s = build_pair(size, dictionary, dropout=0.0)
    models = {"fp32": prepared(convs2s.to(device), beam, False), "bf16": prepared(convs2s.to(device), beam, True)}
    rows = []
    for batch in batches:
        sentences = max(batch, 16)
        samples = measure.source_batches(dictionary, sentences, src_len, batch, device)
        runs = {name: measure.generator_fn(m, dictionary, samples, beam, src_len) for name, m in models.items()}
        times = measure.alternate({n: r[0] for n, r in runs.items()}, repeats, warmup=1, device=device)
        row = {"size": size_name, "beam": beam, "batch": batch, "sentences": sentences, "repeats": repeats}
        for name in models:
            row[f"{name}_sentences_per_s"] = sentences / measure.median(times[name])
        row["bf16_over_fp32"] = row["bf16_sentences_per_s"] / row["fp32_sentences_per_s"]
        print(
            f"{size_name} beam {beam} batch {batch}: fp32 {row['fp32_sentences_per_s']:.1f} "
            f"bf16 {row['bf16_sentences_per_s']:.1f} sent/s = {row['bf16_over_fp32']:.2f}x",
            flush=True,
        )
        rows.append(row)
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="iwslt,wmt_en_de", help=f"comma-separated, of {sorted(SIZES)}")
    p.add_argument("--batches", default="1,16,128")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per configuration (medians)")
    p.add_argument("--src-len", type=int, default=25, help="source tokens per sentence; outputs are as long")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--out", default=str(RESULTS), help="folder for bf16_generation_<device>.json")
    args = p.parse_args(argv)
    measure.use_threads(args.threads)
    device = torch.device(args.device)
    print(measure.describe_machine(device), flush=True)
    rows = []
    for size_name in args.sizes.split(","):
        batches = [int(b) for b in args.batches.split(",")]
        rows += compare(size_name, batches, args.beam, args.repeats, args.src_len, device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"bf16_generation_{args.device}.json"
    path.write_text(json.dumps({"machine": measure.describe_machine(device), "rows": rows}, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
