"""The flags of ``--criterion sequence_risk`` and how its text cost turns target sub-words into text."""

from dataclasses import dataclass, field
from typing import Optional

from fairseq.data import Dictionary
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from omegaconf import II

from .costs import COSTS, SequenceCost

# what fairseq.data.data_utils.post_process understands; anything else raises there, mid-training
POST_PROCESS_CHOICES = ("sentencepiece", "subword_nmt", "@@ ", "@@", "wordpiece", "letter", "_EOW", "none")


@dataclass
class SequenceRiskConfig(FairseqDataclass):
    """Flags of ``--criterion sequence_risk`` (all sequence-level ones start with ``--risk-``)."""

    risk_alpha: float = field(
        default=0.3,
        metadata={
            "help": "alpha of the weighted combination: loss = alpha * token-level label-smoothed loss + "
            "(1 - alpha) * risk; 1 is token-level training only, 0 is risk only"
        },
    )
    risk_candidates: int = field(
        default=8, metadata={"help": "candidates generated per source (the beam size, or the number of samples)"}
    )
    risk_sampling: bool = field(
        default=False, metadata={"help": "sample the candidates instead of taking the beam search's n best"}
    )
    risk_sampling_topk: int = field(
        default=-1, metadata={"help": "with --risk-sampling, sample from the k most likely tokens (-1: all)"}
    )
    risk_include_reference: bool = field(
        default=False, metadata={"help": "add the reference to every candidate set (its cost is 0)"}
    )
    risk_cost: ChoiceEnum(list(COSTS)) = field(  # type: ignore[valid-type]
        default="bleu",
        metadata={"help": "cost(t, u): " + "; ".join(f"{c.name}: {c.description}" for c in COSTS.values())},
    )
    risk_post_process: Optional[str] = field(
        default=None,
        metadata={
            "help": "how to turn target sub-words into text for a text cost: "
            + ", ".join(repr(c) for c in POST_PROCESS_CHOICES)
            + " (as fairseq-generate's --post-process); unset: the task's --eval-bleu-remove-bpe, else none, "
            "and an error when the target dictionary holds sentencepiece or BPE pieces"
        },
    )
    risk_max_len_a: float = field(
        default=1.2, metadata={"help": "candidates are at most a * source length + b tokens long"}
    )
    risk_max_len_b: int = field(default=10, metadata={"help": "see --risk-max-len-a"})
    risk_length_normalize: bool = field(
        default=False,
        metadata={"help": "score candidates by their mean token log-probability instead of the sum"},
    )
    label_smoothing: float = field(default=0.1, metadata={"help": "epsilon of the token-level label smoothing"})
    sentence_avg: bool = II("optimization.sentence_avg")


def resolve_post_process(cost: SequenceCost, requested: Optional[str], task) -> Optional[str]:
    """The post-processing symbol for ``Dictionary.string``; refuse a text cost on sub-words it would not join."""
    if requested is not None:
        if requested not in POST_PROCESS_CHOICES:
            raise ValueError(f"--risk-post-process {requested!r}: choose one of {list(POST_PROCESS_CHOICES)}")
        return None if requested == "none" else requested
    # the translation task's own detokenization flag for --eval-bleu, when the user gave it
    task_choice = getattr(getattr(task, "cfg", None), "eval_bleu_remove_bpe", None)
    if task_choice:
        return task_choice
    marker = subword_marker(task.target_dictionary)
    if cost.needs_text and marker is not None:
        kind, example, flag = marker
        raise ValueError(
            f"--risk-cost {cost.name} scores detokenized text, but the target dictionary holds {kind} pieces "
            f"(e.g. {example!r}) and no post-processing is configured: pass --risk-post-process {flag} "
            "(or --risk-post-process none to score the pieces as they are, or --risk-cost edit)"
        )
    return None


def subword_marker(dictionary: Dictionary):
    """(kind, example symbol, --risk-post-process value) when the dictionary looks sentencepiece- or BPE-coded."""
    for symbol in dictionary.symbols[dictionary.nspecial :]:
        if symbol.startswith("\u2581"):
            return "sentencepiece", symbol, "sentencepiece"
        if symbol.endswith("@@") and len(symbol) > 2:
            return "subword-nmt BPE", symbol, "subword_nmt"
    return None
