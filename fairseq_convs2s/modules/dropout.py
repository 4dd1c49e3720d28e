"""Dropout (Srivastava et al. 2014), as ConvS2S applies it to embeddings, block inputs and the decoder output.

Porting note (fconv): fconv calls ``F.dropout``, which on the CPU draws its mask with ``bernoulli_`` on a float
tensor, a mask for every block input of every update: a few percent of a training update's operator time at the
iwslt size (BENCHMARKS.md, "The speed-ups, and what bounds them"). :class:`Dropout` draws the
same distribution more cheaply there: 32 random bits an element from torch's CPU generator (so
``torch.manual_seed`` and fairseq's ``--seed`` govern it as before), two elements a 64-bit draw, kept where the
bits lie at or above the ``p`` quantile of 32-bit integers: every element is kept independently with probability
``1 - p`` to within 2^-32 (torch's own float draws resolve 2^-24), and scaled by ``1 / (1 - p)``. The mask is a
bool tensor (a byte an element where ``F.dropout`` saves a float one). The masks differ from ``F.dropout``'s
for the same seed, so training is not bit-identical to fconv's with dropout on; on a GPU and under
``torch.compile`` it is ``F.dropout`` itself.
"""

import torch
from fairseq.modules import FairseqDropout
from torch import Tensor

from convs2s_runtime.products import is_compiling


def keep_mask(shape: torch.Size, p: float) -> Tensor:
    """A bool mask of ``shape``, each element True independently with probability 1 - p (to within 2^-32)."""
    n = shape.numel()
    # one 64-bit draw over the full range gives two uniform 32-bit integers
    bits = torch.empty((n + 1) // 2, dtype=torch.int64).random_(-(2**63), None)
    bits = bits.view(torch.int32)[:n]  # n, uniform over [-2^31, 2^31)
    threshold = min(round(p * 2**32) - 2**31, 2**31 - 1)  # P(bits < threshold) = p (int32's range, p near 1)
    return (bits >= threshold).view(shape)


class _MaskedScale(torch.autograd.Function):
    """x * keep / (1 - p), its gradient the same product: the mask saved as bools."""

    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:
        keep = keep_mask(x.shape, p)  # x's shape, bool
        ctx.scale = 1.0 / (1.0 - p)
        ctx.save_for_backward(keep)
        return x.mul(keep).mul_(ctx.scale)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None


class Dropout(FairseqDropout):
    """fairseq's dropout module (``--retain-dropout`` and all), with a cheaper mask for CPU tensors."""

    def forward(self, x: Tensor, inplace: bool = False) -> Tensor:
        active = self.p > 0 and (self.training or self.apply_during_inference)
        if active and self.p < 1 and x.device.type == "cpu" and not is_compiling():
            return _MaskedScale.apply(x, self.p)
        return super().forward(x, inplace=inplace)
