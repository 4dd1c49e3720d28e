"""Every change the plugin makes to fairseq's own behaviour: a file per area (checkpoints, batching, search, ...),
each fix a row of one table (:data:`FIXES`), installed by one call.

Each fix wraps the fairseq functions its row names (``fairseq_convs2s_autoload.replace``: once per process, the
original kept as ``__wrapped__``), but ``safe_checkpoints``, a registration with torch. ``python -m
fairseq_convs2s.train`` also sets some of fairseq-train's flags for its CPU runs (its docstring lists them).
:func:`install` runs when the plugin is imported (``--user-dir fairseq_convs2s`` or ``import fairseq_convs2s``);
the fixes marked ``training`` only in ``python -m fairseq_convs2s.train``'s processes
(:func:`install_training_fixes`), so that plain ``fairseq-train`` keeps fairseq's training loop as it is.
``FAIRSEQ_CONVS2S_COMPAT_OFF`` (names from the table, comma-separated) leaves fixes out;
``FAIRSEQ_CONVS2S_NO_AUTOLOAD=1`` switches off the start-up hook (``fairseq_convs2s_autoload.py``), which loads
the plugin when fairseq reads a convs2s checkpoint without ``--user-dir``. ``python -m fairseq_convs2s.compat``
prints the table.
"""

import os
from typing import Callable, List, NamedTuple

from . import (
    batching,
    broken_checkpoints,
    checkpoints,
    hub,
    interactive,
    quiet_exits,
    saving,
    schedules,
    search,
    shards,
    training,
)


class Fix(NamedTuple):
    """One row of the table."""

    name: str  # what FAIRSEQ_CONVS2S_COMPAT_OFF calls it
    install: Callable[[], None]  # idempotent
    without_it: str  # what fairseq 0.12 does without it
    wraps: str  # the fairseq function it wraps
    training: bool = False  # installed by python -m fairseq_convs2s.train only


FIXES: List[Fix] = [
    Fix(
        "safe_checkpoints",
        checkpoints.allow_fairseq_checkpoints,
        "torch >= 2.6 refuses every fairseq checkpoint (Unsupported global: argparse.Namespace), and the numpy "
        "arrays of a --eval-bleu run's meters",
        "torch.serialization.add_safe_globals (a registration, not a wrapper)",
    ),
    Fix(
        "build_to_load",
        checkpoints.build_models_to_load,
        "a model loaded from a checkpoint reads its pre-trained embedding files again, failing where they are "
        "gone; an ensemble (--path a.pt:b.pt) one of whose models does not fit the data is not named",
        "checkpoint_utils.load_model_ensemble_and_task (the same wrapper as the start-up hook's)",
    ),
    Fix(
        "resume_ranks",
        checkpoints.receive_broadcasts_whole,
        "a multi-process run cannot resume under torch >= 2.6: the ranks refuse the checkpoint that rank 0 sends "
        "them (Unsupported global: omegaconf.dictconfig.DictConfig)",
        "distributed_utils._broadcast_object_slow",
    ),
    Fix(
        "broken_checkpoints",
        broken_checkpoints.name_broken_checkpoints,
        "a truncated, empty, non-torch or non-fairseq checkpoint fails deep in torch or fairseq (OSError: [Errno "
        "22] Invalid argument, EOFError, KeyError: 'best_loss'), naming neither the file nor the problem; training "
        "on from a checkpoint of another model than the command builds lists missing keys, or, where the shapes "
        "agree (another residual lookback), goes on silently; a --restore-file that is not there trains anew, "
        "overwriting --save-dir's checkpoints; one saved with another --criterion or --optimizer stops in an "
        "AssertionError",
        "checkpoint_utils.load_checkpoint_to_cpu, Trainer.load_checkpoint",
    ),
    Fix(
        "diverse_beam_search",
        search.fix_diverse_beam_search,
        "--diverse-beam-groups fails at step 1 of every batch but one (IndexError)",
        "search.DiverseBeamSearch.step",
    ),
    Fix(
        "refuse_empty_beams",
        search.refuse_empty_beams,
        "--beam 0 fails inside decoding; --nbest 0 divides by zero in BLEU; --nbest above --beam gives --beam "
        "hypotheses, silently; --max-len-b below --min-len (--max-len-a 0) asserts at every batch, naming no flag",
        "FairseqTask.build_generator",
    ),
    Fix(
        "unprintable_options",
        search.refuse_unprintable_options,
        "fairseq-generate --print-step ends in KeyError: 'steps' and fairseq-interactive --print-alignment soft in "
        "ValueError: too many values to unpack, after the first batch is decoded",
        "FairseqTask.build_generator, fairseq_cli.interactive.main (when that tool runs)",
    ),
    Fix(
        "hub_inputs",
        hub.check_hub_inputs,
        "the hub's translate fails deep inside on None, bytes or a float beam (NoneType is not iterable, Input must "
        "be str or bytes); on a sentence too long with a bare Exception naming a command-line flag, and with "
        "skip_invalid_size_inputs=True its translations no longer line up with the sentences; a model trained with "
        "--bf16 decodes in bf16 through fairseq's own from_pretrained, unasked",
        "hub_utils.GeneratorHubInterface.sample, GeneratorHubInterface.generate, GeneratorHubInterface.__init__",
    ),
    Fix(
        "dropped_sentences",
        batching.keep_every_sentence_at_inference,
        "the last batch, when not a multiple of --required-batch-size-multiple (8 by default), is left out without "
        "a word (fairseq issue 5036): generate, validate and validation in training (--eval-bleu) lose up to 7 "
        "sentences; with no sentence left, a bare IndexError; a sentence longer than --max-tokens stops them in the "
        "batcher (AssertionError), even with --skip-invalid-size-inputs-valid-test",
        "data_utils.batch_by_size, FairseqTask.get_batch_iterator, Trainer.get_train_iterator",
    ),
    Fix(
        "interactive_skipped_lines",
        interactive.answer_skipped_lines,
        "fairseq-interactive --skip-invalid-size-inputs-valid-test prints nothing for a line too long for the "
        "model: its outputs no longer line up with its inputs",
        "fairseq_cli.interactive.buffered_read, fairseq_cli.interactive.make_batches (when that tool runs)",
    ),
    Fix(
        "quiet_exits",
        quiet_exits.end_tools_quietly,
        "the plugin's refusal of a flag or a file (InputError) ends fairseq-generate, -interactive, -validate and "
        "-train in a traceback; Ctrl-C in fairseq-interactive or fairseq-generate in a KeyboardInterrupt traceback, "
        "and their output piped into a reader that stops early (| head) in a BrokenPipeError traceback; a refusal in "
        "a rank fairseq-train spawns (one per GPU) ends it in a ProcessRaisedException traceback around the rank's",
        "fairseq_cli.{interactive,generate,validate,train}.main (when that tool runs); distributed_utils.call_main "
        "(fairseq-train)",
    ),
    Fix(
        "empty_splits",
        batching.refuse_empty_splits,
        "an empty binarized split fails in numpy's mmap, naming no file",
        "indexed_dataset.make_dataset",
    ),
    Fix(
        "budget_clock",
        schedules.hand_schedules_the_training_clock,
        "(the plugin's own schedule) --lr-scheduler budget counts time from its own start: a run switched to it "
        "from another schedule, or resumed with --reset-lr-scheduler, is stopped by --stop-time-hours (which "
        "counts the whole run's time) before its rate has annealed",
        "Trainer._build_optimizer",
    ),
    Fix(
        "skip_nonfinite_updates",
        training.skip_nonfinite_updates,
        "a NaN/inf gradient stops a bf16 run; fp16 on a CPU crashes in its skip path",
        "Trainer.clip_grad_norm, Trainer.train_step",
        training=True,
    ),
    Fix(
        "save_on_signals",
        training.save_and_stop_on_signals,
        "Ctrl-C or SIGTERM stops training at once with a traceback, losing every update since the last save",
        "fairseq_cli.train.main, fairseq_cli.train.validate_and_save",
        training=True,
    ),
    Fix(
        "finished_runs",
        training.stop_a_finished_run,
        "a finished --max-update run, run again, trains one update past its limit and rewrites its checkpoints",
        "fairseq_cli.train.train",
        training=True,
    ),
    Fix(
        "resume_other_world_size",
        shards.resume_with_other_rank_counts,
        "a run resumed mid-epoch with more ranks stops in RuntimeError: Cannot resume training due to dataloader "
        "mismatch; with fewer ranks it trains batches of that epoch it had trained already again, silently",
        "EpochBatchIterator.state_dict, EpochBatchIterator.load_state_dict",
        training=True,
    ),
    Fix(
        "full_disk",
        saving.name_a_full_disk,
        "a disk that fills up during a save ends training in a traceback, leaving the save's partial .tmp files",
        "fairseq_cli.train.validate_and_save",
        training=True,
    ),
    Fix(
        "atomic_checkpoint_copies",
        saving.copy_checkpoints_atomically,
        "a kill while copying checkpoint_last.pt leaves it truncated, and the restart fails",
        "PathManager.copy",
        training=True,
    ),
]


def _turned_off() -> set:
    names = {name.strip() for name in os.environ.get("FAIRSEQ_CONVS2S_COMPAT_OFF", "").split(",") if name.strip()}
    unknown = names - {fix.name for fix in FIXES}
    if unknown:
        raise ValueError(
            f"FAIRSEQ_CONVS2S_COMPAT_OFF names no fix {sorted(unknown)}: the fixes are "
            f"{', '.join(fix.name for fix in FIXES)}"
        )
    return names


def install() -> None:
    """Install the fixes of the table but the training ones (idempotent); what importing the plugin runs."""
    off = _turned_off()
    for fix in FIXES:
        if not fix.training and fix.name not in off:
            fix.install()


def install_training_fixes() -> None:
    """Install the training fixes (idempotent); what ``python -m fairseq_convs2s.train`` runs in each process."""
    off = _turned_off()
    for fix in FIXES:
        if fix.training and fix.name not in off:
            fix.install()
