"""The fairseq-free runtime (``convs2s_runtime``) against fairseq-generate's beam search of the same convs2s model
and against fconv's: beam 5, side by side in one run.

    python -m benchmarks.runtime [--sizes iwslt,wmt_en_de] [--batches 1,16,128] [--dtypes fp32,bf16]
        [--repeats 3] [--threads 0] [--device cpu]

The harness's pair (``benchmarks.pair``: stock fconv and its conversion, random weights): fconv and convs2s
prepared as fairseq-generate prepares them (convs2s also with ``--bf16``), decoded by fairseq's
``SequenceGenerator``; the runtime's model made from the same convs2s weights as ``python -m
fairseq_convs2s.export`` writes them, decoded by ``convs2s_runtime.search.beam_search``. Every hypothesis is forced
to the source's length (``--src-len`` tokens: no EOS before, EOS at) so all do the same steps; the same random
sources, batched alike; timings alternate (``measure.alternate``, medians). Printed and written to
``runtime_<device>.json``: sentences/s of each, the runtime's ratio to fairseq-generate with the same model and
precision and to fconv (fp32), and whether the runtime's best hypotheses equal fairseq-generate's.
"""

import argparse
import json
from argparse import Namespace
from pathlib import Path
from typing import Dict, List

import torch

from convs2s_runtime.model import CONFIG, WEIGHTS, Model
from convs2s_runtime.search import beam_search
from fairseq_convs2s.export import export_files

from . import measure
from .arguments import device_name, names_of, positive_int, positive_ints, size_names
from .bf16_generation import prepared
from .pair import SIZES, build_pair, make_dictionary
from .run import RESULTS

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def runtime_model(convs2s, size, dictionary, dtype, device) -> Model:
    """The runtime's model of ``convs2s``'s weights, as the export writes them."""
    folded = prepared(convs2s, 5, False)
    args = Namespace(encoder_layers=size.encoder_layers, decoder_layers=size.decoder_layers, decoder_attention="True")
    files = export_files(folded, args, ("src", "tgt"), (dictionary, dictionary))
    return Model(json.loads(files[CONFIG]), files[WEIGHTS], dtype, torch.device(device))


def runtime_fn(model: Model, samples, beam: int, out_len: int):
    """A closure decoding every sample with the runtime's beam search, every hypothesis forced to ``out_len``."""
    result: Dict[str, list] = {}

    def run():
        hyps = []
        with torch.inference_mode():
            for sample in samples:
                src = sample["net_input"]["src_tokens"]
                max_len = torch.full((src.size(0),), out_len)
                found = beam_search(model, src, max_len, beam, min_len=out_len)
                hyps.extend(h[0].tokens for h in found)
        result["hyps"] = hyps
        return hyps

    return run, result


def compare(size_name: str, batches: List[int], dtypes: List[str], beam: int, repeats: int, src_len: int, device):
    size = SIZES[size_name]
    dictionary = make_dictionary(size.vocab)
    fconv, convs2s = (m.to(device) for m in build_pair(size, dictionary, dropout=0.0))
    fconv_prepared = measure.prepare_for_generation(fconv, beam)
    rows = []
    for dtype in dtypes:
        plugin = prepared(convs2s, beam, dtype == "bf16")
        runtime = runtime_model(convs2s, size, dictionary, DTYPES[dtype], device)
        for batch in batches:
            samples = measure.source_batches(dictionary, max(batch, 16), src_len, batch, torch.device(device))
            fns = {}
            fns["fairseq"], fairseq_out = measure.generator_fn(plugin, dictionary, samples, beam, src_len)
            fns["runtime"], runtime_out = runtime_fn(runtime, samples, beam, src_len)
            if dtype == "fp32":
                fns["fconv"], _ = measure.generator_fn(fconv_prepared, dictionary, samples, beam, src_len)
            times = measure.alternate(fns, repeats, warmup=1, device=torch.device(device))
            sentences = sum(s["net_input"]["src_tokens"].size(0) for s in samples)
            speed = {name: sentences / measure.median(t) for name, t in times.items()}
            row = {"size": size_name, "dtype": dtype, "batch": batch, "sentences": sentences}
            row.update({f"{name}_sentences_per_s": s for name, s in speed.items()})
            row["runtime_over_fairseq"] = speed["runtime"] / speed["fairseq"]
            if "fconv" in speed:
                row["runtime_over_fconv"] = speed["runtime"] / speed["fconv"]
            row["identical"] = runtime_out["hyps"] == fairseq_out["hyps"]
            over_fconv = f", {row['runtime_over_fconv']:.2f}x fconv" if "fconv" in speed else ""
            print(
                f"{size_name} {dtype} batch {batch}: runtime {speed['runtime']:.1f} sentences/s, fairseq-generate "
                f"{speed['fairseq']:.1f}: {row['runtime_over_fairseq']:.2f}x{over_fconv}; identical "
                f"hypotheses: {row['identical']}",
                flush=True,
            )
            rows.append(row)
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=size_names, default="iwslt,wmt_en_de")
    p.add_argument("--batches", type=positive_ints, default="1,16,128", help="comma-separated batch sizes")
    p.add_argument("--dtypes", type=names_of(DTYPES, "dtype"), default="fp32,bf16", help="comma-separated")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--src-len", type=int, default=25)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--device", type=device_name, default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    threads = measure.use_threads(args.threads)
    print(f"torch threads {threads}; ratios of medians, sentences/s", flush=True)
    rows = []
    for size_name in args.sizes.split(","):
        batches = [int(b) for b in args.batches.split(",")]
        rows += compare(size_name, batches, args.dtypes.split(","), args.beam, args.repeats, args.src_len, args.device)
    out = Path(args.out) / f"runtime_{args.device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"machine": measure.describe_machine(torch.device(args.device)), "rows": rows}, indent=1) + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
