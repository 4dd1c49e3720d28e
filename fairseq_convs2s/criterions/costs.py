"""Sentence-level costs for sequence-level training: cost(t, u) in [0, 1], 0 for a perfect candidate.

Each cost says whether it compares detokenized text (``bleu``, ``chrf``: the candidate and the reference go
through the target dictionary and the sub-word post-processing first) or token ids (``edit``: no text at all).
The text costs use sacrebleu's sentence-level scores, smoothed, so that a candidate with no matching 4-gram still
gets a graded cost instead of a flat 1.
"""

from dataclasses import dataclass
from typing import Callable, Dict, Sequence, Union

Tokens = Union[str, Sequence[int]]


@dataclass(frozen=True)
class SequenceCost:
    """A named cost function ``fn(hypothesis, reference) -> float`` in [0, 1].

    ``needs_text``: the function takes detokenized strings; otherwise it takes sequences of token ids.
    """

    name: str
    needs_text: bool
    fn: Callable[[Tokens, Tokens], float]
    description: str

    def __call__(self, hypothesis: Tokens, reference: Tokens) -> float:
        return self.fn(hypothesis, reference)


def _clamp(x: float) -> float:
    # sacrebleu gives 100.00000000000004 for identical sentences: keep costs inside [0, 1]
    return min(1.0, max(0.0, x))


_sacrebleu_metrics: Dict[str, object] = {}


def _metric(name: str):
    """One sacrebleu metric object per process (building one per sentence would dominate the cost)."""
    if name not in _sacrebleu_metrics:
        from sacrebleu.metrics import BLEU, CHRF

        # effective_order: a short sentence is scored on the n-gram orders it has (sentence BLEU's usual choice);
        # smoothing stays sacrebleu's default for sentence scores ('exp')
        _sacrebleu_metrics[name] = BLEU(effective_order=True) if name == "bleu" else CHRF()
    return _sacrebleu_metrics[name]


def sentence_bleu_cost(hypothesis: str, reference: str) -> float:
    """1 - sacrebleu's smoothed sentence BLEU / 100 (13a tokenization, exponential smoothing, effective order)."""
    return _clamp(1.0 - _metric("bleu").sentence_score(hypothesis, [reference]).score / 100.0)


def sentence_chrf_cost(hypothesis: str, reference: str) -> float:
    """1 - sacrebleu's sentence chrF / 100 (character n-grams; less sensitive to sub-word choices than BLEU)."""
    return _clamp(1.0 - _metric("chrf").sentence_score(hypothesis, [reference]).score / 100.0)


def edit_cost(hypothesis: Sequence[int], reference: Sequence[int]) -> float:
    """Levenshtein distance between the token-id sequences over the longer length (0 when both are empty)."""
    hyp, ref = list(hypothesis), list(reference)
    if not hyp and not ref:
        return 0.0
    # one row of the dynamic programme at a time: row[j] = distance(hyp[:i], ref[:j])
    row = list(range(len(ref) + 1))
    for i, h in enumerate(hyp, start=1):
        diagonal, row[0] = row[0], i
        for j, r in enumerate(ref, start=1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (h != r))
    return row[-1] / max(len(hyp), len(ref))


COSTS: Dict[str, SequenceCost] = {
    cost.name: cost
    for cost in (
        SequenceCost("bleu", True, sentence_bleu_cost, "1 - smoothed sentence BLEU (sacrebleu) on detokenized text"),
        SequenceCost("chrf", True, sentence_chrf_cost, "1 - sentence chrF (sacrebleu) on detokenized text"),
        SequenceCost("edit", False, edit_cost, "token-level edit distance / length, on token ids"),
    )
}
