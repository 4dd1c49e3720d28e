"""Weight-normalized layers (Salimans & Kingma 2016), as ConvS2S uses on every layer but the lookup tables.

The weight is ``w = g * v / ||v||``. The parameters are named ``weight_v`` and ``weight_g``, the names that
``torch.nn.utils.weight_norm`` gives fairseq's fconv layers, so fconv state dicts map onto these layers tensor for
tensor.

Porting note (fconv): fconv re-derives ``w`` from ``g`` and ``v`` on every call, including every beam-search step.
Here, while gradients are off, ``w`` is folded once per *inference pass* and reused by every decoding step. A pass
starts at each encoder forward (:func:`start_inference_pass`), so whatever changed the parameters between two
batches is seen, including optimizers that write through ``p.data`` (fairseq's NAG does), which bumps no version
counter. The cache key also holds the parameters' storage and version, for in-place edits within a pass. After
``make_generation_fast_`` (what fairseq-generate, fairseq-interactive and the hub interface call, and after
which fairseq forbids training the model) the weights are folded once for good, in place, as fairseq's own
preparation folds fconv's by removing its weight norm: ``weight_v`` then holds ``w`` itself and ``weight_g``
its norm (so the state dict still describes ``w``), and no second copy of the weights is kept beside them.

At inference the folded weights are multiplied through oneDNN with the weight packed once per pass into its
blocked layout (:func:`inference_linear`); MKL's GEMM, what ``F.linear`` calls on the CPU, re-packs the weight
on every call, which dominates the few rows of a beam-search step. In training the large linears (the
vocabulary projection above all) run through oneDNN too (:func:`training_linear`), and so do the convolutions,
each as one product over its shifted inputs (:class:`_Im2colConvTBC`).
"""

import math
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_inference_pass = 0


# oneDNN's fixed cost per call (about 15-20 us here) is paid back from about a 512 x 512 weight and 2^20
# multiply-adds (rows x in x out) up; below either MKL is faster (measured: python -m benchmarks.linear_forms)
ONEDNN_MIN_WEIGHT = 1 << 18
ONEDNN_MIN_MACS = 1 << 20
_onednn_dtypes = {torch.float32, torch.bfloat16} if torch.backends.mkldnn.is_available() else set()


def start_inference_pass() -> None:
    """Invalidate every folded weight; the encoder calls this once per forward."""
    global _inference_pass
    _inference_pass += 1


class _WeightNorm(nn.Module):
    """Holds ``weight_v``/``weight_g`` and derives ``weight``; subclasses say over which dims the norm runs."""

    # dims of weight_v that the norm reduces over, and the one it keeps (the output channels)
    norm_dims: Tuple[int, ...] = ()
    output_dim: int = 0
    # set by ConvS2SModel.make_generation_fast_: folded weights outlive inference passes
    frozen: bool = False
    # set by fold_in_place (make_generation_fast_): weight_v holds w itself; cleared when a state dict is loaded
    _v_is_weight: bool = False

    def _init_weight_norm(self, v: Tensor) -> None:
        self.weight_v = nn.Parameter(v)
        # g starts at ||v|| so that the initial weight equals v (as torch.nn.utils.weight_norm does)
        self.weight_g = nn.Parameter(self._norm(v.detach()).clone())
        self._inference_cache: Dict[str, Tuple[tuple, Tensor]] = {}

    def __getstate__(self):
        # copies and pickles (EMA, deepcopy) leave the cache behind: oneDNN's packed tensors have no storage
        state = super().__getstate__()
        return {**state, "_inference_cache": {}}

    def _norm(self, v: Tensor) -> Tensor:
        return torch.linalg.vector_norm(v, dim=self.norm_dims, keepdim=True)

    def _derived(self, name: str, compute: Callable[[], Tensor]) -> Tensor:
        """``compute()``; while gradients are off, computed once per inference pass and parameter version."""
        v, g = self.weight_v, self.weight_g
        if (torch.is_grad_enabled() and (v.requires_grad or g.requires_grad)) or is_compiling():
            return compute()  # torch.compile: folded inside the graph, which keeps no state between calls
        inference_pass = None if self.frozen else _inference_pass
        key = (inference_pass, v.data_ptr(), g.data_ptr(), v._version, g._version, v.dtype, v.device)
        hit = self._inference_cache.get(name)
        if hit is None or hit[0] != key:
            with torch.no_grad():
                hit = (key, compute())
            self._inference_cache[name] = hit
        return hit[1]

    def _fold(self) -> Tensor:
        if self._v_is_weight:
            return self.weight_v
        # g * v / ||v||, in torch's fused kernel (the one torch.nn.utils.weight_norm and so fconv use): one pass
        # forward and backward instead of a norm, a division and two products
        return torch._weight_norm(self.weight_v, self.weight_g, self.output_dim)

    def fold_in_place(self) -> None:
        """Replace ``v`` by ``w = g * v / ||v||`` and ``g`` by ``||w||`` (for inference only: the state still
        describes ``w``, but training would now update ``w`` directly). The folded weight is computed as every
        pass computes it, so outputs stay bit for bit the same; the inference forms (packed, or transposed)
        are then derived from ``weight_v`` itself, with no folded copy beside it. Folding twice is a no-op."""
        if self._v_is_weight:
            return
        with torch.no_grad():
            w = torch._weight_norm(self.weight_v, self.weight_g, self.output_dim)
            self.weight_v.data = w
            self.weight_g.data = self._norm(w)
        self._v_is_weight = True
        self._inference_cache.clear()

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._v_is_weight = False  # a loaded state holds v and g again
        self._inference_cache.clear()

    @property
    def weight(self) -> Tensor:
        return self._derived("weight", self._fold)

    # the one product of a layer at inference: its cache name, W (out x in) and W^T (in x out)
    product_name = "weight"

    def _product_weight(self) -> Tensor:
        return self._fold()

    def _product_weight_t(self) -> Tensor:
        raise NotImplementedError


class WeightNormLinear(_WeightNorm):
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
        if torch.is_grad_enabled():
            out = training_linear(x.reshape(-1, self.in_features), self.weight, self.bias)
            return out.view(*x.shape[:-1], self.out_features)
        # inference: the weight folded (and packed, or transposed) once per pass
        out = inference_linear(self, x.reshape(-1, self.in_features), self.bias)
        return out.view(*x.shape[:-1], self.out_features)

    def _product_weight_t(self) -> Tensor:
        # MKL's product on a CPU runs faster on a contiguous W^T; a GPU's takes the transposed view as it is
        # (what F.linear passes), with no copy of the weight
        w = self._fold()
        return w.t().contiguous() if w.device.type == "cpu" else w.t()

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}"


class WeightNormConvTBC(_WeightNorm):
    """A 1-D convolution over time-batch-channel input with a weight-normalized kernel.

    The kernel is stored as ``k x in x out`` (fconv's ConvTBC layout) and normalized per output channel. The
    input is zero-padded by the ``(left, right)`` steps the caller asks for: the encoder's both sides, the
    decoder's ``k - 1`` on the left. In training on a CPU the convolution is one oneDNN product over the
    shifted inputs (:class:`_Im2colConvTBC`), elsewhere ``conv_tbc``.
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
        if torch.is_grad_enabled() and _im2col_pays(x, weight):
            return _Im2colConvTBC.apply(x.contiguous(), weight, self.bias, left, right)
        if left != right:
            x = F.pad(x, (0, 0, 0, 0, left, right))  # causal (or an even kernel): pad the time dim
            left = 0
        return torch.conv_tbc(x.contiguous(), weight, self.bias, left)  # conv_tbc pads both sides without a copy

    def linearized_weight(self) -> Tensor:
        """The kernel as one matrix, out x (k * in), for applying the conv to a cached window of k inputs."""
        return self._derived("linearized", self._linearize)

    def _linearize(self) -> Tensor:
        # k x in x out -> out x k x in -> out x (k * in); the window is flattened time-major to match
        return self._fold().permute(2, 0, 1).reshape(self.out_channels, -1)

    product_name = "linearized"

    def _product_weight(self) -> Tensor:
        return self._linearize()

    def _product_weight_t(self) -> Tensor:
        # the kernel k x in x out read as (k * in) x out is the linearized weight's transpose: a view, no copy
        return self._fold().reshape(-1, self.out_channels)

    def forward_window(self, window: Tensor) -> Tensor:
        """The convolution at one position: window: B x (k * in), the last k inputs flattened time-major ->
        B x out."""
        if torch.is_grad_enabled():
            return F.linear(window, self.linearized_weight(), self.bias)
        # only the packed (or transposed) matrix is cached: the plain one would be another copy of the kernel
        return inference_linear(self, window, self.bias)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"


def _use_onednn(x: Tensor, out_features: int) -> bool:
    """x: N x in. Large enough products on the CPU, in a dtype oneDNN takes."""
    return _onednn_pays(x, x.size(1) * out_features)


def _onednn_pays(x: Tensor, weight_size: int, rows: Optional[int] = None) -> bool:
    """x: N x in (or ``rows`` rows of it), times a weight of ``weight_size`` (in x out) entries:
    :func:`_use_onednn`'s choice."""
    if _onednn_linear_op is None and is_compiling():
        return False
    rows = x.size(0) if rows is None else rows
    large = weight_size >= ONEDNN_MIN_WEIGHT and rows * weight_size >= ONEDNN_MIN_MACS
    return large and x.device.type == "cpu" and x.dtype in _onednn_dtypes


def _onednn_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """x W^T + b by oneDNN; weight: out x in, plain or packed by ``_reorder_linear_weight``."""
    if is_compiling():
        return _onednn_linear_op(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


# Whether torch.compile is tracing the model now: torch's own function, looked up once (it is asked at every
# oneDNN product of a decoding step); never, on a torch without it. Under compilation the model takes forms that
# trace as one graph: see the callers' notes.
is_compiling: Callable[[], bool] = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


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


def inference_weight(layer: _WeightNorm, onednn: bool) -> Tensor:
    """The layer's product weight in the form one inference product takes, cached in ``layer`` for the pass:
    ``W`` packed for oneDNN, or ``W^T`` for MKL (or a GPU)."""
    name = layer.product_name
    if onednn and is_compiling():
        return layer._product_weight()  # oneDNN packs a plain weight itself; packing has no graph form
    if onednn:
        return layer._derived(
            name + ".onednn", lambda: torch.ops.mkldnn._reorder_linear_weight(layer._product_weight(), None)
        )
    return layer._derived(name + ".t", layer._product_weight_t)


def inference_linear(layer: _WeightNorm, x: Tensor, bias: Tensor) -> Tensor:
    """``x W^T + b`` of the layer's product while gradients are off; x: N x in -> N x out.

    Large enough products on the CPU go through oneDNN with ``W`` packed once per pass; the rest through MKL on
    ``W^T`` folded once per pass. Both caches live in ``layer``'s inference cache.
    """
    if _use_onednn(x, bias.size(0)):
        return _onednn_linear(x, inference_weight(layer, True), bias)
    return torch.addmm(bias, x, inference_weight(layer, False))


class FoldedProduct:
    """``x W^T + b`` of one weight-normalized layer for the decoding steps of one inference pass.

    The choice and the weights of :func:`inference_linear`, looked up in the layer once per pass and form
    instead of at every call: a beam-search step of a small model is a few dozen small products, where the
    lookup (a cache key of storages and versions) and the module call cost as much as the product.
    x: N x in -> N x out, gradients off.
    """

    __slots__ = ("_layer", "_bias", "_weight_size", "_forms")

    def __init__(self, layer: _WeightNorm, in_features: int):
        self._layer = layer
        self._bias = layer.bias
        self._weight_size = in_features * layer.bias.size(0)
        self._forms: list = [None, None]  # [W^T for MKL, W packed for oneDNN], fetched on first use

    def __call__(self, x: Tensor) -> Tensor:
        onednn = _onednn_pays(x, self._weight_size)
        w = self._forms[onednn]
        if w is None:
            w = self._forms[onednn] = inference_weight(self._layer, onednn)
        return _onednn_linear(x, w, self._bias) if onednn else torch.addmm(self._bias, x, w)


def folded_product(layer: nn.Module) -> Callable[[Tensor], Tensor]:
    """The product of a layer for one inference pass: a :class:`FoldedProduct` for a weight-normalized layer
    (its ``W``, or a convolution's kernel as one matrix), the layer itself otherwise (a plain ``nn.Linear``)."""
    if isinstance(layer, WeightNormLinear):
        return FoldedProduct(layer, layer.in_features)
    if isinstance(layer, WeightNormConvTBC):
        return FoldedProduct(layer, layer.kernel_size * layer.in_channels)
    return layer


def current_inference_pass() -> int:
    """Changes at every :func:`start_inference_pass`: what a per-pass cache is keyed by."""
    return _inference_pass


class _OneDNNLinear(torch.autograd.Function):
    """``x W^T + b`` whose forward and input gradient run through oneDNN; the weight gradient, a long reduction
    over the rows, stays on MKL: through oneDNN it measured no faster (python -m benchmarks.train_forms)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:  # x: N x in, weight: out x in
        ctx.save_for_backward(x, weight)
        return _onednn_linear(x, weight, bias)  # N x out

    @staticmethod
    def backward(ctx, grad: Tensor):  # grad: N x out
        x, weight = ctx.saved_tensors
        grad_x = _onednn_linear(grad, weight.t(), None) if ctx.needs_input_grad[0] else None  # N x in
        grad_weight = grad.t().mm(x) if ctx.needs_input_grad[1] else None  # out x in
        grad_bias = grad.sum(0) if ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


class _Im2colConvTBC(torch.autograd.Function):
    """conv_tbc's convolution, forward and input gradient as one oneDNN product each over the k shifted inputs
    side by side (im2col), the weight gradient per tap on MKL as conv_tbc computes it.

    Porting note (fconv): conv_tbc runs k products of (T*B) x in by in x out on MKL, accumulating into the
    output. One (T*B) x (k*in) product through oneDNN made a block's convolution, forward and backward,
    1.03-1.10x faster at the presets' widths (``python -m benchmarks.conv_forms``) and a training update
    1.08x (iwslt size) and 1.11x (wmt_en_de size) faster (``python -m benchmarks.train_forms --variants
    conv-tbc``). Only the input is kept for the backward, not the k times larger columns: the weight gradient
    is taken per tap from it, as conv_tbc takes it. The sums are the same, in another order.
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, left: int, right: int) -> Tensor:
        # x: T x B x in, weight: k x in x out -> T' x B x out, T' = T + left + right - k + 1
        k, c_in, c_out = weight.shape
        steps = x.size(0) + left + right - k + 1
        columns = _im2col(x, k, left, steps)  # T' x B x k x in
        flat_weight = weight.reshape(k * c_in, c_out).t()  # out x (k * in), tap-major like the columns
        y = _onednn_linear(columns.view(-1, k * c_in), flat_weight, bias)  # T'*B x out
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
            grad_columns = _onednn_linear(g, weight.reshape(k * c_in, c_out), None)  # T'*B x (k * in)
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


def _im2col_pays(x: Tensor, weight: Tensor) -> bool:
    """x: T x B x in, weight: k x in x out. The training convolution as one oneDNN product where its linear
    would go through oneDNN (a CPU, fp32 or bf16, a large enough product)."""
    return _onednn_pays(x, weight.numel(), rows=x.size(0) * x.size(1))


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
    if _use_onednn(x, weight.size(0)):
        return _OneDNNLinear.apply(x, weight, bias)
    return F.linear(x, weight, bias)


def glu_input_std(fan_in: int, dropout: float) -> float:
    """Init std for a layer whose output feeds a GLU: sqrt(4p / n_l), p the retain probability (paper 3.5)."""
    return math.sqrt(4.0 * (1.0 - dropout) / fan_in)


def linear_std(fan_in: int, dropout: float = 0.0) -> float:
    """Init std for every other layer: sqrt(p / n_l), p the retain probability of its input (paper 3.5)."""
    return math.sqrt((1.0 - dropout) / fan_in)
