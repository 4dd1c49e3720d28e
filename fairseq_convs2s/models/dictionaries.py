"""The dictionaries a model is built with: recorded in its args (which fairseq saves in every checkpoint) by a
fingerprint, so that a model built from a checkpoint's args against other dictionaries is refused, naming the
file, before it translates into garbage."""

import hashlib
import os
from argparse import Namespace
from typing import Dict, Optional

from ..errors import InputError

SIDES = ("source", "target")
USE_THE_TRAINING_DICTIONARY = (
    "use the dictionary the model was trained with (fairseq-preprocess --srcdict/--tgtdict with the training "
    "data's dict files, or the checkpoint's own data dir)"
)


def dictionary_fingerprint(dictionary) -> str:
    """``"<entries>:<sha1 of the symbols in order>"``: two dictionaries agree on every token id iff these match."""
    digest = hashlib.sha1("\n".join(dictionary.symbols).encode("utf-8")).hexdigest()[:16]
    return f"{len(dictionary)}:{digest}"


def dictionary_label(task, side: str) -> str:
    """How the user knows the task's dictionary: ``dict.de.txt in data-bin`` for the translation task."""
    cfg = getattr(task, "cfg", None)
    lang = getattr(cfg, f"{side}_lang", None)
    data = getattr(cfg, "data", None)
    label = f"dict.{lang}.txt" if lang else f"{side} dictionary"
    return f"{label} in {str(data).split(os.pathsep)[0]}" if data else label


def check_dictionaries(args: Namespace, task) -> None:
    """Record the dictionaries a model is built with in its args (which fairseq saves in every checkpoint), and
    refuse to build a model from a checkpoint's args against different ones.

    The embedding sizes catch a dictionary of another size (``load_state_dict``), but a dictionary of the same
    size with other words or another order (fairseq pads sizes to a multiple of 8, so this is common) loads
    silently and translates into garbage; the fingerprint catches that too. Checkpoints written before this
    check, or converted from fconv, carry no fingerprint and get only the size check.
    """
    for side in SIDES:
        dictionary = getattr(task, f"{side}_dictionary")
        current = dictionary_fingerprint(dictionary)
        recorded = getattr(args, f"{side}_dictionary_fingerprint", None)
        if recorded is None:
            setattr(args, f"{side}_dictionary_fingerprint", current)
        elif recorded != current:
            raise InputError(mismatch(side, recorded, current, dictionary_label(task, side)))


def mismatch(side: str, recorded: str, current: str, label: str) -> str:
    """The message for the checkpoint's ``side`` dictionary (fingerprint ``recorded``) against the data's
    (``current``, known to the user as ``label``)."""
    trained_size, size = int(recorded.split(":")[0]), int(current.split(":")[0])
    if trained_size != size:
        problem = f"the checkpoint's {side} dictionary has {trained_size} entries, the data's {label} has {size}"
    else:
        problem = (
            f"the data's {label} has the {trained_size} entries of the checkpoint's {side} dictionary but not the "
            "same words in the same order"
        )
    return f"dictionary mismatch: {problem}: {USE_THE_TRAINING_DICTIONARY}"


def dictionary_difference(fingerprints: Dict[str, str], labels: Dict[str, str], model_args) -> Optional[str]:
    """Why a checkpoint whose model args are ``model_args`` cannot be trained on by a model built with the
    dictionaries of ``fingerprints`` ({side: fingerprint}), or None (also where the checkpoint recorded none).
    Asked before fairseq-train loads it: a dictionary of the same size loaded silently, and one of another size
    ended in fairseq's "please ensure that the architectures match"."""
    for side in SIDES:
        key = f"{side}_dictionary_fingerprint"
        recorded = model_args.get(key) if isinstance(model_args, dict) else getattr(model_args, key, None)
        if recorded is not None and recorded != fingerprints[side]:
            return mismatch(side, recorded, fingerprints[side], labels[side])
    return None
