"""Training under bf16, fp16 on a CPU, stopped by a signal or run again: what ``python -m fairseq_convs2s.train``
installs in every training process (``install_training_fixes``), not the plugin's import: plain ``fairseq-train``
keeps fairseq's own behaviour. How checkpoint files are written: ``saving.py``.

- A non-finite gradient (NaN or inf loss) under ``--bf16``, or ``--fp16`` on a CPU, skips that update with a
  warning, as fairseq's fp16 loss scaler does on a GPU, instead of stopping training: stock bf16 has no loss scaler
  and stops, and stock fp16 on a CPU crashes in its skip path (``torch.tensor(0.0).cuda()``). After
  ``MAX_CONSECUTIVE_SKIPS`` skipped updates in a row training stops with fairseq's ``FloatingPointError``.
- SIGINT (Ctrl-C), SIGTERM (a job scheduler, a recipe's driver) or SIGHUP (a closed terminal) lets the update in
  flight finish, saves ``checkpoint_last.pt`` where training is (mid-epoch too: with the data iterator's position,
  so the same command resumes at the next update, as if never stopped) and exits with status 130; a second Ctrl-C
  stops at once. With several processes, a signal to any of them stops all after the same update: after each
  update they agree through one all-reduce of one number. Stock fairseq stops at once with a traceback, losing
  every update since its last save (up to an epoch; on SIGHUP, silently).
- A run that has reached its ``--max-update`` trains no more when run again (stock fairseq: one more update, and
  the checkpoints rewritten with it).
"""

import contextlib
import logging
import os
import signal
from typing import Iterator

import torch

from fairseq_convs2s_autoload import is_replaced, replace

logger = logging.getLogger("fairseq_convs2s.train")

# a bf16 run has no loss scale to lower: this many non-finite updates in a row means the run has diverged
MAX_CONSECUTIVE_SKIPS = 10


class NonFiniteGradients(Exception):
    """The gradient norm of an update is NaN or inf; the update is skipped (not an ArithmeticError, so that fairseq's
    ``except FloatingPointError`` / ``except OverflowError`` handlers in ``Trainer.train_step`` let it through)."""


def skip_nonfinite_updates() -> None:
    """Wrap ``Trainer.clip_grad_norm`` and ``Trainer.train_step`` so that a non-finite gradient skips its update
    under bf16 (and fp16 on a CPU) instead of stopping training (idempotent)."""
    from fairseq.trainer import Trainer

    if is_replaced(Trainer.train_step, "skip_nonfinite_updates"):
        return
    replace(Trainer, "clip_grad_norm", _guard_clip_grad_norm(Trainer.clip_grad_norm), "skip_nonfinite_updates")
    replace(Trainer, "train_step", _skip_nonfinite_updates(Trainer.train_step), "skip_nonfinite_updates")


def stop_a_finished_run() -> None:
    """Wrap ``fairseq_cli.train.train`` (an epoch of training) so that a run already at its ``--max-update`` trains
    no more (idempotent): fairseq checks the limit after each update, so the same command run again trained one
    update past it and rewrote checkpoint_last.pt and checkpoint_best.pt."""
    import fairseq_cli.train as fairseq_train

    if is_replaced(fairseq_train.train, "finished_runs"):
        return
    train = fairseq_train.train

    def train_unless_finished(cfg, trainer, task, epoch_itr):
        updates, limit = trainer.get_num_updates(), cfg.optimization.max_update
        if 0 < limit <= updates:
            logger.warning(
                "this run has trained its --max-update %d updates already: nothing to train (a larger --max-update "
                "trains on from here)",
                limit,
            )
            return [None], True
        return train(cfg, trainer, task, epoch_itr)

    replace(fairseq_train, "train", train_unless_finished, "finished_runs")


def save_and_stop_on_signals() -> None:
    """Wrap ``fairseq_cli.train.main`` (SIGINT and SIGTERM handled while it runs) and its ``validate_and_save``
    (once a signal has reached any process: save, then stop) (idempotent)."""
    import fairseq_cli.train as fairseq_train

    if is_replaced(fairseq_train.validate_and_save, "save_on_signals"):
        return
    stop = StopRequest()
    replace(fairseq_train, "main", _handling_stop_signals(fairseq_train.main, stop), "save_on_signals")
    replace(
        fairseq_train, "validate_and_save", _saving_when_asked(fairseq_train.validate_and_save, stop), "save_on_signals"
    )


class StopRequest:
    """What asked this training process to stop: a signal's name, or None; shared by the two wrappers."""

    def __init__(self):
        self.signal = None
        self.announce = True  # (one rank of several tells the user)
        self.pid = os.getpid()  # the trainer's (a worker it forks inherits the handler and a terminal's Ctrl-C)

    def ask(self, signum, frame=None) -> None:
        """A signal handler: the first SIGINT, SIGTERM or SIGHUP asks for a stop after this update, a second SIGINT
        stops at once (KeyboardInterrupt); in a data-loading worker forked from the trainer, nothing."""
        if os.getpid() != self.pid:
            return
        if self.signal is None:
            self.signal = signal.Signals(signum).name
            if self.announce:
                logger.warning(
                    "%s: finishing this update, then saving checkpoint_last.pt and stopping (Ctrl-C again stops at "
                    "once, unsaved)",
                    self.signal,
                )
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt


def _handling_stop_signals(main, stop: StopRequest):
    def wrapper(cfg, **kwargs):
        from fairseq import distributed_utils

        stop.announce = distributed_utils.is_master(cfg.distributed_training)
        stop.pid = os.getpid()
        try:
            with stop_signals_handled_by(stop.ask):
                return main(cfg, **kwargs)
        except KeyboardInterrupt:
            logger.error("interrupted again: stopped at once; the updates since the last checkpoint are lost")
            raise SystemExit(130) from None

    return wrapper


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def stop_signals_handled_by(handler) -> Iterator[None]:
    """Inside, SIGINT, SIGTERM and SIGHUP (the terminal or ssh session closed: fairseq died unsaved) call
    ``handler``, and a system call that one interrupts restarts instead of failing with EINTR (Python's default for
    its handlers; a rank's gloo calls should not see it); the handlers before are put back on the way out. A signal
    the process was started with ignored stays ignored, as Python leaves SIGINT then: SIGHUP under ``nohup`` (a
    closed terminal stopped the training nohup was to keep going), SIGINT of a command a script runs in the
    background."""
    ignored = [signum for signum in STOP_SIGNALS if signal.getsignal(signum) is signal.SIG_IGN]
    previous = {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS if signum not in ignored}
    for signum in previous:
        signal.siginterrupt(signum, False)
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)


def _saving_when_asked(validate_and_save, stop: StopRequest):
    def wrapper(cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch):
        if not _agreed_to_stop(trainer, stop):
            return validate_and_save(cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch)
        import fairseq_cli.train as fairseq_train
        from fairseq import checkpoint_utils

        valid_loss = None
        if end_of_epoch and _validates_at_the_end_of(epoch_itr.epoch, cfg, trainer):
            # as fairseq does at an epoch's end: saved unvalidated, the resume started the next epoch, and this
            # one's validation (its checkpoint_best.pt) never came
            valid_loss = fairseq_train.validate(cfg, trainer, task, epoch_itr, valid_subsets)[0]
        checkpoint_utils.save_checkpoint(cfg.checkpoint, trainer, epoch_itr, valid_loss)
        if cfg.checkpoint.no_save or cfg.checkpoint.no_last_checkpoints:
            saved = "nothing saved (--no-save or --no-last-checkpoints)"
        else:
            last = os.path.join(cfg.checkpoint.save_dir, f"checkpoint_last{trainer.checkpoint_suffix}.pt")
            saved = f"saved {last}; {_how_to_resume(cfg.checkpoint)}"
        if stop.announce:
            logger.warning(
                "stopped by %s after update %d (epoch %d, batch %d of %d): %s",
                stop.signal,
                trainer.get_num_updates(),
                epoch_itr.epoch,
                epoch_itr.iterations_in_epoch,
                len(epoch_itr),
                saved,
            )
        _leave_together(trainer)
        raise SystemExit(130)

    return wrapper


def _how_to_resume(checkpoint) -> str:
    """How to go on from checkpoint_last.pt: the same command, unless it loads another checkpoint (--restore-file,
    which it would load again) or resets what a resume needs (--reset-*: the batch order, the rate)."""
    kept = [f"--restore-file {checkpoint.restore_file}"] if checkpoint.restore_file != "checkpoint_last.pt" else []
    kept += [f"--{flag.replace('_', '-')}" for flag in RESETS if getattr(checkpoint, flag)]
    if not kept:
        return "the same command resumes from it"
    return f"the same command without {' and '.join(kept)} resumes from it (with them, it would not go on from there)"


RESETS = ("reset_dataloader", "reset_lr_scheduler", "reset_optimizer")


def _validates_at_the_end_of(epoch: int, cfg, trainer) -> bool:
    """Whether fairseq's ``validate_and_save`` validates at the end of ``epoch``."""
    data = cfg.dataset
    return (
        not data.disable_validation
        and epoch % data.validate_interval == 0
        and trainer.get_num_updates() >= data.validate_after_updates
    )


def _agreed_to_stop(trainer, stop: StopRequest) -> bool:
    """Whether a signal has reached this process or, with several, any of them: all stop after the same update."""
    if trainer.data_parallel_world_size == 1:
        return stop.signal is not None
    from fairseq import distributed_utils

    asked = torch.tensor([float(stop.signal is not None)], device=trainer.device)  # (NCCL: on the GPU)
    distributed_utils.all_reduce(asked, group=trainer.data_parallel_process_group)
    if asked.item() == 0:
        return False
    stop.signal = stop.signal or "a signal to another training process"
    return True


def _leave_together(trainer) -> None:
    """With several ranks: wait until every rank has saved, then close the process group, before this one exits. A
    rank that exited while another still wrote the checkpoint, its gloo connections open, was sometimes aborted
    (terminate called without an active exception); fairseq's own end of training also meets at a barrier."""
    if trainer.data_parallel_world_size > 1 and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def _guarded(trainer) -> bool:
    common = trainer.cfg.common
    return bool(common.bf16 or common.memory_efficient_bf16) or (common.fp16 and trainer.device.type == "cpu")


def _guard_clip_grad_norm(clip_grad_norm):
    def wrapper(self, clip_norm):
        if not _guarded(self):
            return clip_grad_norm(self, clip_norm)
        try:
            grad_norm = clip_grad_norm(self, clip_norm)
        except OverflowError as e:  # fp16's loss scaler has lowered its scale; fairseq's handler needs CUDA
            raise NonFiniteGradients(str(e)) from None
        if not torch.isfinite(grad_norm).all():  # bf16: no loss scaler looked at the norm
            raise NonFiniteGradients(f"gradient norm {grad_norm.item()}")
        return grad_norm

    return wrapper


def _skip_nonfinite_updates(train_step):
    def wrapper(self, samples, raise_oom=False):
        from fairseq.logging import metrics

        try:
            result = train_step(self, samples, raise_oom)
        except NonFiniteGradients as e:
            self._convs2s_skips = getattr(self, "_convs2s_skips", 0) + 1
            logger.warning(
                "non-finite gradients (NaN/inf loss) at update %d: %s; skipped this batch, parameters unchanged "
                "(%d in a row)",
                self.get_num_updates() + 1,
                e,
                self._convs2s_skips,
            )
            self.zero_grad()
            optimizer = self.optimizer
            if getattr(optimizer, "scaler", True) is None:
                # without a loss scaler fairseq's FP16Optimizer resets its gradient multiplier only when it steps:
                # left as is, it keeps this batch's clip factor, computed from a NaN norm, and every later update
                # comes out NaN
                optimizer._multiply_factor = 1.0
            metrics.log_stop_time("train_wall")
            if self._convs2s_skips >= MAX_CONSECUTIVE_SKIPS:
                raise FloatingPointError(
                    f"{self._convs2s_skips} updates in a row had non-finite gradients: the run has diverged; "
                    "lower the learning rate or check the data"
                ) from None
            return None
        self._convs2s_skips = 0
        return result

    return wrapper
