"""Batched beam search whose hypotheses are fairseq-generate's: the rules of fairseq 0.12's ``SequenceGenerator``
and ``BeamSearch``, on tensors, with finished sentences leaving the batch.

Every hypothesis starts from EOS; at step 0 each source has one row (its hypotheses are all the same). Each step
takes the top 2 x beam candidates over beam x vocabulary of cumulative log-probabilities (pad never chosen, EOS
forbidden before ``min_len`` and forced at the sentence's maximum length). A candidate ending in EOS among the
first beam candidates is finalized, its score divided by (step + 1) ** length_penalty; a sentence is done when it
has beam finalized hypotheses or reaches its maximum length. The next beams are the first beam candidates that do
not end in EOS, in candidate order. The only Python loop is over the hypotheses finalized at a step.

Porting note (fairseq): fairseq computes each sentence's maximum length from the padded width of its batch
(``max_len_a * src_len + max_len_b``); here from the sentence's own length, so a hypothesis does not depend on
which sentences share its batch. With ``max_len_a`` 0 (fairseq-generate's default) the two are the same.
"""

import math
from typing import List, NamedTuple, Optional

import torch
from torch import Tensor

from .model import Model


class Hypothesis(NamedTuple):
    """One finished hypothesis: its tokens (ids, the final EOS included), fairseq's score (natural log, normalized
    by length ** length_penalty), the log-probability of each token, and its attention (T x S, or None)."""

    tokens: List[int]
    score: float
    positional_scores: Tensor
    attention: Optional[Tensor]


def beam_search(
    model: Model,
    src_tokens: Tensor,
    max_len: Tensor,
    beam_size: int = 5,
    length_penalty: float = 1.0,
    min_len: int = 1,
    need_attn: bool = False,
) -> List[List[Hypothesis]]:
    """src_tokens: B x S (left-padded, ending in EOS), max_len: B (each sentence's longest hypothesis, EOS
    excluded). Returns each sentence's finalized hypotheses, best first (beam_size of them)."""
    eos, pad = model.eos, model.pad
    bsz, beam, cand_size = src_tokens.size(0), beam_size, 2 * beam_size
    state = model.encode(src_tokens)
    finalized: List[List[Hypothesis]] = [[] for _ in range(bsz)]
    device = src_tokens.device
    sentence = torch.arange(bsz)  # the original index of each sentence still decoding
    max_len = max_len.clone()
    tokens = src_tokens.new_full((bsz * beam, 1), eos)  # every hypothesis's tokens so far
    scores = torch.zeros(bsz * beam, 0, device=device)  # their cumulative scores, one column per step
    attn = torch.zeros(bsz * beam, src_tokens.size(1), 0, device=device) if need_attn else None
    # beam slots that hold an EOS candidate (where fewer than beam others were left)
    ignored = torch.zeros(bsz, beam, dtype=torch.bool, device=device)
    last_step = int(max_len.max())
    for step in range(last_step + 1):
        rows = tokens[::beam, -1] if step == 0 else tokens[:, -1]  # step 0: one row per source
        logits, step_attn = model.step(state, rows, step, need_attn)  # rows x V (fp32), rows x S
        if step == 0:
            state.expand(beam)
        lprobs = torch.log_softmax(logits, dim=1)  # rows x V
        lprobs[:, pad] = -math.inf
        at_max = (step >= max_len).repeat_interleave(1 if step == 0 else beam).to(device)  # rows
        if bool(at_max.any()):  # only EOS at a sentence's maximum length
            forced = lprobs[at_max]
            forced[:, :eos], forced[:, eos + 1 :] = -math.inf, -math.inf
            lprobs[at_max] = forced
        if step < min_len:
            lprobs[:, eos] = -math.inf
        if attn is not None:
            step_attn = step_attn.repeat_interleave(beam, dim=0) if step == 0 else step_attn
            attn = torch.cat([attn, step_attn.unsqueeze(2)], dim=2)  # N x S x (step + 1)
        previous = scores[:, -1] if step > 0 else None
        cand_scores, cand_beams, cand_tokens = _candidates(lprobs, previous, 1 if step == 0 else beam, cand_size)
        cand_rows = cand_beams + (torch.arange(bsz, device=device) * beam).unsqueeze(1)  # B x C: what each extends

        eos_mask = cand_tokens.eq(eos) & cand_scores.ne(-math.inf)
        eos_mask[:, :beam][ignored] = False
        done = _finalize(step, eos_mask[:, :beam], cand_rows, cand_scores, tokens, scores, attn, eos, beam,
                         length_penalty, sentence, max_len, finalized)  # fmt: skip
        if len(done) == bsz:
            break
        if done:
            finished = set(done)
            kept = torch.tensor([i for i in range(bsz) if i not in finished], device=device)
            state.keep_sources(kept, beam)
            eos_mask, cand_beams, cand_scores, cand_tokens = (
                t[kept] for t in (eos_mask, cand_beams, cand_scores, cand_tokens)
            )
            ignored, sentence, max_len = ignored[kept], sentence[kept.cpu()], max_len[kept.cpu()]
            rows_kept = (kept.unsqueeze(1) * beam + torch.arange(beam, device=device)).view(-1)
            tokens, scores = tokens[rows_kept], scores[rows_kept]
            attn = attn[rows_kept] if attn is not None else None
            bsz = len(kept)
            cand_rows = cand_beams + (torch.arange(bsz, device=device) * beam).unsqueeze(1)

        # the next beams: the first beam candidates not ending in EOS (EOS ones only where too few others)
        eos_mask[:, :beam] |= ignored
        order = eos_mask.long() * cand_size + torch.arange(eos_mask.size(1), device=device)
        ranks, active = torch.topk(order, k=beam, dim=1, largest=False)  # B x beam
        ignored = ranks.ge(cand_size)
        active_rows = torch.gather(cand_rows, 1, active).view(-1)
        tokens = torch.cat([tokens[active_rows], torch.gather(cand_tokens, 1, active).view(-1, 1)], dim=1)
        scores = torch.cat([scores[active_rows], torch.gather(cand_scores, 1, active).view(-1, 1)], dim=1)
        attn = attn[active_rows] if attn is not None else None
        state.reorder(active_rows)

    for hypotheses in finalized:
        hypotheses.sort(key=lambda h: -h.score)  # (a stable sort: ties keep the order they were finalized in)
    return finalized


def _candidates(lprobs, previous, group: int, cand_size: int):
    """The top candidates of each sentence over its ``group`` rows x V of log-probabilities plus each row's
    cumulative score ``previous`` (None at step 0), as fairseq's ``BeamSearch.step`` takes them: (scores, beams,
    tokens), each B x min(cand_size, group * V - 1), best first.

    Porting note (fairseq): fairseq replaces NaN in every row's log-probabilities (N x V), adds the cumulative
    scores to all of them and takes the top 2 x beam of each sentence's beam x V. A sentence's best 2 x beam come
    from each row's best 2 x beam, so here each row's best are taken first and only those are NaN-checked and
    summed: one pass over N x V (the top-k) instead of four, the same sums."""
    vocab = lprobs.size(1)
    k = min(cand_size, group * vocab - 1)
    top, tokens = lprobs.topk(min(k, vocab), dim=1)  # rows x K
    top = top.masked_fill_(top.isnan(), -math.inf)  # (fairseq: a NaN log-probability is never chosen)
    if previous is not None:
        top = top + previous.unsqueeze(1)
    per_row = top.size(1)
    cand_scores, index = top.view(-1, group * per_row).topk(k, dim=1)  # B x C
    cand_beams = torch.div(index, per_row, rounding_mode="trunc")
    cand_tokens = tokens.view(-1, group * per_row).gather(1, index)
    return cand_scores, cand_beams, cand_tokens


def _finalize(step, eos_mask, cand_rows, cand_scores, tokens, scores, attn, eos, beam, length_penalty, sentence,
              max_len, finalized) -> List[int]:  # fmt: skip
    """Finalize the candidates ``eos_mask`` marks (B x beam) into ``finalized``; return the batch rows of the
    sentences now done (beam hypotheses, or their maximum length reached)."""
    batch_rows, positions = eos_mask.nonzero(as_tuple=True)  # row-major: fairseq's order
    if batch_rows.numel() == 0:
        return []
    rows = cand_rows[batch_rows, positions]
    eos_scores = cand_scores[batch_rows, positions]
    ends = torch.full((len(rows), 1), eos, dtype=tokens.dtype, device=tokens.device)
    hypothesis_tokens = torch.cat([tokens[rows, 1:], ends], dim=1)
    cumulative = torch.cat([scores[rows], eos_scores.unsqueeze(1)], dim=1)  # n x (step + 1)
    positional = torch.cat([cumulative[:, :1], cumulative[:, 1:] - cumulative[:, :-1]], dim=1).cpu()
    normalized = (eos_scores / (step + 1) ** length_penalty).tolist()
    batch_list, hyp_lists = batch_rows.tolist(), hypothesis_tokens.tolist()
    for i, b in enumerate(batch_list):
        kept = finalized[int(sentence[b])]
        if len(kept) < beam:
            attention = attn[rows[i]].t() if attn is not None else None  # T x S: the attention of each step
            kept.append(Hypothesis(hyp_lists[i], normalized[i], positional[i], attention))
    return [b for b in sorted(set(batch_list)) if len(finalized[int(sentence[b])]) == beam or step >= int(max_len[b])]
