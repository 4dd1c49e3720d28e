"""Which form of the inference product is cheapest: MKL on ``W`` or ``W^T`` against oneDNN on a packed ``W``.

``python -m benchmarks.linear_forms [--threads N] [--repeats R]`` times ``x W^T + b`` with gradients off at the
weight shapes of the presets' decoders (in x out: the linears, the convolution over a window of k inputs, the
vocabulary projection) and at the row counts of beam search (1 and 5: one sentence at beam 1 and 5; 80: batch
16 at beam 5; 640: batch 128), in three forms:
- ``F.linear``: MKL's GEMM on ``W`` (out x in), what fconv and torch's ``nn.Linear`` use;
- ``addmm W^T``: MKL's GEMM on a cached in x out copy of ``W``;
- ``oneDNN``: ``torch.ops.mkldnn._linear_pointwise`` on ``W`` packed once by ``_reorder_linear_weight``.
Microseconds per call, medians of the repeats (each repeat a loop of calls, the forms alternated), and the
ratio of the best MKL form to oneDNN. ``weight_norm.ONEDNN_MIN_WEIGHT`` and ``ONEDNN_MIN_MACS`` are read off
this table.
"""

import argparse
import time
from typing import Callable, Dict, Tuple

import torch
import torch.nn.functional as F

from fairseq_convs2s.modules.weight_norm import ONEDNN_MIN_MACS, ONEDNN_MIN_WEIGHT

from . import measure

# (in, out, where): iwslt size, then wmt_en_de size
SHAPES = (
    (256, 256, "iwslt linears"),
    (768, 512, "iwslt conv window"),
    (256, 10_000, "iwslt vocabulary"),
    (512, 512, "wmt linears"),
    (1536, 1024, "wmt conv window, 512 wide"),
    (2304, 1536, "wmt conv window, 768 wide"),
    (2048, 4096, "wmt kernel-1, 2048 wide"),
    (512, 10_000, "wmt vocabulary"),
)
ROWS = (1, 5, 80, 640)


def _forms(weight: torch.Tensor, bias: torch.Tensor, rows: int) -> Tuple[Dict[str, Callable[[], object]], int]:
    """Each form as a loop of enough calls to take about 10-100 ms; returns ({form: loop}, calls)."""
    x = torch.randn(rows, weight.size(1))
    weight_t = weight.t().contiguous()
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
    calls = max(3, int(2e8 // (weight.numel() * rows + 2e6)))
    forms = {
        "linear": lambda: F.linear(x, weight, bias),
        "addmm": lambda: torch.addmm(bias, x, weight_t),
        "onednn": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], ""),
    }
    return {name: (lambda fn=fn: [fn() for _ in range(calls)]) for name, fn in forms.items()}, calls


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    measure.use_threads(args.threads, need_onednn=True)
    started = time.time()
    print(f"torch threads {torch.get_num_threads()}; us per call; speed-up = best MKL form / oneDNN")
    print(f"the model uses oneDNN from a {ONEDNN_MIN_WEIGHT:,}-entry weight and {ONEDNN_MIN_MACS:,} multiply-adds up")
    print("| weight (in x out) | rows | F.linear | addmm W^T | oneDNN packed | speed-up | rows x in x out |")
    print("|---|---|---|---|---|---|---|")
    cpu = torch.device("cpu")
    with torch.no_grad():
        for c_in, c_out, where in SHAPES:
            weight, bias = torch.randn(c_out, c_in) / c_in**0.5, torch.randn(c_out)  # out x in, as F.linear
            for rows in ROWS:
                forms, calls = _forms(weight, bias, rows)
                times = measure.alternate(forms, args.repeats, warmup=1, device=cpu)
                us = {name: measure.median(ts) / calls * 1e6 for name, ts in times.items()}
                ratio = min(us["linear"], us["addmm"]) / us["onednn"]
                print(
                    f"| {c_in} x {c_out} ({where}) | {rows} | {us['linear']:.0f} | {us['addmm']:.0f} "
                    f"| {us['onednn']:.0f} | **{ratio:.2f}x** | {rows * c_in * c_out:,} |",
                    flush=True,
                )
    print(f"whole run: {(time.time() - started) / 60:.1f} min")


if __name__ == "__main__":
    main()
