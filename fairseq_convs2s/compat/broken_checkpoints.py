"""Name a checkpoint that cannot be loaded, in one line: which file, its size, and what is wrong with it.

fairseq 0.12 reads every checkpoint through ``checkpoint_utils.load_checkpoint_to_cpu`` (fairseq-generate,
fairseq-interactive, fairseq-validate, ``fairseq-train --restore-file`` and its automatic resume from
``checkpoint_last.pt``, fairseq's hub interface; the plugin's ``from_pretrained`` reads the file itself first,
in ``models/fconv_checkpoint.py``). A broken file fails deep inside torch, in words that name neither the file nor the
problem: a file cut short (a copy interrupted, a full disk) ends in ``OSError: [Errno 22] Invalid argument`` or
``PytorchStreamReader failed reading zip archive: failed finding central directory``, an empty file in a bare
``EOFError``, a text file in ``KeyError: 101``, and a torch file that is not a fairseq checkpoint in
``KeyError: 'best_loss'``. With the plugin imported, a failed load looks at the file and raises a
:class:`BrokenCheckpoint` saying which of these it is; a load that fails for another reason (torch's refusal of a
class, an override that does not apply) keeps its own error. In training (``Trainer.load_checkpoint``) the message
also says which other checkpoints in the same folder load, to resume from with ``--restore-file``. Nothing is
deleted, moved or overwritten.

A checkpoint that loads can still hold another model than the one fairseq-train builds from its command line (a
resume, ``--restore-file`` or ``--finetune-from-model`` with other layer flags, or of an fconv model): fairseq
then fails with missing and unexpected keys naming no flag, or, where the shapes agree, trains on silently. The
trainer asks the model it trains (a model with a ``checkpoint_difference`` method: the plugin's) and raises a
``ValueError`` with its answer before loading.
"""

import contextvars
import os
import zipfile
from typing import List, Optional, Tuple

from fairseq import checkpoint_utils

from fairseq_convs2s_autoload import is_replaced, replace

from ..errors import InputError

# (the checkpoint, the trainer) while a trainer loads (its resume from checkpoint_last.pt, --restore-file), else None
_RESUMING: contextvars.ContextVar = contextvars.ContextVar("convs2s_resuming", default=None)


# fairseq's assertions when a checkpoint's optimizer state is not of this command's criterion or optimizer
OTHER_OPTIMIZER = ("Criterion does not match", "Optimizer does not match")


class BrokenCheckpoint(InputError):
    """A checkpoint file that cannot be loaded; the message names the file, its size and what is wrong."""


def _size(size: int) -> str:
    return f"{size:,} bytes" if size < 10**6 else f"{size:,} bytes, {size / 2**20:.1f} MiB"


def _holds(state) -> str:
    """What a torch file that is not a fairseq checkpoint holds, in a few words."""
    if isinstance(state, dict):
        keys = sorted(map(str, state))
        listed = ", ".join(map(repr, keys[:5])) + (", ..." if len(keys) > 5 else "")
        return f"it holds a dict of {listed or 'nothing'} and no 'model'"
    return f"it holds a {type(state).__name__}, not a dict with a 'model'"


def _load_for_a_look(path: str):
    """``torch.load`` with torch's safe unpickler (what fairseq's own load uses on torch >= 2.6, with the classes
    the plugin allow-lists), so that looking runs nothing in the file; the tensors mapped, not read (cheap even for
    a large file), but in the legacy format (before torch 1.6), which cannot be mapped."""
    import torch

    try:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except RuntimeError as e:
        if "mmap" not in str(e):
            raise
    return torch.load(path, map_location="cpu", weights_only=True)


def what_is_wrong(path: str, checksums: bool = True) -> Optional[str]:
    """One line saying why ``path`` cannot be loaded as a fairseq checkpoint (truncated, empty, not a torch
    checkpoint, not a fairseq checkpoint, damaged), or None: it is there, whole, and a fairseq checkpoint (or not a
    local file). Unpickles the file as torch's safe loader does, with its tensors mapped; ``checksums`` also reads
    every byte of a zip archive to check its checksums."""
    return _look(path, checksums)[0]


def _look(path: str, checksums: bool) -> Tuple[Optional[str], object]:
    """(:func:`what_is_wrong`, the state torch loaded where it got that far)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return None, None  # missing or unreadable: the error fairseq or the OS gives names it
    if size == 0:
        return f"{path} is empty (0 bytes): not a checkpoint (a save or a copy that wrote nothing?)", None
    where = f"{path} ({_size(size)})"
    if head.startswith(b"PK\x03\x04"):  # torch's format since 1.6: a zip archive
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
                damaged = archive.testzip() if checksums else None
        except (zipfile.BadZipFile, OSError, EOFError):
            truncated = "the zip archive torch saves has no end (a copy cut short, a full disk?); it cannot be loaded"
            return f"{where} is truncated: {truncated}", None
        if not any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
            return f"{where} is not a torch checkpoint: a zip archive without torch's data.pkl", None
        if damaged is not None:
            return f"{where} is damaged: its part {damaged} fails its checksum", None
    elif not head.startswith(b"\x80"):  # neither a zip nor a pickle (torch's legacy format)
        text = head[:24].decode("utf-8", "replace").split("\n")[0]
        return f"{where} is not a torch checkpoint: it begins with {text!r}", None
    try:
        state = _load_for_a_look(path)
    except (EOFError, RuntimeError, OSError) as e:
        if head.startswith(b"PK"):
            return None, None  # whole, and yet torch fails: its own error says more
        return f"{where} is truncated or damaged: torch's legacy format fails to load ({type(e).__name__}: {e})", None
    except Exception:
        return None, None  # e.g. torch's safe unpickler refusing a class: its own message names it
    if not isinstance(state, dict) or "model" not in state:
        return f"{where} is a torch file but not a fairseq checkpoint: {_holds(state)}", state
    return None, state


def _updates(state) -> int:
    """The number of updates a loaded fairseq checkpoint was saved at (-1 where it does not say)."""
    try:
        return int(state["optimizer_history"][-1]["num_updates"])
    except (KeyError, IndexError, TypeError, ValueError):
        return -1


def loadable_neighbours(path: str) -> List[str]:
    """The other ``*.pt`` files in ``path``'s folder that load as fairseq checkpoints, the most updates first (then
    the newest file, then by name)."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        others = [os.path.join(folder, n) for n in sorted(os.listdir(folder)) if n.endswith(".pt")]
    except OSError:
        return []
    found = []
    for other in others:
        if os.path.isfile(other) and not os.path.samefile(other, path):
            problem, state = _look(other, checksums=False)
            if problem is None and state is not None:
                found.append((-_updates(state), -os.path.getmtime(other), other))
    return [other for *_, other in sorted(found)]


def _resume_advice(path: str) -> str:
    folder = os.path.dirname(os.path.abspath(path))
    others = loadable_neighbours(path)
    if not others:
        return f"; no other checkpoint in {folder} loads"
    names = ", ".join(os.path.basename(p) for p in others)
    return (
        f"; other checkpoints in {folder} that load, most updates first: {names} (resume with --restore-file "
        f"{others[0]})"
    )


def name_broken_checkpoints() -> None:
    """Wrap ``checkpoint_utils.load_checkpoint_to_cpu`` to raise a :class:`BrokenCheckpoint` where it fails on a
    broken file, and ``Trainer.load_checkpoint`` to add the loadable checkpoints beside it (idempotent; on top of
    the start-up hook's wrapper, where that came first)."""
    from fairseq.trainer import Trainer

    load = checkpoint_utils.load_checkpoint_to_cpu
    if not is_replaced(load, "broken_checkpoints"):

        def load_checkpoint_to_cpu(path, *args, **kwargs):
            try:
                state = load(path, *args, **kwargs)
            except Exception:
                local = path if os.path.exists(str(path)) else None
                problem = what_is_wrong(local) if local else None
                if problem is None:
                    raise
                if _RESUMING.get() is not None:
                    problem += _resume_advice(local)
                raise BrokenCheckpoint(problem) from None
            resuming = _RESUMING.get()
            if resuming is not None:
                ask = getattr(resuming[1].get_model(), "checkpoint_difference", None)
                problem = ask(state) if ask is not None else None
                if problem is not None:
                    raise InputError(f"{path}: {problem}")
            return state

        replace(checkpoint_utils, "load_checkpoint_to_cpu", load_checkpoint_to_cpu, "broken_checkpoints")

    if not is_replaced(Trainer.load_checkpoint, "broken_checkpoints"):
        trainer_load = Trainer.load_checkpoint

        def load_checkpoint(self, filename, *args, **kwargs):
            given = self.cfg.checkpoint.restore_file
            if given != "checkpoint_last.pt" and not os.path.exists(str(filename)):  # (fairseq: trains anew, silently)
                raise BrokenCheckpoint(
                    f"--restore-file {filename}: no such file (training would start anew and overwrite the "
                    f"checkpoints in {self.cfg.checkpoint.save_dir}); leave the flag out to train anew"
                )
            token = _RESUMING.set((filename, self))
            try:
                return trainer_load(self, filename, *args, **kwargs)
            except AssertionError as error:
                # fairseq's assert, "Criterion does not match; please reset ... THEIRS vs OURS": the optimizer state
                # saved for another criterion or optimizer is not loaded
                message = str(error)
                if not message.startswith(OTHER_OPTIMIZER) or message.count(" vs ") != 1:
                    raise
                head, ours = message.split(" vs ")
                what, theirs = message.split(" ", 1)[0].lower(), head.rsplit(" ", 1)[-1]
                raise InputError(
                    f"{filename} holds the optimizer state of {what} {theirs}, and this command trains with {ours}: "
                    "add --reset-optimizer to train on from its weights alone (the update count and the learning "
                    "rate start again)"
                ) from None
            except Exception as error:
                refusal = error.__context__
                if type(error) is Exception and isinstance(refusal, ValueError):
                    # fairseq's "please ensure that the architectures match" over the model's own words for why
                    raise InputError(f"{filename}: {refusal}") from None
                raise
            finally:
                _RESUMING.reset(token)

        replace(Trainer, "load_checkpoint", load_checkpoint, "broken_checkpoints")
