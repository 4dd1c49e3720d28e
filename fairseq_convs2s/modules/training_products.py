"""The products of a training update on a CPU through oneDNN: large linears (the vocabulary projection above all),
and each convolution as one product over its shifted inputs (im2col). Forward and input gradient run through
oneDNN; the sums are those of ``F.linear`` and ``conv_tbc``, in another order."""

from typing import List, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from convs2s_runtime.products import onednn_linear, onednn_pays


class OneDNNLinear(torch.autograd.Function):
    """``x W^T + b`` whose forward and input gradient run through oneDNN; the weight gradient, a long reduction
    over the rows, stays on MKL: through oneDNN it measured no faster (BENCHMARKS.md, "Tried and dropped")."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:  # x: N x in, weight: out x in
        ctx.save_for_backward(x, weight)
        return onednn_linear(x, weight, bias)  # N x out

    @staticmethod
    def backward(ctx, grad: Tensor):  # grad: N x out
        x, weight = ctx.saved_tensors
        grad_x = onednn_linear(grad, weight.t(), None) if ctx.needs_input_grad[0] else None  # N x in
        grad_weight = grad.t().mm(x) if ctx.needs_input_grad[1] else None  # out x in
        grad_bias = grad.sum(0) if ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


class Im2colConvTBC(torch.autograd.Function):
    """conv_tbc's convolution, forward and input gradient as one oneDNN product each over the k shifted inputs
    side by side (im2col), the weight gradient per tap on MKL as conv_tbc computes it.

    Porting note (fconv): conv_tbc runs k products of (T*B) x in by in x out on MKL, accumulating into the
    output. Here one (T*B) x (k*in) product through oneDNN, which makes a training update faster (BENCHMARKS.md,
    "The speed-ups"). Only the input is kept for the backward, not the k times larger columns: the weight
    gradient is taken per tap from it, as conv_tbc takes it. The sums are the same, in another order.
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, left: int, right: int) -> Tensor:
        # x: T x B x in, weight: k x in x out -> T' x B x out, T' = T + left + right - k + 1
        k, c_in, c_out = weight.shape
        steps = x.size(0) + left + right - k + 1
        columns = _im2col(x, k, left, steps)  # T' x B x k x in
        flat_weight = weight.reshape(k * c_in, c_out).t()  # out x (k * in), tap-major like the columns
        y = onednn_linear(columns.view(-1, k * c_in), flat_weight, bias)  # T'*B x out
        ctx.save_for_backward(x, weight)
        ctx.left = left
        return y.view(steps, x.size(1), c_out)

    @staticmethod
    def backward(ctx, grad: Tensor):  # grad: T' x B x out
        x, weight = ctx.saved_tensors
        left = ctx.left
        k, c_in, c_out = weight.shape
        steps, batch = grad.shape[:2]
        grad = grad.contiguous()
        g = grad.view(-1, c_out)  # T'*B x out
        grad_x = grad_weight = grad_bias = None
        taps = _tap_slices(x.size(0), k, left, steps)
        if ctx.needs_input_grad[0]:
            grad_columns = onednn_linear(g, weight.reshape(k * c_in, c_out), None)  # T'*B x (k * in)
            grad_columns = grad_columns.view(steps, batch, k, c_in)
            grad_x = torch.zeros_like(x)  # T x B x in: each input step sums the taps that read it
            for tap, outputs, inputs in taps:
                grad_x[inputs] += grad_columns[outputs, :, tap]
        if ctx.needs_input_grad[1]:
            grad_weight = torch.zeros_like(weight)  # k x in x out
            for tap, outputs, inputs in taps:  # the inputs a tap reads against the outputs it feeds: in x out
                grad_weight[tap].addmm_(x[inputs].view(-1, c_in).t(), grad[outputs].view(-1, c_out))
        if ctx.needs_input_grad[2]:
            grad_bias = g.sum(0)
        return grad_x, grad_weight, grad_bias, None, None


def im2col_pays(x: Tensor, weight: Tensor) -> bool:
    """x: T x B x in, weight: k x in x out. The training convolution as one oneDNN product where its linear
    would go through oneDNN (a CPU, fp32 or bf16, a large enough product)."""
    return onednn_pays(x, weight.numel(), rows=x.size(0) * x.size(1))


def _tap_slices(length: int, k: int, left: int, steps: int) -> List[Tuple[int, slice, slice]]:
    """(tap, outputs, inputs): the output steps whose input for that tap (output + tap - left) is not padding,
    and those input steps; taps that read only padding (an input shorter than the kernel) are left out."""
    slices = []
    for tap in range(k):
        lo, hi = max(0, left - tap), min(steps, length + left - tap)  # output steps [lo, hi)
        if lo < hi:
            slices.append((tap, slice(lo, hi), slice(lo + tap - left, hi + tap - left)))
    return slices


def _im2col(x: Tensor, k: int, left: int, steps: int) -> Tensor:
    """x: T x B x in -> T' x B x k x in: output step t's k inputs t - left .. t - left + k - 1, zero outside."""
    columns = x.new_zeros(steps, x.size(1), k, x.size(2))
    for tap, outputs, inputs in _tap_slices(x.size(0), k, left, steps):
        columns[outputs, :, tap] = x[inputs]
    return columns


def training_linear(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``F.linear`` with gradients; x: N x in -> N x out. Large products on the CPU through oneDNN."""
    if onednn_pays(x, x.size(1) * weight.size(0)):
        return OneDNNLinear.apply(x, weight, bias)
    return F.linear(x, weight, bias)
