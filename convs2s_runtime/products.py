"""The matrix products of inference, ``x W^T + b``, in the form that is fastest for the rows at hand.

On a CPU, MKL's GEMM (what ``F.linear`` calls) re-packs the weight on every call, which dominates the few rows of
a beam-search step. oneDNN takes a weight packed once into its blocked layout, but has a fixed cost per call: it
pays from about a 512 x 512 weight and 2^20 multiply-adds (rows x in x out) up (BENCHMARKS.md, "The speed-ups").
:class:`Product` holds both forms of one weight, each made on first use, and picks one per call.
Torch only: the plugin and the fairseq-free runtime share this file.
"""

from typing import Callable, List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

# oneDNN's fixed cost per call is paid back from this weight size (in x out) and this many multiply-adds up
ONEDNN_MIN_WEIGHT = 1 << 18
ONEDNN_MIN_MACS = 1 << 20
# (bf16 where oneDNN has its instructions: AVX512BW/VL/DQ or AVX-NE-CONVERT; without them it refuses to pack a bf16
# weight, and MKL's product, emulated, is the one there is)
ONEDNN_DTYPES = (
    frozenset({torch.float32} | ({torch.bfloat16} if torch.ops.mkldnn._is_mkldnn_bf16_supported() else set()))
    if torch.backends.mkldnn.is_available()
    else frozenset()
)

# Whether torch.compile is tracing now: torch's own function, looked up once (it is asked at every oneDNN product of
# a decoding step); never, on a torch without it. Traced code takes the forms that compile as one graph.
is_compiling: Callable[[], bool] = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


def onednn_pays(x: Tensor, weight_size: int, rows: Optional[int] = None) -> bool:
    """Whether ``x`` (N x in, or ``rows`` rows of it) times a weight of ``weight_size`` (in x out) entries runs
    faster through oneDNN: a CPU tensor in a dtype oneDNN takes, and a large enough product."""
    if _onednn_linear_op is None and is_compiling():
        return False
    rows = x.size(0) if rows is None else rows
    large = weight_size >= ONEDNN_MIN_WEIGHT and rows * weight_size >= ONEDNN_MIN_MACS
    return large and x.device.type == "cpu" and x.dtype in ONEDNN_DTYPES


def onednn_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """``x W^T + b`` by oneDNN; x: N x in, weight: out x in, plain or packed (:func:`pack_for_onednn`) -> N x out."""
    if is_compiling():
        return _onednn_linear_op(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def pack_for_onednn(weight: Tensor) -> Tensor:
    """W (out x in) in oneDNN's blocked layout; the packed tensor has no storage (it does not pickle or copy)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, None)


def transposed_for_mkl(weight: Tensor) -> Tensor:
    """W^T (in x out) as MKL's product runs fastest on it: contiguous on a CPU; on a GPU the transposed view
    itself (what ``F.linear`` passes), with no copy of the weight."""
    return weight.t().contiguous() if weight.device.type == "cpu" else weight.t()


# torch.compile sees the oneDNN product as one opaque operator, so a compiled model multiplies as the eager one
# does on a CPU: inductor's own lowering of the same aten call fails on the model's reshaped inputs (torch 2.13)
_onednn_linear_op = None
if hasattr(torch.library, "custom_op"):

    @torch.library.custom_op("convs2s::onednn_linear", mutates_args=())
    def _onednn_linear_op(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")

    @_onednn_linear_op.register_fake
    def _(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        return x.new_empty(x.size(0), weight.size(0))  # N x out


def padded_conv_tbc(x: Tensor, weight: Tensor, bias: Optional[Tensor], padding) -> Tensor:
    """``conv_tbc`` over x (T x B x in) zero-padded by ``padding`` = (left, right) steps -> T' x B x out;
    weight: k x in x out. conv_tbc pads both sides alike without a copy; other paddings (the decoder's causal
    k - 1 on the left, an even kernel) pad the time dimension first."""
    left, right = padding
    if left != right:
        x = F.pad(x, (0, 0, 0, 0, left, right))
        left = 0
    return torch.conv_tbc(x.contiguous(), weight, bias, left)


class Product:
    """``x W^T + b`` of one weight at inference; x: N x in -> N x out, gradients off.

    ``form(onednn)`` gives the weight as the chosen product takes it (:func:`pack_for_onednn`'s W, or
    :func:`transposed_for_mkl`'s W^T); each form is asked for once, on first use, and kept here. A beam-search
    step of a small model is a few dozen small products, where looking a form up at every call would cost as
    much as the product.
    """

    __slots__ = ("_form", "bias", "weight_size", "_forms")

    def __init__(self, form: Callable[[bool], Tensor], bias: Optional[Tensor], weight_size: int):
        self._form = form
        self.bias = bias
        self.weight_size = weight_size  # in x out
        self._forms: List[Optional[Tensor]] = [None, None]  # [W^T for MKL, W packed for oneDNN]

    @classmethod
    def of_weight(cls, weight: Tensor, bias: Optional[Tensor]) -> "Product":
        """The product of a plain weight W (out x in)."""
        return cls(
            lambda onednn: pack_for_onednn(weight) if onednn else transposed_for_mkl(weight), bias, weight.numel()
        )

    def __call__(self, x: Tensor) -> Tensor:
        onednn = onednn_pays(x, self.weight_size)
        w = self._forms[onednn]
        if w is None:
            w = self._forms[onednn] = self._form(onednn)
        if onednn:
            return onednn_linear(x, w, self.bias)
        return torch.addmm(self.bias, x, w) if self.bias is not None else x.mm(w)
