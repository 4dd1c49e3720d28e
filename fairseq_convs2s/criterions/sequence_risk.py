"""``--criterion sequence_risk``: expected-risk training over the model's own candidates, mixed with token-level
label smoothing (Edunov et al., "Classical Structured Prediction Losses for Sequence to Sequence Learning",
NAACL 2018, https://arxiv.org/abs/1711.04956: the ``Risk`` loss and the weighted combination with ``TokLS``).

For every source x of a batch the criterion

1. generates n candidates U(x) with the current model, gradients and dropout off (beam search, or sampling),
   and with ``--risk-include-reference`` adds the reference t;
2. gives each candidate a cost(t, u) in [0, 1] (``costs.py``; by default 1 - smoothed sentence BLEU on
   detokenized text);
3. rescores the reference and every candidate in ONE batched forward pass with gradients on: the sequence
   log-probability s(u) = sum_i log p(u_i | u_<i, x), EOS included;
4. returns   alpha * TokLS(t | x) + (1 - alpha) * Risk(x),
   with Risk(x) = sum_u cost(t, u) p(u|x) / sum_u' p(u'|x) = sum_u cost(t, u) softmax_U(s)(u)
   and TokLS the label-smoothed token loss of the reference, summed over its tokens (the paper's equation 2).

Normalization, and why it is right in multi-process training: the per-sentence losses are summed over the
batch and ``sample_size`` is the batch's number of target tokens (or sentences with ``--sentence-avg``), exactly
as in fairseq's ``label_smoothed_cross_entropy``. The trainer sums gradients and sample sizes over workers and
micro-batches (``--update-freq``) and divides one by the other, so the update is the gradient of the whole
batch's summed loss over the whole batch's token count, however the batch was split; each worker generates
candidates for its own sentences only. With ``--risk-alpha 1`` the loss, its gradient and ``sample_size`` are
fairseq's ``label_smoothed_cross_entropy``'s.

Porting notes (against the criterion of fairseq's old ``classic_seqlevel`` branch, PyTorch 0.3):

- one forward pass through ``model(...)`` scores the reference (token loss) and the candidates together, so
  DistributedDataParallel sees one forward per backward; the reference rows double as the reference candidate;
- a ConvS2S model encodes each source once for all of its 1 + n rows (its decoder reads consecutive rows
  against one encoded source, as in beam search), instead of once per row: other models get the source
  repeated for every row;
- a candidate that occurs twice in U(x) (sampling; the reference found by beam search) is counted once:
  U(x) is a set, and a duplicate would double its share of the renormalized distribution;
- costs are computed by sacrebleu on detokenized text rather than by fairseq's BLEU on token ids, so a
  sentencepiece or BPE data set is scored on words; the sub-word post-processing is checked at start-up;
- sequence scores are unnormalized sums of token log-probabilities (the paper's p(u|x));
  ``--risk-length-normalize`` divides them by the candidate length instead (the old branch did).
"""

import math
from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.nn.functional as F
from fairseq import search, utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.data import Dictionary, data_utils
from fairseq.logging import metrics
from fairseq.sequence_generator import SequenceGenerator

from ..models.convs2s import ConvS2SModel
from .costs import COSTS, SequenceCost
from .fused_label_smoothed import normalizes_by_log_softmax, projects_selected_rows, unwrap
from .label_smoothed_loss import label_smoothed_nll_loss_from_logits
from .risk_config import SequenceRiskConfig, check_settings, resolve_post_process

# what an <unk> becomes in the text a text cost compares: two characters that share nothing with each other or
# with any text (fairseq's UNKNOWNTOKENINREF and UNKNOWNTOKENINHYP share 14 characters, which chrF credits)
REFERENCE_UNK, CANDIDATE_UNK = "\ue000", "\ue001"


@dataclass
class CandidateSet:
    """The candidate sets U(x) of a batch, column 0 always the reference.

    ``tokens[b]`` lists 1 + K token sequences for source b, each ending in EOS: the reference, then the
    candidates (sets shorter than K are filled with copies of the reference, outside the set).
    ``costs`` (B x (1+K)): cost(t, u) per column. ``in_set`` (B x (1+K), bool): which columns belong to U(x):
    the reference only with ``--risk-include-reference``, each distinct candidate once.
    """

    tokens: List[List[torch.Tensor]]
    costs: torch.Tensor
    in_set: torch.Tensor


@register_criterion("sequence_risk", dataclass=SequenceRiskConfig)
class SequenceRiskCriterion(FairseqCriterion):
    """Expected risk over beam (or sampled) candidates, mixed with label-smoothed cross-entropy by alpha."""

    def __init__(
        self,
        task,
        sentence_avg: bool,
        risk_alpha: float = 0.3,
        risk_candidates: int = 8,
        risk_sampling: bool = False,
        risk_sampling_topk: int = -1,
        risk_include_reference: bool = False,
        risk_cost: str = "bleu",
        risk_post_process: Optional[str] = None,
        risk_max_len_a: float = 1.2,
        risk_max_len_b: int = 10,
        risk_length_normalize: bool = False,
        label_smoothing: float = 0.1,
    ):
        super().__init__(task)
        check_settings(  # (when fairseq-train builds the criterion: before the first update)
            risk_alpha, risk_candidates, risk_sampling, risk_sampling_topk, risk_include_reference, risk_cost,
            risk_max_len_a, risk_max_len_b, label_smoothing,
        )  # fmt: skip

        self.sentence_avg = sentence_avg
        self.alpha = float(risk_alpha)
        self.num_candidates = risk_candidates
        self.sampling = risk_sampling
        # a k at least the vocabulary's size is every token (fairseq's search fails on a k above it)
        self.sampling_topk = risk_sampling_topk if risk_sampling_topk < len(task.target_dictionary) else -1
        self.include_reference = risk_include_reference
        self.cost: SequenceCost = COSTS[str(risk_cost)]
        self.max_len_a = risk_max_len_a
        self.max_len_b = risk_max_len_b
        self.length_normalize = risk_length_normalize
        self.eps = label_smoothing
        self.tgt_dict: Dictionary = task.target_dictionary
        self.post_process = resolve_post_process(self.cost, risk_post_process, task)

    # ---- the three steps, public so that each can be used (and tested) on its own --------------------------

    @torch.no_grad()
    def generate_candidates(self, model, sample) -> List[List[torch.Tensor]]:
        """n candidates per source from the current model (eval mode, no gradients); each ends in EOS."""
        was_training = model.training
        generator = SequenceGenerator(
            [unwrap(model)],  # beam search calls the encoder and decoder directly, not the DDP wrapper
            self.tgt_dict,
            beam_size=self.num_candidates,
            max_len_a=self.max_len_a,
            max_len_b=self.max_len_b,
            search_strategy=search.Sampling(self.tgt_dict, self.sampling_topk) if self.sampling else None,
        )  # its constructor switches the model to eval mode: no dropout while searching
        try:
            hypos = generator.generate(generator.model.models, sample)
        finally:
            model.train(was_training)
        # a fresh generator per batch: kept as an attribute it would register the model as a criterion submodule
        return [[h["tokens"] for h in hypos_i] for hypos_i in hypos]

    def build_candidate_set(
        self, sample, candidates: List[List[torch.Tensor]], costs: Optional[torch.Tensor] = None
    ) -> CandidateSet:
        """Put the reference in front of each source's candidates, drop duplicates from the set, compute costs.

        ``candidates[b]``: token sequences ending in EOS for source b. ``costs`` (B x (1+K), optional): given
        costs for [reference, candidates...] instead of the cost function's (the tests use this).
        """
        pad = self.padding_idx
        references = [utils.strip_pad(t, pad) for t in sample["target"]]
        width = 1 + max(len(c) for c in candidates)
        tokens, in_set = [], []
        for ref, cands in zip(references, candidates):
            row, member = [ref], [self.include_reference]
            seen = {tuple(ref.tolist())} if self.include_reference else set()
            for cand in cands:
                key = tuple(cand.tolist())
                row.append(cand.to(ref))
                member.append(key not in seen)
                seen.add(key)
            while len(row) < width:  # ragged sets: fill with the reference, outside the set
                row.append(ref)
                member.append(False)
            tokens.append(row)
            in_set.append(member)
        in_set_t = torch.tensor(in_set, dtype=torch.bool, device=sample["target"].device)
        if costs is None:
            costs = self.candidate_costs(tokens)
        costs = costs.to(device=sample["target"].device, dtype=torch.float)
        assert costs.shape == in_set_t.shape, f"costs {tuple(costs.shape)} for candidate sets {tuple(in_set_t.shape)}"
        return CandidateSet(tokens=tokens, costs=costs, in_set=in_set_t)

    def candidate_costs(self, tokens: List[List[torch.Tensor]]) -> torch.Tensor:
        """B x (1+K) costs of each row against its reference (column 0, whose cost is 0 by definition)."""
        rows = []
        for ref, *cands in tokens:
            if self.cost.needs_text:
                # an <unk> in the reference must not match an <unk> in a candidate (as fairseq's --eval-bleu),
                # nor any part of it: one private-use character each, as chrF compares characters
                ref_value = self._text(ref, unk_string=REFERENCE_UNK)
                values = [self._text(c, unk_string=CANDIDATE_UNK) for c in cands]
            else:
                ref_value = [t if t != self.tgt_dict.unk() else -1 for t in _strip_eos(ref, self.tgt_dict).tolist()]
                values = [_strip_eos(c, self.tgt_dict).tolist() for c in cands]
            rows.append([0.0] + [self.cost(v, ref_value) for v in values])
        return torch.tensor(rows, dtype=torch.float)

    def loss_on_candidates(self, model, sample, cset: CandidateSet, reduce: bool = True):
        """The combined loss for given candidate sets: (loss, sample_size, logging_output), as ``forward``."""
        bsz, width = cset.costs.shape
        pad, eos = self.padding_idx, self.tgt_dict.eos()
        rows = [seq for row in cset.tokens for seq in row]  # source-major: (B*(1+K)) sequences
        target = data_utils.collate_tokens(rows, pad, eos, left_pad=False)  # (B*(1+K)) x T
        prev_output_tokens = data_utils.collate_tokens(rows, pad, eos, left_pad=False, move_eos_to_beginning=True)
        net_input = dict(sample["net_input"])
        if not reads_rows_per_source(model):  # (ConvS2S: B sources, encoded once, for B*(1+K) decoder rows)
            net_input["src_tokens"] = net_input["src_tokens"].repeat_interleave(width, dim=0)  # (B*(1+K)) x S
            net_input["src_lengths"] = net_input["src_lengths"].repeat_interleave(width, dim=0)
        net_input["prev_output_tokens"] = prev_output_tokens

        not_pad = target.ne(pad)  # (B*(1+K)) x T
        # one forward through the (possibly DDP-wrapped) model: every row's gradient flows through it. The
        # token-level loss of the reference rows (column 0), label-smoothed exactly as fairseq's criterion, and
        # the log-probability of every row's tokens: (B*(1+K)) x T, 0 at padding
        token_loss, nll_loss, token_scores = self._token_terms(model, net_input, target, not_pad, bsz, width)

        # sequence scores s(u): summed token log-probabilities of every row
        scores = token_scores.sum(-1)  # B*(1+K)
        if self.length_normalize:
            scores = scores / not_pad.sum(-1).clamp(min=1)
        scores = scores.view(bsz, width).masked_fill(~cset.in_set, float("-inf"))  # B x (1+K)
        # the renormalized distribution over U(x): p(u|x) / sum_u' p(u'|x) = softmax of log-probabilities
        probs = F.softmax(scores, dim=-1)  # B x (1+K), 0 outside the set
        costs = cset.costs.to(probs)
        risk = (probs * costs).sum(-1)  # B: expected cost per source

        loss = self.alpha * token_loss + (1.0 - self.alpha) * risk.sum()
        sample_size = bsz if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": loss.data,
            "token_loss": token_loss.data,
            "nll_loss": nll_loss.data,
            "risk": risk.sum().data,
            # the cost of the generator's first (best-scoring) candidate: 1 - the sentence BLEU it would output
            "top_cost": costs[:, 1].sum().data,
            "risk_sentences": bsz,
            "ntokens": sample["ntokens"],
            "nsentences": bsz,
            "sample_size": sample_size,
        }
        return loss, sample_size, logging_output

    def _token_terms(self, model, net_input, target: torch.Tensor, not_pad: torch.Tensor, bsz: int, width: int):
        """Run the model on ``net_input``; (token loss, its NLL, token log-probabilities (B*(1+K)) x T) of the
        scored rows. target, not_pad: (B*(1+K)) x T.

        Porting note: where the model normalizes by a plain log-softmax, the terms come from the logits in one
        fused pass (``fused_label_smoothed``): the (B*(1+K)) x T x V log-probabilities, nine times a token-level
        batch's with 8 candidates, are never stored, nor are the gathers' zero-filled gradients. A ConvS2S model
        projects only the non-padding positions (``output_rows``): candidates of unequal lengths pad the rows.
        """
        pad = self.padding_idx
        if normalizes_by_log_softmax(model):
            selected = projects_selected_rows(model)
            if selected:
                logits = model(**net_input, output_rows=not_pad)[0]  # N x V, N = not_pad.sum()
                kept_target = target[not_pad]  # N
            else:
                logits = model(**net_input)[0]  # (B*(1+K)) x T x V
                logits, kept_target = logits.reshape(-1, logits.size(-1)), target.reshape(-1)
            terms = label_smoothed_nll_loss_from_logits(
                logits, kept_target, self.eps, pad, reduce=False
            )  # loss and NLL, each N x 1 (0 at any padding among them)
            loss_rows, nll_rows = (
                t.new_zeros(target.shape).masked_scatter(not_pad, t.squeeze(1)) if selected else t.view(target.shape)
                for t in terms
            )  # each (B*(1+K)) x T, 0 at padding
            loss_rows, nll_rows = (t.view(bsz, width, -1) for t in (loss_rows, nll_rows))
            return loss_rows[:, 0].sum(), nll_rows[:, 0].sum(), -nll_rows.view(target.shape)
        net_output = model(**net_input)
        lprobs = model.get_normalized_probs(net_output, log_probs=True)  # (B*(1+K)) x T x V
        vocab, length = lprobs.size(-1), lprobs.size(1)
        ref_lprobs = lprobs.view(bsz, width, length, vocab)[:, 0]  # B x T x V
        ref_target = target.view(bsz, width, length)[:, 0]  # B x T
        token_loss, nll_loss = label_smoothed_nll_loss(
            ref_lprobs.reshape(-1, vocab), ref_target.reshape(-1), self.eps, ignore_index=pad, reduce=True
        )
        token_scores = lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1) * not_pad
        return token_loss, nll_loss, token_scores

    # ---- fairseq's criterion interface ------------------------------------------------------------------------

    def forward(self, model, sample, reduce: bool = True):
        """Generate, cost and rescore the candidates of ``sample``; returns (loss, sample_size, logging_output)."""
        if self.alpha == 1.0:
            return self._token_level_only(model, sample)
        candidates = self.generate_candidates(model, sample)
        return self.loss_on_candidates(model, sample, self.build_candidate_set(sample, candidates), reduce)

    def _token_level_only(self, model, sample):
        """alpha = 1: no candidates to generate; fairseq's label-smoothed loss on the reference."""
        target = sample["target"]  # B x T: the reference rows alone (width 1)
        loss, nll_loss, _ = self._token_terms(
            model, sample["net_input"], target, target.ne(self.padding_idx), target.size(0), 1
        )
        nsentences = sample["target"].size(0)
        sample_size = nsentences if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": loss.data,
            "token_loss": loss.data,
            "nll_loss": nll_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": nsentences,
            "sample_size": sample_size,
        }
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        """``loss`` (what is optimized, base 2 as every fairseq criterion), ``token_loss`` and ``nll_loss`` per
        target token (base 2), ``ppl``, and per sentence ``risk`` (expected cost) and ``top_cost``."""

        def total(key):
            return utils.item(sum(log.get(key, 0) for log in logging_outputs))

        sample_size, ntokens, risk_sentences = total("sample_size"), total("ntokens"), total("risk_sentences")
        metrics.log_scalar("loss", total("loss") / sample_size / math.log(2), sample_size, round=3)
        metrics.log_scalar("token_loss", total("token_loss") / ntokens / math.log(2), ntokens, round=3)
        metrics.log_scalar("nll_loss", total("nll_loss") / ntokens / math.log(2), ntokens, round=3)
        metrics.log_derived("ppl", lambda meters: utils.get_perplexity(meters["nll_loss"].avg))
        if risk_sentences > 0:
            metrics.log_scalar("risk", total("risk") / risk_sentences, risk_sentences, round=4)
            metrics.log_scalar("top_cost", total("top_cost") / risk_sentences, risk_sentences, round=4)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True  # every entry is a sum over sentences or tokens

    def _text(self, tokens: torch.Tensor, unk_string: str) -> str:
        """Detokenized text of a token sequence (EOS and padding dropped, sub-words joined)."""
        return self.tgt_dict.string(tokens.int().cpu(), self.post_process, unk_string=unk_string)


def _strip_eos(tokens: torch.Tensor, dictionary: Dictionary) -> torch.Tensor:
    return tokens[tokens.ne(dictionary.eos()) & tokens.ne(dictionary.pad())]


def reads_rows_per_source(model) -> bool:
    """Whether the model's decoder takes G consecutive rows per source of its batch (rows r*G .. r*G+G-1 read
    source r): a ConvS2S model's does (its attention groups them, as for beam search's hypotheses)."""
    return isinstance(unwrap(model), ConvS2SModel)
