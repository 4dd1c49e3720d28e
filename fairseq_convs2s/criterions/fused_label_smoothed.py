"""``--criterion fused_label_smoothed_cross_entropy``: fairseq's ``label_smoothed_cross_entropy``, taken from the
logits in one fused pass instead of through a stored log-softmax (``label_smoothed_loss.py``).

fairseq's criterion materializes the log-probabilities (N x V), gathers the target's, sums every row for the
smoothing term, and its backward then writes a zero tensor, scatters into it, adds the smoothing gradient and
runs log-softmax's backward: about ten passes over N x V floats, which for a 10,000-word vocabulary is a
quarter of a small model's training update on a CPU. Here the forward reads the logits once and the backward
writes the gradient once; for a ConvS2S model on a CPU the logits are not even stored (the decoder's features
and its output projection, a chunk of rows at a time). Values equal fairseq's to float rounding (tested, with the
gradient), for any fairseq model whose decoder normalizes by a plain log-softmax; others (adaptive softmax, a
model with its own ``get_normalized_probs``) fall back to fairseq's computation.
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

from ..errors import InputError
from ..models.decoder import ConvS2SDecoder
from .label_smoothed_loss import (
    ProjectedLoss,
    ProjectedLossTargets,
    label_smoothed_nll_loss_from_logits,
    loss_of_logits,
    projected_label_smoothed_loss,
    projects_in_chunks,
)


def unwrap(model):
    """The model inside fairseq's distributed wrappers (ModuleProxyWrapper around DistributedDataParallel) and
    torch.compile's (``OptimizedModule``, whose ``_orig_mod`` it is; calls still go through the wrappers)."""
    while True:
        inner = getattr(model, "_orig_mod", None)
        inner = inner if isinstance(inner, torch.nn.Module) else getattr(model, "module", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


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
    alone (N x V), and exposes ``output_features`` and ``output_projection``: ConvS2S's decoder does; fairseq's
    models, fconv among them, project every position."""
    return isinstance(getattr(unwrap(model), "decoder", None), ConvS2SDecoder)


@register_criterion("fused_label_smoothed_cross_entropy", dataclass=LabelSmoothedCrossEntropyCriterionConfig)
class FusedLabelSmoothedCrossEntropyCriterion(LabelSmoothedCrossEntropyCriterion):
    """fairseq's ``label_smoothed_cross_entropy`` (same flags, same loss, gradient and logging), computed from
    the logits in one fused pass where the model normalizes by a plain log-softmax; for a model that can
    project selected positions (ConvS2S), from the logits of the target's non-padding positions alone."""

    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False):
        # fairseq's criterion takes any --label-smoothing and trains on: above 1 the target's weight turns negative
        if not 0.0 <= label_smoothing < 1.0:
            raise InputError(f"--label-smoothing must lie in [0, 1), got {label_smoothing}")
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)

    def forward(self, model, sample, reduce=True):
        if not (reduce and projects_selected_rows(model) and normalizes_by_log_softmax(model)):
            return super().forward(model, sample, reduce=reduce)
        target = sample["target"]  # B x T
        rows = target.ne(self.padding_idx)  # B x T: the positions the loss counts
        if self.ignore_prefix_size > 0:
            rows[:, : self.ignore_prefix_size] = False
        targets = ProjectedLossTargets(target[rows], self.eps, self.padding_idx, self.report_accuracy)
        loss, nll_loss, n_correct = self._score(model, sample, rows, targets)
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
            logging_output["n_correct"] = utils.item(n_correct)
            logging_output["total"] = targets.target.numel()
        return loss, sample_size, logging_output

    def _score(self, model, sample, rows: Tensor, targets: ProjectedLossTargets) -> ProjectedLoss:
        """The loss of the selected positions from the decoder's features and its output projection W_o.

        Porting note (fconv): fconv's logits feed fairseq's criterion, which keeps the N x V log-probabilities
        and their gradient. Here, on a CPU in fp32, the projection and the loss run a chunk of rows at a time
        (``projected_label_smoothed_loss``), their gradients taken in the same pass: the same products and
        values, without the two N x V tensors. Elsewhere the loss comes from the logits in one fused pass."""
        features = model(**sample["net_input"], features_only=True)[0]  # B x T x out_embed
        decoder = unwrap(model).decoder
        if projects_in_chunks(features):
            projection = decoder.output_projection
            x = decoder.output_features(features, rows)  # N x out_embed
            return projected_label_smoothed_loss(x, projection.weight, projection.bias, targets)
        return loss_of_logits(decoder.output_layer(features, output_rows=rows), targets)  # from N x V logits

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
