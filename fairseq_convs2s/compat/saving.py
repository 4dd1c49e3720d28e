"""How training writes its checkpoint files, fixed where stock fairseq loses them: installed, as ``training.py``'s
fixes are, by ``python -m fairseq_convs2s.train`` in every training process.

- The extra copies of a checkpoint (``checkpoint_last.pt`` after ``checkpoint_3_500.pt``, ``checkpoint_best.pt``)
  are written to a temporary file and renamed, as fairseq already does for the first file; stock fairseq copies
  in place, so a kill during the copy leaves a truncated ``checkpoint_last.pt`` that the restart then fails to load.
- A disk that fills up during a save ends training in one line saying which file, that the checkpoints saved before
  are whole, and how to go on; the save's partial ``.tmp`` files are removed (stock fairseq: a traceback, logged by
  its save's retries and raised again, and the partial files left, filling the disk).
"""

import errno
import glob
import logging
import os
import shutil

from fairseq_convs2s_autoload import is_replaced, replace

logger = logging.getLogger("fairseq_convs2s.train")


def name_a_full_disk() -> None:
    """Wrap ``fairseq_cli.train.validate_and_save`` (outside the stop on signals: its saves too) so that a disk that
    fills up during a save ends training in one line, the save's partial files removed (idempotent)."""
    import fairseq_cli.train as fairseq_train

    if is_replaced(fairseq_train.validate_and_save, "full_disk"):
        return
    validate_and_save = fairseq_train.validate_and_save
    saves = logging.getLogger("fairseq.checkpoint_utils")  # logs the traceback of its last failed try to write

    def validate_and_save_or_name_a_full_disk(cfg, trainer, *args, **kwargs):
        saves.addFilter(_not_a_full_disk)
        try:
            return validate_and_save(cfg, trainer, *args, **kwargs)
        except OSError as error:
            if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            save_dir = cfg.checkpoint.save_dir
            for partial in glob.glob(os.path.join(glob.escape(save_dir), "checkpoint*.pt.tmp")):
                os.remove(partial)
            written = error.filename2 or error.filename
            logger.error(
                "%s writing %s (after update %d): the checkpoints saved before it are whole, this save's partial "
                "files removed; free space in %s and run the same command to go on from checkpoint_last.pt",
                error.strerror,
                written,
                trainer.get_num_updates(),
                save_dir,
            )
            raise SystemExit(1) from None
        finally:
            saves.removeFilter(_not_a_full_disk)

    replace(fairseq_train, "validate_and_save", validate_and_save_or_name_a_full_disk, "full_disk")


def _not_a_full_disk(record: logging.LogRecord) -> bool:
    """False for the traceback fairseq logs when a save finds the disk full (the wrapper names it in one line)."""
    message = record.getMessage()
    return not any(f"[Errno {code}]" in message for code in (errno.ENOSPC, errno.EDQUOT))


def copy_checkpoints_atomically() -> None:
    """Wrap ``PathManager.copy`` so that a checkpoint's extra copies are written whole or not at all (idempotent)."""
    from fairseq.file_io import PathManager

    if is_replaced(PathManager.copy, "atomic_checkpoint_copies"):
        return
    copy = _atomic_copy(PathManager.copy)
    replace(PathManager, "copy", copy, "atomic_checkpoint_copies")  # (called on the class, as fairseq calls it)


def _atomic_copy(copy):
    def wrapper(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        from fairseq.file_io import PathManager

        if PathManager.path_requires_pathmanager(dst_path) or not overwrite and os.path.exists(dst_path):
            return copy(src_path, dst_path, overwrite=overwrite)
        tmp = dst_path + ".tmp"
        try:
            shutil.copyfile(src_path, tmp)
            os.replace(tmp, dst_path)  # the old file stays whole until the new one is
        except BaseException:  # (a full disk: the partial copy would keep its space)
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
        return True

    return wrapper
