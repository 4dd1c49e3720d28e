"""int8 products for decoding on a CPU: measured, and not adopted (BENCHMARKS.md, "int8 decoding steps").

    python -m benchmarks.int8_decoding [--sizes iwslt,wmt_en_de] [--batches 1,16,128] [--repeats 3]
    python -m benchmarks.int8_decoding --data DATA_BIN --path CHECKPOINT [--batch 128]
        [--generate-args "--remove-bpe sentencepiece --scoring sacrebleu"]

What CPU serving stacks reach for after bf16: every product of a decoding step (``FoldedProduct``: the input,
convolution-window, residual and output projections) as torch's dynamic int8 linear, the weights quantized once
per output channel (symmetric, int8), the activations per call over the whole tensor (8 bits on a CPU with VNNI,
7 without, as fbgemm needs there). The encoder, the attention and beam search stay fp32. Printed, in one run:

- each product shape of a step alone (``_onednn_linear`` on packed fp32 and bf16 weights against
  ``quantized.linear_dynamic``), microseconds a call, medians;
- beam 5 on the harness's convs2s model (``benchmarks.pair``, random weights, every hypothesis forced to
  ``--src-len`` tokens): fp32, ``--bf16`` and int8 steps, timings alternated, sentences/s (medians);
- with ``--data`` and ``--path``: ``fairseq-generate`` of the trained model's test set with fp32 and with int8
  steps, each in a fresh process: BLEU and how many hypotheses int8 changed.

Torch's quantized tensors (``torch.quantize_per_channel`` and the ops taking them) are deprecated from torch 2.13
on and warn so; this module is the record, not a form the model takes.
"""

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Dict, List

import torch

from fairseq_convs2s.modules import weight_norm

from . import measure
from .bf16_generation import beam_speeds, generate_once, harness_models, prepared
from .pair import SIZES
from .run import RESULTS

# fbgemm's kernels without VNNI add pairs of u8 x s8 products in int16, which 8-bit activations can overflow
REDUCE_RANGE = not getattr(torch.cpu, "_is_vnni_supported", lambda: False)()


def int8_weight(weight: torch.Tensor, bias: torch.Tensor):
    """out x in fp32 weight -> fbgemm's packed int8 weight, one symmetric scale per output channel."""
    scale = (weight.abs().amax(dim=1) / 127.0).clamp_min(1e-8).double()  # out
    zero = torch.zeros(weight.size(0), dtype=torch.long)
    q = torch.quantize_per_channel(weight.float().contiguous(), scale, zero, 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(q, bias.float())


def int8_product(packed, x: torch.Tensor) -> torch.Tensor:
    """x W^T + b with x quantized per call: N x in -> N x out, fp32."""
    return torch.ops.quantized.linear_dynamic(x, packed, REDUCE_RANGE)


def use_int8_steps(everywhere: bool = False) -> None:
    """Make ``FoldedProduct`` multiply in int8 for the layers marked ``_int8_steps`` (every layer with
    ``everywhere``), the packed weight cached in the layer for the pass as the fp32 forms are."""
    original = weight_norm.FoldedProduct.__call__
    if getattr(original, "int8", False):
        return

    def call(self, x):
        layer = self._layer
        if not (everywhere or getattr(layer, "_int8_steps", False)) or x.dtype != torch.float32:
            return original(self, x)
        packed = layer._derived(layer.product_name + ".int8", lambda: int8_weight(layer._product_weight(), layer.bias))
        return int8_product(packed, x)

    call.int8 = True
    weight_norm.FoldedProduct.__call__ = call


def int8_copy(model, beam: int):
    """A copy of ``model`` prepared for fp32 generation whose decoding steps multiply in int8."""
    model = prepared(model, beam, False)
    for module in model.decoder.modules():
        module._int8_steps = True
    return model


CALLS = 50  # product calls per timed repeat


def _calls(fn, *args):
    """A timed unit: ``CALLS`` calls of ``fn(*args)``."""
    return lambda: [fn(*args) for _ in range(CALLS)]


def product_rows(shapes: List[tuple], repeats: int) -> List[Dict]:
    """Each (rows, in, out) product in fp32 and bf16 through oneDNN and in int8: microseconds a call."""
    out = []
    for rows, fan_in, fan_out in shapes:
        x, w, b = torch.randn(rows, fan_in), torch.randn(fan_out, fan_in) / fan_in**0.5, torch.randn(fan_out)
        packed = {dt: torch.ops.mkldnn._reorder_linear_weight(w.to(dt), None) for dt in (torch.float32, torch.bfloat16)}
        xb, bb, q = x.bfloat16(), b.bfloat16(), int8_weight(w, b)
        fns = {
            "fp32": _calls(weight_norm._onednn_linear, x, packed[torch.float32], b),
            "bf16": _calls(weight_norm._onednn_linear, xb, packed[torch.bfloat16], bb),
            "int8": _calls(int8_product, q, x),
        }
        times = measure.alternate(fns, repeats, warmup=1, device=torch.device("cpu"))
        row = {"rows": rows, "in": fan_in, "out": fan_out}
        row.update({f"{k}_us": 1e6 * measure.median(t) / CALLS for k, t in times.items()})
        row["int8_over_fp32"] = row["fp32_us"] / row["int8_us"]
        row["int8_over_bf16"] = row["bf16_us"] / row["int8_us"]
        print(
            f"product {rows} x {fan_in} -> {fan_out}: fp32 {row['fp32_us']:.0f} bf16 {row['bf16_us']:.0f} int8 "
            f"{row['int8_us']:.0f} us = {row['int8_over_fp32']:.2f}x fp32, {row['int8_over_bf16']:.2f}x bf16",
            flush=True,
        )
        out.append(row)
    return out


def beam_rows(size_name: str, batches: List[int], beam: int, repeats: int, src_len: int) -> List[Dict]:
    """fp32, bf16 and int8-step beam search of the harness's convs2s model at ``size_name``."""
    dictionary, convs2s, models = harness_models(size_name, beam, torch.device("cpu"))
    models["int8"] = int8_copy(convs2s, beam)
    rows = []
    for batch in batches:
        row = {"size": size_name, **beam_speeds(models, dictionary, batch, beam, repeats, src_len, torch.device("cpu"))}
        row["int8_over_fp32"] = row["int8_sentences_per_s"] / row["fp32_sentences_per_s"]
        row["int8_over_bf16"] = row["int8_sentences_per_s"] / row["bf16_sentences_per_s"]
        print(
            f"{size_name} beam {beam} batch {batch}: fp32 {row['fp32_sentences_per_s']:.1f} bf16 "
            f"{row['bf16_sentences_per_s']:.1f} int8 {row['int8_sentences_per_s']:.1f} sent/s = "
            f"{row['int8_over_fp32']:.2f}x fp32, {row['int8_over_bf16']:.2f}x bf16",
            flush=True,
        )
        rows.append(row)
    return rows


def generate_rows(args) -> Dict:
    """``fairseq-generate`` of the test set with fp32 and with int8 steps: BLEU and the hypotheses int8 changed."""
    results = {}
    for form in ("fp32", "int8"):
        entry = ["-m", "benchmarks.int8_decoding", "--generate-worker", form, str(REDUCE_RANGE), "--"]
        extra = shlex.split(args.generate_args)
        cpu = torch.device("cpu")
        results[form] = generate_once(args.data, args.path, args.batch, args.beam, False, extra, cpu, entry)
    fp32, int8 = results["fp32"]["hyps"], results["int8"]["hyps"]
    row = {"checkpoint": args.path, "beam": args.beam, "batch": args.batch, "sentences": len(fp32)}
    row.update({f"{form}_bleu": r["bleu"] for form, r in results.items()})
    row["changed_by_int8"] = sum(int8.get(i) != h for i, h in fp32.items())
    print(
        f"fairseq-generate beam {args.beam} batch {args.batch}: BLEU fp32 {row['fp32_bleu']:.2f} int8 "
        f"{row['int8_bleu']:.2f}; int8 changed {row['changed_by_int8']} of {row['sentences']} hypotheses",
        flush=True,
    )
    return row


def generate_worker(form: str, reduce_range: str, argv: List[str]) -> None:
    """fairseq-generate in this process, its decoding steps' products in int8 with ``form`` int8."""
    from fairseq_cli.generate import cli_main

    global REDUCE_RANGE
    REDUCE_RANGE = reduce_range == "True"
    if form == "int8":
        use_int8_steps(everywhere=True)
    sys.argv = ["fairseq-generate", *argv]
    cli_main()


# the products of a step at each size, rows = batch x beam: the input projection (f -> d), a block's
# convolution window (k d -> 2d), the output projection (out_embed -> V)
PRODUCT_SHAPES = [
    (5, 256, 256),
    (80, 768, 512),
    (80, 256, 10000),
    (5, 1536, 1024),
    (80, 1536, 1024),
    (640, 1536, 1024),
    (80, 2048, 4096),
    (640, 512, 10000),
]


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--generate-worker"]:
        return generate_worker(argv[1], argv[2], argv[4:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="iwslt,wmt_en_de", help=f"comma-separated, of {sorted(SIZES)}")
    p.add_argument("--batches", default="1,16,128")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per configuration (medians)")
    p.add_argument("--src-len", type=int, default=25, help="source tokens per sentence; outputs are as long")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--no-products", action="store_true", help="skip the products alone")
    p.add_argument("--reduce-range", action="store_true", help="7-bit activations, as on a CPU without VNNI")
    p.add_argument("--out", default=str(RESULTS), help="folder for int8_decoding[_trained][_7bit]_cpu.json")
    p.add_argument("--data", help="a data-bin folder: decode its test set with the trained model --path")
    p.add_argument("--path", help="a convs2s checkpoint, with --data")
    p.add_argument("--batch", type=int, default=128, help="fairseq-generate's --batch-size, with --data")
    p.add_argument("--generate-args", default="", help="more fairseq-generate flags, with --data (one flag: use =)")
    args = p.parse_args(argv)
    if bool(args.data) != bool(args.path):
        p.error("--data and --path go together")
    measure.use_threads(args.threads)
    global REDUCE_RANGE
    REDUCE_RANGE = REDUCE_RANGE or args.reduce_range
    machine = measure.describe_machine(torch.device("cpu"))
    print(machine, f"reduce_range={REDUCE_RANGE}", flush=True)
    result: Dict[str, object] = {"machine": machine, "reduce_range": REDUCE_RANGE}
    if args.data:
        result["generate"] = generate_rows(args)
    else:
        use_int8_steps()
        if not args.no_products:
            result["products"] = product_rows(PRODUCT_SHAPES, args.repeats)
        batches = [int(b) for b in args.batches.split(",")]
        result["beam"] = [
            row for s in args.sizes.split(",") for row in beam_rows(s, batches, args.beam, args.repeats, args.src_len)
        ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"int8_decoding{'_trained' if args.data else ''}{'_7bit' if REDUCE_RANGE else ''}_cpu.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
