"""``--criterion fused_label_smoothed_cross_entropy``: fairseq's ``label_smoothed_cross_entropy``, taken from the
logits in one fused pass instead of through a stored log-softmax.

fairseq's criterion materializes the log-probabilities (N x V), gathers the target's, sums every row for the
smoothing term, and its backward then writes a zero tensor, scatters into it, adds the smoothing gradient and
runs log-softmax's backward: about ten passes over N x V floats, which for a 10,000-word vocabulary is a
quarter of a small model's training update on a CPU. The same loss and the same gradient follow from the
logits x and each row's log-sum-exp alone,

    nll_i    = lse_i - x_{i,t_i}
    smooth_i = V * lse_i - sum_j x_ij                         (= -sum_j log p_ij)
    loss_i   = (1 - eps - eps_i) * nll_i + eps_i * smooth_i,   eps_i = eps / (V - 1)   (fairseq's formula)
    dloss_i / dx_ij = (1 - eps - eps_i + V * eps_i) * p_ij - eps_i - (1 - eps - eps_i) * [j = t_i]

so the forward reads the logits once and the backward writes the gradient once, on a CPU a few rows at a time
(cache-sized chunks) so the passes within a chunk hit the cache. On a GPU all rows go at once: there each chunk
costs a handful of kernel launches, which made the chunked loss slower than fairseq's on an H200. Values equal
fairseq's to float rounding (tested, with the gradient), for any fairseq model whose decoder normalizes by a
plain log-softmax; others (adaptive softmax, a model with its own ``get_normalized_probs``) fall back to
fairseq's computation.
"""

from typing import Tuple

import torch
from fairseq import utils
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.models import BaseFairseqModel, FairseqDecoder
from torch import Tensor

# rows per chunk: about this many bytes of fp32 logits, so a chunk's few passes stay in the cache
CHUNK_BYTES = 1 << 20


class _LabelSmoothedFromLogits(torch.autograd.Function):
    """Per-row label-smoothed loss (N) and NLL (N) from logits (N x V), both with gradients; pad rows give 0.

    The NLL's gradient is what sequence-level training needs of the candidates' rows (their summed log-
    probabilities): d nll_i / dx_ij = p_ij - [j = t_i]. Both gradients leave in the same single pass.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, ignore_index: int):
        n, vocab = logits.shape
        eps_i = epsilon / (vocab - 1)
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
        loss = (1.0 - epsilon - eps_i) * nll + eps_i * smooth
        ctx.save_for_backward(logits, target, lse, keep)
        ctx.epsilon = epsilon
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):  # both N
        logits, target, lse, keep = ctx.saved_tensors
        n, vocab = logits.shape
        eps_i = ctx.epsilon / (vocab - 1)
        on_target = 1.0 - ctx.epsilon - eps_i
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


def unwrap(model):
    """The model inside fairseq's distributed wrappers (ModuleProxyWrapper around DistributedDataParallel)."""
    while isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module
    return model


def normalizes_by_log_softmax(model) -> bool:
    """Whether ``model.get_normalized_probs`` is a plain log-softmax of the decoder's first output."""
    model = unwrap(model)
    decoder = getattr(model, "decoder", None)
    if not isinstance(decoder, FairseqDecoder):
        return False
    overridden = {"get_normalized_probs", "get_normalized_probs_scriptable"} & (
        vars(model).keys() | vars(decoder).keys()
    )  # on the instance
    return (
        not overridden
        and getattr(decoder, "adaptive_softmax", None) is None
        and type(model).get_normalized_probs is BaseFairseqModel.get_normalized_probs
        and type(model).get_normalized_probs_scriptable is BaseFairseqModel.get_normalized_probs_scriptable
        and type(decoder).get_normalized_probs is FairseqDecoder.get_normalized_probs
        and type(decoder).get_normalized_probs_scriptable is FairseqDecoder.get_normalized_probs_scriptable
    )


def projects_selected_rows(model) -> bool:
    """Whether the model's decoder takes ``output_rows`` (B x T bool) and returns the logits of those positions
    alone (N x V): ConvS2S's decoder does; fairseq's models, fconv among them, project every position."""
    return getattr(getattr(unwrap(model), "decoder", None), "projects_selected_rows", False) is True


@register_criterion("fused_label_smoothed_cross_entropy", dataclass=LabelSmoothedCrossEntropyCriterionConfig)
class FusedLabelSmoothedCrossEntropyCriterion(LabelSmoothedCrossEntropyCriterion):
    """fairseq's ``label_smoothed_cross_entropy`` (same flags, same loss, gradient and logging), computed from
    the logits in one fused pass where the model normalizes by a plain log-softmax; for a model that can
    project selected positions (ConvS2S), from the logits of the target's non-padding positions alone."""

    def forward(self, model, sample, reduce=True):
        if not (reduce and projects_selected_rows(model) and normalizes_by_log_softmax(model)):
            return super().forward(model, sample, reduce=reduce)
        target = sample["target"]  # B x T
        rows = target.ne(self.padding_idx)  # B x T: the positions the loss counts
        if self.ignore_prefix_size > 0:
            rows[:, : self.ignore_prefix_size] = False
        logits = model(**sample["net_input"], output_rows=rows)[0]  # N x V
        target = target[rows]  # N
        loss, nll_loss = label_smoothed_nll_loss_from_logits(logits, target, self.eps, self.padding_idx)
        nsentences = sample["target"].size(0)
        sample_size = nsentences if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": nsentences,
            "sample_size": sample_size,
        }
        if self.report_accuracy:
            logging_output["n_correct"] = utils.item(logits.argmax(1).eq(target).sum())
            logging_output["total"] = target.numel()
        return loss, sample_size, logging_output

    def compute_loss(self, model, net_output, sample, reduce=True):
        if not normalizes_by_log_softmax(model):
            return super().compute_loss(model, net_output, sample, reduce=reduce)
        logits, target = self._logits_and_target(model, net_output, sample)
        return label_smoothed_nll_loss_from_logits(logits, target, self.eps, self.padding_idx, reduce=reduce)

    def compute_accuracy(self, model, net_output, sample):
        if not normalizes_by_log_softmax(model):
            return super().compute_accuracy(model, net_output, sample)
        logits, target = self._logits_and_target(model, net_output, sample)  # argmax of logits = of log-probs
        mask = target.ne(self.padding_idx)
        n_correct = logits.argmax(1).masked_select(mask).eq(target.masked_select(mask)).sum()
        return n_correct, mask.sum()

    def _logits_and_target(self, model, net_output, sample) -> Tuple[Tensor, Tensor]:
        logits = net_output[0]  # B x T x V
        target = model.get_targets(sample, net_output)  # B x T
        if self.ignore_prefix_size > 0:
            logits = logits[:, self.ignore_prefix_size :, :]
            target = target[:, self.ignore_prefix_size :]
        return logits.reshape(-1, logits.size(-1)), target.reshape(-1)
