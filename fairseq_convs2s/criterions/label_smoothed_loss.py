"""fairseq's label-smoothed cross-entropy taken from the logits in one fused pass (or from the features and the output
projection, chunk by chunk, without the logits): the arithmetic of ``--criterion
fused_label_smoothed_cross_entropy`` and of ``sequence_risk``'s token terms.

The loss and its gradient follow from the logits x and each row's log-sum-exp alone,

    nll_i    = lse_i - x_{i,t_i}
    smooth_i = V * lse_i - sum_j x_ij                         (= -sum_j log p_ij)
    loss_i   = (1 - eps - eps_i) * nll_i + eps_i * smooth_i,   eps_i = eps / (V - 1)   (fairseq's formula)
    dloss_i / dx_ij = (1 - eps - eps_i + V * eps_i) * p_ij - eps_i - (1 - eps - eps_i) * [j = t_i]

so the forward reads the logits once and the backward writes the gradient once, on a CPU a few rows at a time
(cache-sized chunks) so the passes within a chunk hit the cache; on a GPU all rows at once. The criterion's summed
loss takes its gradient in the forward, from the same softmax as its value (``loss_of_logits``); sequence-level
training, which differentiates each row's NLL, takes it in the backward (``label_smoothed_nll_loss_from_logits``).
"""

from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from convs2s_runtime.products import is_compiling, onednn_linear, onednn_pays, pack_for_onednn

# rows per chunk: about this many bytes of fp32 logits, so a chunk's few passes stay in the cache
CHUNK_BYTES = 1 << 20
# rows per chunk of the projected loss: enough for the chunk's three products to run at the matmul's pace
PROJECTED_CHUNK_ROWS = 256


class _LabelSmoothedFromLogits(torch.autograd.Function):
    """Per-row label-smoothed loss (N) and NLL (N) from logits (N x V), both with gradients; pad rows give 0.

    The NLL's gradient is what sequence-level training needs of the candidates' rows (their summed log-
    probabilities): d nll_i / dx_ij = p_ij - [j = t_i]. Both gradients leave in the same single pass.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, ignore_index: int):
        n, vocab = logits.shape
        eps_i, on_target = _smoothing_weights(epsilon, vocab)
        compute = _compute_dtype(logits)
        lse = logits.new_empty(n, dtype=compute)  # N: log sum_j exp x_ij
        row_sum = logits.new_empty(n, dtype=compute)  # N: sum_j x_ij
        for start, end in _chunks(n, vocab, logits.device):
            x = logits[start:end].to(compute)  # rows x V, in the cache
            torch.logsumexp(x, dim=-1, out=lse[start:end])
            torch.sum(x, dim=-1, out=row_sum[start:end])
        keep = target.ne(ignore_index)  # N
        target_logit = logits.gather(1, target.clamp(min=0).unsqueeze(1)).squeeze(1).to(compute)  # N
        nll = (lse - target_logit) * keep
        smooth = (vocab * lse - row_sum) * keep
        loss = on_target * nll + eps_i * smooth
        ctx.save_for_backward(logits, target, lse, keep)
        ctx.epsilon = epsilon
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):  # both N
        logits, target, lse, keep = ctx.saved_tensors
        n, vocab = logits.shape
        eps_i, on_target = _smoothing_weights(ctx.epsilon, vocab)
        g = grad_loss.to(lse) * keep  # N
        g_nll = grad_nll.to(lse) * keep  # N
        softmax_scale = (on_target + vocab * eps_i) * g + g_nll  # N: the coefficient of p_ij
        grad = torch.empty_like(logits)  # N x V
        in_place = logits.dtype == lse.dtype  # written in place, else a chunk to cast
        for start, end in _chunks(n, vocab, logits.device):
            out = grad[start:end] if in_place else None
            p = torch.sub(logits[start:end].to(lse), lse[start:end, None], out=out).exp_()  # rows x V: p_ij
            p.mul_(softmax_scale[start:end, None]).sub_(eps_i * g[start:end, None])
            if not in_place:
                grad[start:end] = p
        on_target_grad = -(on_target * g + g_nll)  # N: the coefficient of [j = t_i]
        grad.scatter_add_(1, target.clamp(min=0).unsqueeze(1), on_target_grad.to(grad.dtype).unsqueeze(1))
        return grad, None, None, None


class _SummedLabelSmoothedFromLogits(torch.autograd.Function):
    """The summed label-smoothed loss of logits (N x V, any float dtype) and its NLL (no gradient), the loss's
    gradient taken in the same pass as its value.

    A chunk of rows at a time: the rows in fp32, their softmax in place (one exponential per logit), the loss's
    terms, then the gradient (the formula in the module's docstring, with g = 1) written in the logits' dtype.
    The backward scales it by the loss's gradient, a scalar; with fairseq's unscaled bf16 loss that scalar is 1
    and the gradient leaves as it is. Against :class:`_LabelSmoothedFromLogits` (the log-sum-exp in the forward,
    the softmax again in the backward) this is one exponential per logit instead of two and one read of the
    logits instead of two; the logits themselves are not kept.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, ignore_index: int):
        n, vocab = logits.shape
        eps_i, on_target = _smoothing_weights(epsilon, vocab)
        compute = _compute_dtype(logits)
        keep = target.ne(ignore_index)  # N
        target = target.clamp(min=0).unsqueeze(1)  # N x 1 (an ignored row may hold a negative index)
        target_logit = logits.gather(1, target).squeeze(1).to(compute)  # N
        with_grad = ctx.needs_input_grad[0]
        grad = torch.empty_like(logits) if with_grad else None  # N x V
        lse = logits.new_empty(n, dtype=compute)  # N: log sum_j exp x_ij
        row_sum = logits.new_empty(n, dtype=compute)  # N: sum_j x_ij
        in_place = with_grad and logits.dtype == compute  # the softmax written into grad, else into a fp32 copy
        for start, end in _chunks(n, vocab, logits.device):
            z = logits[start:end]  # rows x V
            x = z.to(compute, copy=not in_place)  # rows x V: the logits, or a fp32 copy in the cache
            torch.sum(x, dim=-1, out=row_sum[start:end])
            p, lse[start:end] = _softmax_and_lse(x, out=grad[start:end] if in_place else x)  # rows x V, rows
            if not with_grad:
                continue
            _loss_gradient_from_softmax_(p, target[start:end], eps_i, on_target)
            if not in_place:
                grad[start:end] = p
        nll = (lse - target_logit) * keep
        smooth = (vocab * lse - row_sum) * keep
        if with_grad:  # an ignored row gives no gradient
            if logits.device.type != "cpu":
                grad.masked_fill_(~keep.unsqueeze(1), 0)  # (no wait for the device, as a test of keep would be)
            elif not bool(keep.all()):
                grad[~keep] = 0  # those rows alone
        ctx.grad = grad  # kept until the backward, which releases it
        loss = (on_target * nll + eps_i * smooth).sum()
        nll_loss = nll.sum()
        ctx.mark_non_differentiable(nll_loss)
        return loss, nll_loss

    @staticmethod
    def backward(ctx, grad_loss: Tensor, unused: Tensor):
        grad, ctx.grad = ctx.grad, None
        if grad is None:
            raise RuntimeError("the fused loss's gradient was taken once already (it is not kept: retain_graph)")
        if grad_loss.device.type == "cpu" and bool(grad_loss == 1):  # fairseq's bf16 and fp32 losses: unscaled
            return grad, None, None, None
        return grad.mul_(grad_loss.to(grad.dtype)), None, None, None


def _softmax_and_lse(x: Tensor, out: Tensor) -> Tuple[Tensor, Tensor]:
    """The softmax of the rows of x (rows x V, fp32 or fp64) written into ``out`` (x itself may be: softmax's own
    kernel reads a row's maximum before it writes any of the row, and is cheaper than subtracting the maximum, exp_
    and a sum: BENCHMARKS.md, "Tried and dropped", ``chunk_forms``), and each row's log-sum-exp (rows), from one
    exponential per logit."""
    row_max = x.amax(-1)  # rows
    p = torch.ops.aten._softmax.out(x, -1, False, out=out)  # rows x V: p_ij
    # at the row's maximum p = exp(0) / sum_j exp(x_ij - max_i), so -log of p's maximum is that sum's log
    return p, row_max - p.amax(-1).log()


def _loss_gradient_from_softmax_(p: Tensor, target: Tensor, eps_i: float, on_target: float) -> None:
    """p (rows x V, a softmax) becomes, in place, the gradient of fairseq's label-smoothed loss for a row
    gradient g = 1: (on_target + V eps_i) p_ij - eps_i - on_target [j = t_i]; target: rows x 1. Scalar passes: an
    addcmul of broadcast rows x 1 factors is much slower."""
    vocab = p.size(1)
    p.mul_(on_target + vocab * eps_i).sub_(eps_i)
    p.scatter_add_(1, target, p.new_full((p.size(0), 1), -on_target))


def _smoothing_weights(epsilon: float, vocab: int) -> Tuple[float, float]:
    """fairseq's weights of a row's loss terms: (eps_i = eps / (V - 1), the smoothing term's; 1 - eps - eps_i,
    the target's NLL's)."""
    eps_i = epsilon / (vocab - 1)
    return eps_i, 1.0 - epsilon - eps_i


def _compute_dtype(logits: Tensor) -> torch.dtype:
    """fp32 for fp32, fp16 and bf16 logits (as fairseq's log-softmax); fp64 stays fp64."""
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def _chunks(n: int, vocab: int, device: torch.device):
    """(start, end) row ranges: about CHUNK_BYTES of fp32 logits each on a CPU, all N rows in one elsewhere."""
    rows = max(1, CHUNK_BYTES // (4 * vocab)) if device.type == "cpu" else max(n, 1)
    return ((start, min(start + rows, n)) for start in range(0, n, rows))


def label_smoothed_nll_loss_from_logits(
    logits: Tensor, target: Tensor, epsilon: float, ignore_index: int, reduce: bool = True
) -> Tuple[Tensor, Tensor]:
    """fairseq's ``label_smoothed_nll_loss(log_softmax(logits), target, ...)`` in one fused pass.

    logits: N x V (any float dtype; computed in fp32, or fp64 for fp64), target: N. Returns (loss, nll_loss):
    sums with ``reduce``, else N x 1 as fairseq's function returns them with an ``ignore_index``. Both carry
    gradients (fairseq's criterion logs the NLL only; sequence-level training scores candidates by it).
    """
    loss, nll = _LabelSmoothedFromLogits.apply(logits.contiguous(), target.contiguous(), epsilon, ignore_index)
    if reduce:
        return loss.sum(), nll.sum()
    return loss.unsqueeze(1), nll.unsqueeze(1)


class ProjectedLossTargets(NamedTuple):
    """The targets of the selected positions (``output_rows``) and fairseq's loss settings."""

    target: Tensor  # N: the target of each selected position, in row-major order
    epsilon: float  # label smoothing
    ignore_index: int  # rows with this target count nothing (the padding)
    count_correct: bool = False  # also count the rows whose argmax is the target (--report-accuracy)


class ProjectedLoss(NamedTuple):
    """The label-smoothed loss of the selected positions, summed."""

    loss: Tensor  # scalar, with gradients
    nll_loss: Tensor  # scalar, without
    n_correct: Optional[Tensor]  # scalar count (``count_correct``), else None


class _ProjectedLabelSmoothed(torch.autograd.Function):
    """The summed label-smoothed loss (and NLL) of the logits ``x W^T + b`` (N x V), without the N x V logits.

    A chunk of rows at a time: its logits, their loss, their gradient (the formula in the module's docstring)
    and that gradient's products with ``W`` and ``x``; the gradients of ``x``, ``W`` and ``b`` are complete
    when the forward ends, and the backward scales them by the loss's gradient (they are linear in it). The
    products are those of the projection, forward and backward, on row blocks: the arithmetic is the same, the
    logits and their gradient never leave the cache, and no N x V tensor is allocated (on a CPU a fresh one
    costs its page faults at every update: 66 MB for 1,664 rows of a 10,000-word vocabulary).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, target, epsilon: float, ignore_index: int, count_correct: bool):
        # x: N x d, weight: V x d, bias: V (or None), target: N
        n, vocab = x.size(0), weight.size(0)
        eps_i, on_target = _smoothing_weights(epsilon, vocab)
        keep = target.ne(ignore_index)  # N
        target = target.clamp(min=0).unsqueeze(1)  # N x 1 (an ignored row may hold a negative index)
        with_grad = any(ctx.needs_input_grad[:3])
        onednn = onednn_pays(x, weight.numel())
        if onednn:  # W packed once for all the chunks
            w_forward = pack_for_onednn(weight)
            # the input gradient's weight, W^T, as a view: oneDNN reads it in place, faster than W^T copied and
            # packed (BENCHMARKS.md, "Tried and dropped")
            w_backward = weight.t()
        nll = x.new_empty(n)
        smooth = x.new_empty(n)
        correct = x.new_zeros(n, dtype=torch.bool)
        if with_grad:
            grad_x = torch.empty_like(x)
            grad_weight = torch.empty_like(weight) if n else torch.zeros_like(weight)  # (written by chunk 0)
            grad_bias = torch.zeros_like(bias) if bias is not None else None
        for start in range(0, n, PROJECTED_CHUNK_ROWS):
            rows = slice(start, min(start + PROJECTED_CHUNK_ROWS, n))
            xc, tc, kc = x[rows], target[rows], keep[rows]
            if onednn:
                z = onednn_linear(xc, w_forward, bias)  # rows x V, the logits
            else:
                z = torch.addmm(bias, xc, weight.t()) if bias is not None else xc.mm(weight.t())
            target_logit = z.gather(1, tc).squeeze(1)  # rows
            row_sum = z.sum(-1)  # rows: sum_j x_ij
            if count_correct:
                correct[rows] = z.argmax(-1).eq(tc.squeeze(1)) & kc
            p, lse = _softmax_and_lse(z, out=z)  # rows x V: p_ij, in z's memory; rows: log sum_j exp x_ij
            nll[rows] = (lse - target_logit) * kc
            smooth[rows] = (vocab * lse - row_sum) * kc
            if not with_grad:
                continue
            _loss_gradient_from_softmax_(p, tc, eps_i, on_target)  # g = 1 on a counted row
            if not bool(kc.all()):
                p.mul_(kc.unsqueeze(1))  # g = 0: an ignored row gives no gradient
            grad_x[rows] = onednn_linear(p, w_backward, None) if onednn else p.mm(weight)  # rows x d
            grad_weight.addmm_(p.t(), xc, beta=0 if start == 0 else 1)  # V x d (beta 0: the empty start ignored)
            if grad_bias is not None:
                grad_bias += p.sum(0)
        if with_grad:
            ctx.save_for_backward(grad_x, grad_weight, grad_bias)
        loss = (on_target * nll + eps_i * smooth).sum()
        nll_loss, n_correct = nll.sum(), correct.sum()
        ctx.mark_non_differentiable(nll_loss, n_correct)
        return loss, nll_loss, n_correct

    @staticmethod
    def backward(ctx, grad_loss: Tensor, *unused):
        grad_x, grad_weight, grad_bias = ctx.saved_tensors
        return (
            grad_x * grad_loss if ctx.needs_input_grad[0] else None,
            grad_weight * grad_loss if ctx.needs_input_grad[1] else None,
            grad_bias * grad_loss if grad_bias is not None and ctx.needs_input_grad[2] else None,
            None,
            None,
            None,
            None,
        )


def projects_in_chunks(x: Tensor) -> bool:
    """Whether a decoder's rows x (N x d) go through :func:`projected_label_smoothed_loss`: on a CPU, in fp32
    or fp64, eagerly. (A GPU runs the whole projection as one product: chunks would cost launches; bf16
    gradients summed over chunks would be rounded once a chunk; torch.compile traces the plain form.)"""
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and not is_compiling()


def projected_label_smoothed_loss(
    x: Tensor, weight: Tensor, bias: Optional[Tensor], targets: ProjectedLossTargets
) -> ProjectedLoss:
    """fairseq's label-smoothed loss, summed, of the logits ``x W^T + b`` (x: N x d, weight: V x d), without
    materializing them (:class:`_ProjectedLabelSmoothed`): equal to :func:`loss_of_logits` of ``F.linear``'s
    logits, to float rounding, with the same gradients."""
    loss, nll_loss, n_correct = _ProjectedLabelSmoothed.apply(
        x.contiguous(),
        weight,
        bias,
        targets.target.contiguous(),
        targets.epsilon,
        targets.ignore_index,
        targets.count_correct,
    )
    return ProjectedLoss(loss, nll_loss, n_correct if targets.count_correct else None)


def loss_of_logits(logits: Tensor, targets: ProjectedLossTargets) -> ProjectedLoss:
    """The :class:`ProjectedLoss` of given logits (N x V), its gradient taken with its value
    (:class:`_SummedLabelSmoothedFromLogits`)."""
    loss, nll_loss = _SummedLabelSmoothedFromLogits.apply(
        logits.contiguous(), targets.target.contiguous(), targets.epsilon, targets.ignore_index
    )
    n_correct = None
    if targets.count_correct:
        n_correct = (logits.argmax(1).eq(targets.target) & targets.target.ne(targets.ignore_index)).sum()
    return ProjectedLoss(loss, nll_loss, n_correct)
