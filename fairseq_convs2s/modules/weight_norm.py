"""Weight-normalized layers (Salimans & Kingma 2016), as ConvS2S uses on every layer but the lookup tables, and the
paper's initialization (3.5).

The weight is ``w = g * v / ||v||``. The parameters are named ``weight_v`` and ``weight_g``, the names that
``torch.nn.utils.weight_norm`` gives fairseq's fconv layers, so fconv state dicts map onto these layers tensor for
tensor.

Porting note (fconv): fconv re-derives ``w`` from ``g`` and ``v`` on every call, including every beam-search step.
Here ``make_generation_fast_`` (what fairseq-generate, fairseq-interactive and the hub interface call, after which
fairseq forbids training the model) folds the weights once for good, in place, as fairseq's own preparation folds
fconv's by removing its weight norm: ``weight_v`` then holds ``w`` itself and ``weight_g`` its norm (so the state
dict still describes ``w``), and the forms its inference products take (:meth:`WeightNorm.inference_form`) are
kept in the layer. A model that is not folded in place (validation during training) folds at every forward; its
decoding steps take products made once per batch (``models/fast_path.py``).
"""

import math
from typing import Dict, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from convs2s_runtime.products import Product, is_compiling, pack_for_onednn, padded_conv_tbc, transposed_for_mkl

from .training_products import Im2colConvTBC, im2col_pays, training_linear


class WeightNorm(nn.Module):
    """Holds ``weight_v``/``weight_g`` and derives ``weight``; subclasses say over which dims the norm runs and
    what their one inference product multiplies by (:meth:`product_weight`)."""

    # dims of weight_v that the norm reduces over, and the one it keeps (the output channels)
    norm_dims: Tuple[int, ...] = ()
    output_dim: int = 0

    def _init_weight_norm(self, v: Tensor) -> None:
        self.weight_v = nn.Parameter(v)
        # g starts at ||v|| so that the initial weight equals v (as torch.nn.utils.weight_norm does)
        self.weight_g = nn.Parameter(self._norm(v.detach()).clone())
        self.folded_in_place = False  # weight_v holds w itself (fold_in_place); cleared when a state is loaded
        self._inference_forms: Dict[bool, Tuple[tuple, Tensor]] = {}

    def __getstate__(self):
        # copies and pickles (EMA, deepcopy) leave the forms behind: oneDNN's packed tensors have no storage
        return {**super().__getstate__(), "_inference_forms": {}}

    def _norm(self, v: Tensor) -> Tensor:
        return torch.linalg.vector_norm(v, dim=self.norm_dims, keepdim=True)

    def _fold(self) -> Tensor:
        if self.folded_in_place:
            return self.weight_v
        # g * v / ||v||, in torch's fused kernel (the one torch.nn.utils.weight_norm and so fconv use): one pass
        # forward and backward instead of a norm, a division and two products
        return torch._weight_norm(self.weight_v, self.weight_g, self.output_dim)

    @property
    def weight(self) -> Tensor:
        return self._fold()

    def fold_in_place(self) -> None:
        """Replace ``v`` by ``w = g * v / ||v||`` and ``g`` by ``||w||`` (for inference only: the state still
        describes ``w``, but training would now update ``w`` directly). The folded weight is computed as every
        forward computes it, so outputs stay bit for bit the same. Folding twice is a no-op."""
        if self.folded_in_place:
            return
        with torch.no_grad():
            w = torch._weight_norm(self.weight_v, self.weight_g, self.output_dim)
            self.weight_v.data = w
            self.weight_g.data = self._norm(w)
        self.folded_in_place = True
        self._inference_forms.clear()

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self.folded_in_place = False  # a loaded state holds v and g again
        self._inference_forms.clear()

    def product_weight(self) -> Tensor:
        """W (out x in) of the layer's one product at inference (a convolution's: its kernel as one matrix)."""
        return self._fold()

    def product_weight_t(self) -> Tensor:
        """W^T (in x out) for MKL, as :func:`transposed_for_mkl` makes it."""
        return transposed_for_mkl(self.product_weight())

    def inference_form(self, onednn: bool) -> Tensor:
        """The product weight as one inference product takes it: W packed for oneDNN, or W^T for MKL. Kept in
        the layer while it is folded in place (keyed by the storage and version of ``weight_v``, so an in-place
        edit is seen); otherwise derived afresh, for a caller that keeps it for a batch (``Product``)."""
        if not self.folded_in_place:
            with torch.no_grad():
                return pack_for_onednn(self.product_weight()) if onednn else self.product_weight_t()
        v = self.weight_v
        key = (v.data_ptr(), v._version, v.dtype, v.device)
        kept = self._inference_forms.get(onednn)
        if kept is None or kept[0] != key:
            with torch.no_grad():
                form = pack_for_onednn(self.product_weight()) if onednn else self.product_weight_t()
            kept = self._inference_forms[onednn] = (key, form)
        return kept[1]

    def product(self) -> Product:
        """The layer's product at inference, ``x W^T + b`` (N x in -> N x out), in the forms of
        :meth:`inference_form`."""
        return Product(self.inference_form, self.bias, self.weight_v.numel())


class WeightNormLinear(WeightNorm):
    """``y = x W^T + b`` with a weight-normalized ``W`` (out x in); the norm is per output unit."""

    norm_dims = (1,)
    output_dim = 0

    def __init__(self, in_features: int, out_features: int, std: float):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self._init_weight_norm(torch.randn(out_features, in_features) * std)
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x: Tensor) -> Tensor:
        """x: ... x in -> ... x out."""
        rows = x.reshape(-1, self.in_features)
        if not torch.is_grad_enabled() and not is_compiling():
            out = self.product()(rows)  # inference: the packed (or transposed) weight, kept once folded in place
        else:
            out = training_linear(rows, self.weight, self.bias)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}"


class WeightNormConvTBC(WeightNorm):
    """A 1-D convolution over time-batch-channel input with a weight-normalized kernel.

    The kernel is stored as ``k x in x out`` (fconv's ConvTBC layout) and normalized per output channel. The
    input is zero-padded by the ``(left, right)`` steps the caller asks for: the encoder's both sides, the
    decoder's ``k - 1`` on the left. In training on a CPU the convolution is one oneDNN product over the
    shifted inputs (``Im2colConvTBC``), elsewhere ``conv_tbc``.
    """

    norm_dims = (0, 1)
    output_dim = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, std: float):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = kernel_size
        self._init_weight_norm(torch.randn(kernel_size, in_channels, out_channels) * std)
        self.bias = nn.Parameter(torch.zeros(out_channels))

    def forward(self, x: Tensor, padding: Tuple[int, int] = (0, 0)) -> Tensor:
        """x: T x B x in, zero-padded by (left, right) steps -> T + left + right - k + 1 x B x out."""
        left, right = padding
        if is_compiling():
            # the same sums as conv1d over B x in x T: inductor's lowering of conv_tbc fails on a time-major
            # view of a batch-major tensor (torch 2.13, the wmt_en_de preset), a convolution it lowers natively
            x = F.pad(x.permute(1, 2, 0), (left, right))  # B x in x T+left+right
            return F.conv1d(x, self.weight.permute(2, 1, 0), self.bias).permute(2, 0, 1)  # T' x B x out
        weight = self.weight
        if torch.is_grad_enabled() and im2col_pays(x, weight):
            return Im2colConvTBC.apply(x.contiguous(), weight, self.bias, left, right)
        return padded_conv_tbc(x, weight, self.bias, padding)

    def product_weight(self) -> Tensor:
        """The kernel as one matrix, out x (k * in), for the convolution at one position over a window of k
        inputs flattened time-major."""
        return self._fold().permute(2, 0, 1).reshape(self.out_channels, -1)  # k x in x out -> out x (k * in)

    def product_weight_t(self) -> Tensor:
        # the kernel k x in x out read as (k * in) x out is the product weight's transpose: a view, no copy
        return self._fold().reshape(-1, self.out_channels)

    def forward_window(self, window: Tensor) -> Tensor:
        """The convolution at one position: window: B x (k * in), the last k inputs flattened time-major ->
        B x out."""
        if not torch.is_grad_enabled() and not is_compiling():
            return self.product()(window)
        return F.linear(window, self.product_weight(), self.bias)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"


def glu_input_std(fan_in: int, dropout: float) -> float:
    """Init std for a layer whose output feeds a GLU: sqrt(4p / n_l), p the retain probability (paper 3.5)."""
    return math.sqrt(4.0 * (1.0 - dropout) / fan_in)


def linear_std(fan_in: int, dropout: float = 0.0) -> float:
    """Init std for every other layer: sqrt(p / n_l), p the retain probability of its input (paper 3.5)."""
    return math.sqrt((1.0 - dropout) / fan_in)
