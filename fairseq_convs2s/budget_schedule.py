"""``--lr-scheduler budget``: a learning rate that knows when training ends and anneals to finish exactly then.

    fairseq-train DATA --user-dir fairseq_convs2s --arch convs2s_iwslt_de_en --lr 0.25 \\
        --lr-scheduler budget --stop-time-hours 0.5          # or --max-update N, or both: whichever ends first

The end of training is fairseq's own: ``--stop-time-hours`` (fairseq's cumulative training time, which it stops at
after any update; the rate reads the same clock, compat row ``budget_clock``) and ``--max-update``. The rate is
``--lr`` until the last ``--anneal-fraction`` of that budget, then falls linearly to 0 at its end, so the model
training stops with is an annealed one. ``--max-epoch`` (when not 0) can stop training before that, unannealed: a
warning says so at the start.

Porting note: the paper (section 4.3) divides the rate by 10 whenever validation loss stops improving
(``reduce_lr_on_plateau``); in a budget too short for a plateau that never anneals at all. Budgeted-training work
(Li et al., 2020, "Budgeted Training: Rethinking Deep Neural Network Training Under Resource Constraints") decays
the rate linearly to 0 at the budget. Over the whole budget that holds the rate too low too early for NAG at
momentum 0.99, so by default the paper's rate is kept for the first half (examples/multi30k/README.md, "The
schedule", measures the fractions).
"""

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim.lr_scheduler import FairseqLRScheduler, register_lr_scheduler
from omegaconf import II

from .errors import InputError

logger = logging.getLogger(__name__)


@dataclass
class BudgetScheduleConfig(FairseqDataclass):
    anneal_fraction: float = field(
        default=0.5,
        metadata={"help": "the last fraction of the budget over which the learning rate falls linearly to 0"},
    )
    stop_time_hours: float = II("optimization.stop_time_hours")
    max_update: int = II("optimization.max_update")
    max_epoch: int = II("optimization.max_epoch")
    lr: List[float] = II("optimization.lr")


def budget_lr(base_lr: float, progress: float, anneal_fraction: float) -> float:
    """The rate at ``progress`` (the fraction of the budget spent, 0 to 1): ``base_lr``, then linearly to 0 over the
    last ``anneal_fraction``."""
    remaining = max(0.0, 1.0 - progress)
    return base_lr * min(1.0, remaining / anneal_fraction)


@register_lr_scheduler("budget", dataclass=BudgetScheduleConfig)
class BudgetSchedule(FairseqLRScheduler):
    """Constant ``--lr``, then linear annealing to 0 at the end of a budget in time (``--stop-time-hours``), in
    updates (``--max-update``) or both."""

    def __init__(self, cfg: BudgetScheduleConfig, optimizer):
        super().__init__(cfg, optimizer)
        if len(cfg.lr) > 1:
            raise InputError("--lr-scheduler budget takes one --lr, not a list")
        if not 0.0 < cfg.anneal_fraction <= 1.0:
            raise InputError(f"--anneal-fraction must be in (0, 1], got {cfg.anneal_fraction}")
        self.budget_seconds = cfg.stop_time_hours * 3600.0 if cfg.stop_time_hours > 0 else None
        self.budget_updates = cfg.max_update if cfg.max_update > 0 else None
        if self.budget_seconds is None and self.budget_updates is None:
            raise InputError(
                "--lr-scheduler budget anneals to the end of training: give --stop-time-hours or --max-update"
            )
        self.base_lr = cfg.lr[0]
        self.anneal_fraction = cfg.anneal_fraction
        # the time trained: fairseq's own clock once the trainer hands it over (follow_training_clock), until then
        # this scheduler's, carried across a resume by state_dict; an instance attribute so that a test can give
        # it another clock
        self.clock = time.monotonic
        self._started = self.clock()
        self._previous_seconds = 0.0
        self._training_seconds: Optional[Callable[[], float]] = None
        self._num_updates = 0
        budgets = [f"{self.budget_seconds / 60:.1f} min of training"] if self.budget_seconds else []
        budgets += [f"{self.budget_updates} updates"] if self.budget_updates else []
        budget = " or ".join(budgets) + (" (whichever ends first)" if len(budgets) > 1 else "")
        logger.info(
            f"budget schedule: lr {self.base_lr} for the first {1 - self.anneal_fraction:.0%} of {budget}, "
            "then linearly to 0"
        )
        if cfg.max_epoch > 0:  # fairseq stops at whichever limit comes first; the rate knows only the budget's
            logger.warning(
                f"budget schedule: --max-epoch {cfg.max_epoch} can end training before the budget, unannealed "
                "(--max-epoch 0: no epoch limit)"
            )
        self.optimizer.set_lr(self.base_lr)

    def follow_training_clock(self, training_seconds: Callable[[], float]) -> None:
        """Count time by ``training_seconds()``: this rank's cumulative training time as the trainer counts it, the
        clock ``--stop-time-hours`` stops by, carried across resumes in the checkpoint's own record whatever the
        schedule was (compat row ``budget_clock`` hands it over). Without it a run switched to this schedule from
        another, or resumed with ``--reset-lr-scheduler``, counted from 0 and was stopped before it had annealed."""
        self._training_seconds = training_seconds

    def _local_seconds(self) -> float:
        """Seconds this process and the runs it resumed have trained, by this rank's clock."""
        if self._training_seconds is not None:
            return self._training_seconds()
        return self._previous_seconds + self.clock() - self._started

    def elapsed_seconds(self) -> float:
        """Seconds trained so far, the same (mean) figure on every rank of a distributed run, so that all ranks
        step with one rate, as fairseq's own ``--stop-time-hours`` clock is averaged over ranks."""
        seconds = self._local_seconds()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            world = torch.distributed.get_world_size()
            if world > 1:
                on_gpu = torch.distributed.get_backend() == "nccl"
                device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
                total = torch.tensor([seconds], dtype=torch.float64, device=device)
                torch.distributed.all_reduce(total)
                seconds = total.item() / world
        return seconds

    def progress(self) -> float:
        """The fraction of the budget spent: the larger of the time and the update fractions."""
        spent = 0.0
        if self.budget_seconds is not None:
            spent = self.elapsed_seconds() / self.budget_seconds
        if self.budget_updates is not None:
            spent = max(spent, self._num_updates / self.budget_updates)
        return spent

    def _set(self) -> float:
        lr = budget_lr(self.base_lr, self.progress(), self.anneal_fraction)
        self.optimizer.set_lr(lr)
        return lr

    def step_begin_epoch(self, epoch):
        return self._set()

    def step(self, epoch, val_loss=None):
        super().step(epoch, val_loss)  # keeps the best validation loss, as every fairseq scheduler does
        return self.optimizer.get_lr()

    def step_update(self, num_updates):
        self._num_updates = num_updates
        return self._set()

    def state_dict(self):
        return {"best": self.best, "elapsed_seconds": self._local_seconds()}

    def load_state_dict(self, state_dict):
        # a checkpoint of another scheduler (a run continued under a budget) keeps that scheduler's best loss, where
        # it kept one (fairseq's "fixed" keeps none: super() raised KeyError); the time comes from the trainer's
        # clock where it follows it, else from this record (0 when another scheduler wrote it)
        self.best = state_dict.get("best")
        self._previous_seconds = float(state_dict.get("elapsed_seconds", 0.0))
        self._started = self.clock()
