"""``--task bidirectional_translation``: the first part of a budget trained on both directions of each pair, the rest
on the task's own.

    fairseq-train DATA --user-dir fairseq_convs2s --task bidirectional_translation --source-lang en --target-lang de \\
        --arch convs2s_iwslt_de_en --share-all-embeddings --lr-scheduler budget --stop-time-hours 0.5

Bidirectional training (Ding et al., 2021, "Improving Neural Machine Translation by Bidirectional Training") trains
a model on every pair in both directions, source -> target and target -> source, without a language tag, then on
source -> target alone. Here the two stages are one fairseq-train run: the epochs that start in the first
``--bidirectional-fraction`` of the budget (``--stop-time-hours``, ``--max-update``: the budget ``--lr-scheduler
budget`` anneals over, whose rate is constant there by default) train on both directions, each twice the pairs of
the corpus; the rest on source -> target. The switch comes at the epoch boundary nearest that point (an epoch is
the unit fairseq loads data in), judged by the length of the epoch before. Validation and generation are source ->
target throughout, as ``--task translation``'s; a checkpoint generates with either task.

The reversed pairs share the source's and the target's token sequences, so the data need one dictionary for both
languages (``fairseq-preprocess --joined-dictionary``), and a model gains most from them where it reads and writes
both languages with one table (``--share-all-embeddings``): examples/multi30k/README.md, "Both directions".

The time is the trainer's cumulative training time, the clock ``--stop-time-hours`` stops by (compat row
``budget_clock`` hands it over, with the update count), averaged over the ranks of a distributed run so that every
rank loads the same epoch; a resumed run decides each epoch anew by the same clock.
"""

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
from fairseq.data import ConcatDataset, LanguagePairDataset
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from omegaconf import II

from .budget_schedule import budget_limits, budget_progress, mean_over_ranks
from .errors import InputError

logger = logging.getLogger(__name__)


@dataclass
class BidirectionalTranslationConfig(TranslationConfig):
    bidirectional_fraction: float = field(
        default=0.5,
        metadata={
            "help": "the first fraction of the budget (--stop-time-hours, --max-update) trained on both directions "
            "of each pair; the rest on source -> target"
        },
    )
    stop_time_hours: float = II("optimization.stop_time_hours")
    max_update: int = II("optimization.max_update")


def both_directions(pairs: LanguagePairDataset) -> LanguagePairDataset:
    """``pairs`` followed by the same pairs reversed (target -> source): twice as many, from the same token
    sequences, padded and batched as ``pairs`` are."""
    if pairs.tgt is None:
        raise InputError("--task bidirectional_translation needs a target side to train on")
    return LanguagePairDataset(
        ConcatDataset([pairs.src, pairs.tgt]),
        np.concatenate([pairs.src_sizes, pairs.tgt_sizes]),
        pairs.src_dict,
        ConcatDataset([pairs.tgt, pairs.src]),
        np.concatenate([pairs.tgt_sizes, pairs.src_sizes]),
        pairs.tgt_dict,
        left_pad_source=pairs.left_pad_source,
        left_pad_target=pairs.left_pad_target,
        shuffle=pairs.shuffle,
        input_feeding=pairs.input_feeding,
        eos=pairs.eos,
        pad_to_multiple=pairs.pad_to_multiple,
    )


@register_task("bidirectional_translation", dataclass=BidirectionalTranslationConfig)
class BidirectionalTranslationTask(TranslationTask):
    """fairseq's translation task whose training epochs, in the first part of the budget, hold every pair in both
    directions (:func:`both_directions`)."""

    def __init__(self, cfg: BidirectionalTranslationConfig, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        if not 0.0 <= cfg.bidirectional_fraction <= 1.0:
            raise InputError(f"--bidirectional-fraction must be in [0, 1], got {cfg.bidirectional_fraction}")
        if src_dict.symbols != tgt_dict.symbols:
            raise InputError(
                "--task bidirectional_translation reverses each pair, so a token id must mean one piece on both "
                f"sides: the {cfg.source_lang} and {cfg.target_lang} dictionaries differ (fairseq-preprocess "
                "--joined-dictionary makes one)"
            )
        if cfg.load_alignments:
            raise InputError("--task bidirectional_translation cannot reverse --load-alignments' alignments")
        self.budget_seconds, self.budget_updates = budget_limits(
            cfg.stop_time_hours,
            cfg.max_update,
            "--task bidirectional_translation trains both directions for the first part of a budget",
        )
        # until the trainer hands over its clock and update count (follow_training_clock): this task's clock, no
        # updates; an instance attribute so that a test can give it another
        self.clock = time.monotonic
        self._started = self.clock()
        self._training_seconds: Optional[Callable[[], float]] = None
        self._num_updates: Callable[[], int] = lambda: 0
        self._last_epoch_start: Optional[float] = None  # the budget's fraction where the last epoch loaded began
        self._one_direction_from: Optional[int] = None  # the first epoch of source -> target alone

    def follow_training_clock(self, training_seconds: Callable[[], float], num_updates: Callable[[], int]) -> None:
        """Judge the budget by ``training_seconds()`` (the trainer's cumulative training time, carried across
        resumes) and ``num_updates()``."""
        self._training_seconds, self._num_updates = training_seconds, num_updates

    def progress(self) -> float:
        """The fraction of the budget spent, by the larger of the time and the update fractions."""
        local = self._training_seconds() if self._training_seconds else self.clock() - self._started
        seconds = mean_over_ranks(local) if self.budget_seconds is not None else 0.0
        return budget_progress(seconds, self._num_updates(), self.budget_seconds, self.budget_updates)

    def has_sharded_data(self, split):
        # the trainer loads the training set again for each epoch (and caches no batches) only for sharded data:
        # so each epoch's load decides its directions
        return split == self.cfg.train_subset or super().has_sharded_data(split)

    def trains_both_directions(self, epoch: int) -> bool:
        """Whether ``epoch``, starting now, trains on both directions: yes while its middle (by the length of the
        epoch before) lies before the switch point, so that the switch comes at the boundary nearest it; once an
        epoch does not, no later one does."""
        if self._one_direction_from is not None and epoch >= self._one_direction_from:
            return False
        start = self.progress()
        length = start - self._last_epoch_start if self._last_epoch_start is not None else 0.0
        self._last_epoch_start = start
        if start + length / 2 < self.cfg.bidirectional_fraction:
            return True
        self._one_direction_from = epoch
        return False

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        if split != self.cfg.train_subset:
            return
        pair = f"{self.cfg.source_lang} -> {self.cfg.target_lang}"
        if self.trains_both_directions(epoch):
            self.datasets[split] = both_directions(self.datasets[split])
            logger.info(f"epoch {epoch}: both directions, {len(self.datasets[split])} pairs ({pair} and reversed)")
        elif epoch == self._one_direction_from:
            logger.info(f"epoch {epoch} on: {pair} alone, {len(self.datasets[split])} pairs")
