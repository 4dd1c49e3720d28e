"""The trainer's clock for a learning-rate schedule that needs one.

fairseq's ``--stop-time-hours`` stops at the trainer's cumulative training time, which each checkpoint carries
(``extra_state["previous_training_time"]``) whatever schedule wrote it and whatever ``--reset-*`` flags the next
run is given; a scheduler is handed no clock at all. ``--lr-scheduler budget`` anneals to 0 where that stop comes,
so it must count the same seconds: each scheduler the trainer builds is handed the trainer's clock where it asks
for one (``follow_training_clock``, as the trainer's checkpoint check asks the model it is handed).
"""

from fairseq_convs2s_autoload import is_replaced, replace


def hand_schedules_the_training_clock() -> None:
    """Wrap ``Trainer._build_optimizer`` (which builds the scheduler, on first use and again when a checkpoint is
    loaded) to hand the new scheduler the trainer's own clock (idempotent)."""
    from fairseq.trainer import Trainer

    if is_replaced(Trainer._build_optimizer, "budget_clock"):
        return
    build = Trainer._build_optimizer

    def _build_optimizer(self):
        build(self)
        follow = getattr(self._lr_scheduler, "follow_training_clock", None)
        if follow is not None:
            # this rank's seconds: the previous runs' (read from the checkpoint) and this one's since it loaded
            follow(self._local_cumulative_training_time)

    replace(Trainer, "_build_optimizer", _build_optimizer, "budget_clock")
