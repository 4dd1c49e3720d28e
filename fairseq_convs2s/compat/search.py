"""Make fairseq's diverse beam search (``--diverse-beam-groups``) decode more than one batch.

fairseq-fixed 0.12.3.1's ``DiverseBeamSearch`` (fairseq's main branch since its PR 5069) keeps the overlap
between its groups' tokens in a tensor of one row per sentence of the batch, made at step 0, and reads and
updates its rows at ``original_batch_idxs``, which ``SequenceGenerator`` fills with the sentences' dataset ids
(``sample["id"]``), not their positions in the batch. A batch holding an id at or past its own size fails at
step 1 with ``IndexError: index N is out of bounds for dimension 0 with size B``: in ``fairseq-generate`` every
batch but one of ids 0 to B - 1, for any model. Ids below B only permute the rows, read and written alike, so
such a batch decodes as each sentence alone; here every batch does, the ids mapped to their positions at step 0.
Patched on importing the plugin, for every model of the process; a fairseq whose search takes no
``original_batch_idxs`` is left alone.

``refuse_empty_beams`` checks the counts and lengths fairseq's generator is built with: ``--beam 0`` (or below) failed
inside the first decoding step (a reshape of no rows, or a tensor of negative size), ``--nbest 0`` printed no
hypothesis and then divided by zero in fairseq's BLEU, and an ``--nbest`` above a beam search's ``--beam`` printed
``--beam`` hypotheses a sentence without a word, and a ``--max-len-b`` below ``--min-len`` (with ``--max-len-a 0``,
the default) failed at every batch in ``AssertionError: min_len cannot be larger than max_len``, naming neither
flag; each is now a ``ValueError`` naming the flags, before decoding.

``refuse_unprintable_options`` refuses, before decoding, two flags fairseq's tools accept and then fail on after
the first batch, for any model: ``fairseq-generate --print-step`` (``KeyError: 'steps'``: only the iterative
refinement models of ``--task translation_lev``, whose task builds another generator, record steps) and
``fairseq-interactive --print-alignment soft`` (``ValueError: too many values to unpack``: it prints hard
alignments only; ``fairseq-generate`` prints soft ones).
"""

import inspect
from typing import Optional

import torch
from fairseq import search
from fairseq.tasks import FairseqTask
from torch import Tensor

from fairseq_convs2s_autoload import is_replaced, replace

from ..errors import InputError
from .quiet_exits import loaded_tool_modules


def positions_in_batch(ids_at_start: Tensor, ids: Tensor) -> Tensor:
    """Where each of ``ids`` (the sentences still decoding, a subset) stood among ``ids_at_start`` (the batch's
    ids at step 0, all different): B' -> B' positions in [0, B)."""
    order = torch.argsort(ids_at_start)
    return order[torch.searchsorted(ids_at_start[order], ids)]


def fix_diverse_beam_search() -> None:
    """Wrap ``DiverseBeamSearch.step`` so that it indexes its overlap rows by position in the batch (idempotent)."""
    cls = search.DiverseBeamSearch
    original_step = cls.step
    if is_replaced(original_step, "diverse_beam_search"):
        return
    if "original_batch_idxs" not in inspect.signature(original_step).parameters:
        return

    def step_by_position(
        self,
        step: int,
        lprobs: Tensor,
        scores: Optional[Tensor],
        prev_output_tokens: Optional[Tensor] = None,
        original_batch_idxs: Optional[Tensor] = None,
    ):
        if original_batch_idxs is not None:
            if step == 0:  # every sentence of the batch is there: its ids, in the order of the overlap's rows
                self.ids_at_start = original_batch_idxs.clone()
            original_batch_idxs = positions_in_batch(self.ids_at_start, original_batch_idxs)
        return original_step(self, step, lprobs, scores, prev_output_tokens, original_batch_idxs)

    replace(cls, "step", step_by_position, "diverse_beam_search")


def refuse_empty_beams() -> None:
    """Wrap ``FairseqTask.build_generator`` (fairseq-generate, fairseq-interactive, the hub, ``--eval-bleu``) to
    refuse a ``--beam`` or ``--nbest`` below 1, an ``--nbest`` above the beam, and lengths that leave no room for a
    hypothesis (idempotent)."""
    original_build = FairseqTask.build_generator
    if is_replaced(original_build, "refuse_empty_beams"):
        return

    def build_generator_checked(self, models, args, *rest, **kwargs):
        for flag in ("beam", "nbest"):
            count = getattr(args, flag, 1)
            if count is not None and count < 1:
                raise InputError(f"--{flag} must be at least 1, got {count}")
        generator = original_build(self, models, args, *rest, **kwargs)
        nbest, beam = getattr(args, "nbest", 1) or 1, getattr(generator, "beam_size", None)  # (a beam search's)
        if beam is not None and nbest > beam:
            raise InputError(
                f"--nbest {nbest} asks for more hypotheses than --beam {beam} keeps: raise --beam to {nbest}"
            )
        _check_room_for_min_len(generator)
        return generator

    replace(FairseqTask, "build_generator", build_generator_checked, "refuse_empty_beams")


def _check_room_for_min_len(generator) -> None:
    """Where a hypothesis's maximum length does not depend on the source (``--max-len-a 0``, no
    ``--match-source-len``), refuse one below ``--min-len``: fairseq's generator asserts on it at every batch."""
    min_len, max_len_b = getattr(generator, "min_len", None), getattr(generator, "max_len_b", None)
    if min_len is None or max_len_b is None or getattr(generator, "max_len_a", 0) != 0:
        return
    if getattr(generator, "match_source_len", False):
        return
    positions = getattr(generator, "max_len", max_len_b + 1) - 1  # (the model's target positions, EOS's excluded)
    if min(max_len_b, positions) < min_len:
        bound = f"--max-len-b {max_len_b}" if max_len_b <= positions else f"the model's {positions} target positions"
        raise InputError(
            f"{bound} (with --max-len-a 0) leaves no room for a hypothesis of --min-len {min_len}: "
            f"raise --max-len-b or lower --min-len"
        )


def refuse_unprintable_options() -> None:
    """Wrap ``FairseqTask.build_generator`` to refuse ``--print-step``, and the loaded ``fairseq-interactive``'s
    ``main`` to refuse ``--print-alignment soft`` (idempotent)."""
    original_build = FairseqTask.build_generator
    if not is_replaced(original_build, "unprintable_options"):

        def build_generator_printable(self, models, args, *rest, **kwargs):
            if getattr(args, "print_step", False):
                raise InputError(
                    "--print-step prints the refinement steps of fairseq's iterative models (--task translation_lev); "
                    "a beam search records none"
                )
            return original_build(self, models, args, *rest, **kwargs)

        replace(FairseqTask, "build_generator", build_generator_printable, "unprintable_options")

    for module in loaded_tool_modules("fairseq_cli.interactive", "main", "cli_main"):
        if not is_replaced(module.main, "unprintable_options"):
            replace(module, "main", _refusing_soft_alignments(module.main), "unprintable_options")


def _refusing_soft_alignments(main):
    def wrapper(cfg, **kwargs):
        if getattr(cfg.generation, "print_alignment", None) == "soft":
            raise InputError(
                "fairseq-interactive prints hard alignments only (--print-alignment, or --print-alignment hard); "
                "fairseq-generate --print-alignment soft prints soft ones"
            )
        return main(cfg, **kwargs)

    return wrapper
