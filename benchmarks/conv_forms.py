"""Which form of the training convolution is cheapest: ``conv_tbc`` against ``conv1d`` and im2col products.

``python -m benchmarks.conv_forms [--threads N]`` times forward plus backward of one block's convolution (kernel
3, 64 sentences of 26 steps, padded to keep the length) at the block widths of the presets, in four forms:
- ``conv_tbc``: what fconv trains with (and convs2s off the CPU), one product per kernel tap accumulated into
  the output;
- ``conv1d``: torch's batch x channel x time convolution (oneDNN on a CPU), on inputs already in its layout;
- ``im2col``: the k shifted copies of the input side by side, one (T*B) x (k*in) by (k*in) x out product;
- ``im2col-onednn``: what the model trains with on a CPU (``_Im2colConvTBC``): that product, forward and input
  gradient, through oneDNN, the weight gradient per tap on MKL, only the input kept for the backward.
Each is reported in GFLOP/s against a 2048^3 matmul measured in the same run (medians of the repeats).
"""

import argparse
import time
from typing import Callable, Dict

import torch
import torch.nn.functional as F

from fairseq_convs2s.modules.weight_norm import _Im2colConvTBC

from . import measure

TIME, BATCH, KERNEL = 26, 64, 3
WIDTHS = ((256, 512), (512, 1024), (768, 1536))  # (in, 2 * out): the GLU's input of 256-, 512-, 768-wide blocks


def _forms(c_in: int, c_out: int) -> Dict[str, Callable[[], None]]:
    pad = KERNEL // 2
    x = torch.randn(TIME, BATCH, c_in, requires_grad=True)  # T x B x in
    weight = torch.randn(KERNEL, c_in, c_out, requires_grad=True)  # k x in x out
    bias = torch.zeros(c_out, requires_grad=True)
    grad = torch.randn(TIME, BATCH, c_out)

    def conv_tbc():
        torch.conv_tbc(x, weight, bias, pad).backward(grad)

    x_bct = x.detach().permute(1, 2, 0).contiguous().requires_grad_()  # B x in x T
    weight_oik = weight.detach().permute(2, 1, 0).contiguous().requires_grad_()  # out x in x k
    grad_bct = grad.permute(1, 2, 0).contiguous()

    def conv1d():
        F.conv1d(x_bct, weight_oik, bias, padding=pad).backward(grad_bct)

    weight_flat = weight.detach().reshape(KERNEL * c_in, c_out).requires_grad_()  # (k * in) x out, tap-major

    def im2col():
        padded = F.pad(x, (0, 0, 0, 0, pad, pad))  # T + 2 * pad x B x in
        columns = torch.cat([padded[tap : tap + TIME] for tap in range(KERNEL)], dim=2)  # T x B x (k * in)
        out = torch.addmm(bias, columns.view(TIME * BATCH, -1), weight_flat)  # (T * B) x out
        out.view(TIME, BATCH, c_out).backward(grad)

    def im2col_onednn():
        _Im2colConvTBC.apply(x, weight, bias, pad, pad).backward(grad)

    return {"conv_tbc": conv_tbc, "conv1d": conv1d, "im2col": im2col, "im2col-onednn": im2col_onednn}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args(argv)
    measure.use_threads(args.threads)
    started = time.time()
    peak = measure.matmul_peak(torch.float32, torch.device("cpu"))
    print(f"torch threads {torch.get_num_threads()}; 2048^3 matmul {peak:.0f} GFLOP/s fp32")
    print("| in | out (2 x block width) | conv_tbc | conv1d | im2col | im2col-onednn |")
    print("|---|---|---|---|---|---|")
    for c_in, c_out in WIDTHS:
        forms = _forms(c_in, c_out)
        # the useful products, conv_tbc's count: conv1d and im2col also multiply the zero padding
        flops = measure.count_flops(forms["conv_tbc"])
        times = measure.alternate(forms, args.repeats, warmup=3, device=torch.device("cpu"))
        cells = []
        for name in forms:
            t = measure.median(times[name])
            cells.append(f"{1e3 * t:.1f} ms, {flops / t / 1e9:.0f} GFLOP/s ({flops / t / 1e9 / peak:.0%})")
        print(f"| {c_in} | {c_out} | " + " | ".join(cells) + " |")
    print(f"whole run: {(time.time() - started) / 60:.1f} min")


if __name__ == "__main__":
    main()
