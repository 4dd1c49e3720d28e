"""The flags of ``--criterion sequence_risk`` and how its text cost turns target sub-words into text."""

from dataclasses import dataclass, field
from typing import Optional

from fairseq.data import Dictionary
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from omegaconf import II

from ..errors import InputError
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


def check_settings(
    risk_alpha: float,
    risk_candidates: int,
    risk_sampling: bool,
    risk_sampling_topk: int,
    risk_include_reference: bool,
    risk_cost: str,
    risk_max_len_a: float,
    risk_max_len_b: int,
    label_smoothing: float,
) -> None:
    """Refuse settings that would fail mid-training or train nothing, naming the flags (ValueError)."""
    if not 0.0 <= risk_alpha <= 1.0:
        raise InputError(f"--risk-alpha must lie in [0, 1] (the weight of the token-level loss), got {risk_alpha}")
    if risk_candidates < 1:
        raise InputError(f"--risk-candidates must be at least 1, got {risk_candidates}")
    if risk_candidates == 1 and not risk_include_reference and risk_alpha < 1.0:
        # one candidate renormalizes to probability 1: the risk is a constant and its gradient is zero
        raise InputError(
            "--risk-candidates 1 without --risk-include-reference gives a one-element candidate set, whose "
            "renormalized probability is always 1, so the risk has no gradient: use --risk-candidates >= 2 "
            "or add --risk-include-reference"
        )
    if not 0.0 <= label_smoothing < 1.0:
        raise InputError(f"--label-smoothing must lie in [0, 1), got {label_smoothing}")
    if risk_max_len_a < 0 or risk_max_len_b < 1:  # (b < 1: the candidates of a batch of short sources, none)
        raise InputError(
            f"--risk-max-len-a {risk_max_len_a} --risk-max-len-b {risk_max_len_b}: a batch of short sources "
            "could have no candidate token; --risk-max-len-a must be >= 0 and --risk-max-len-b >= 1"
        )
    if risk_sampling_topk == 0 or risk_sampling_topk < -1:
        raise InputError(f"--risk-sampling-topk must be -1 (all tokens) or positive, got {risk_sampling_topk}")
    if risk_sampling_topk != -1 and not risk_sampling:  # (beam search would ignore it)
        raise InputError(f"--risk-sampling-topk {risk_sampling_topk} applies to --risk-sampling only: add it")
    if str(risk_cost) not in COSTS:
        raise InputError(f"--risk-cost {risk_cost!r}: choose one of {sorted(COSTS)}")


def resolve_post_process(cost: SequenceCost, requested: Optional[str], task) -> Optional[str]:
    """The post-processing symbol for ``Dictionary.string``; refuse a text cost on sub-words it would not join."""
    if requested is not None:
        if requested not in POST_PROCESS_CHOICES:
            raise InputError(f"--risk-post-process {requested!r}: choose one of {list(POST_PROCESS_CHOICES)}")
        return None if requested == "none" else requested
    # the translation task's own detokenization flag for --eval-bleu, when the user gave it
    task_choice = getattr(getattr(task, "cfg", None), "eval_bleu_remove_bpe", None)
    if task_choice:
        return task_choice
    marker = subword_marker(task.target_dictionary)
    if cost.needs_text and marker is not None:
        kind, example, flag = marker
        raise InputError(
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
