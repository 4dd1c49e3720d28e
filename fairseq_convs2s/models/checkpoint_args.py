"""What a loaded fairseq checkpoint says about its model: its ``--arch`` and its model args. Read by the model (to
refuse training on from another model: ``structure.py``) and by the converter (``fconv_checkpoint.py``); imports
nothing of the plugin but its exception, so that the model does not import the converter."""

from argparse import Namespace
from typing import Tuple

from ..errors import InputError

FCONV_ARCHS = ("fconv", "fconv_iwslt_de_en", "fconv_wmt_en_ro", "fconv_wmt_en_de", "fconv_wmt_en_fr")


class ConversionError(InputError):
    """The input is not a convertible fconv checkpoint; the message says why."""


def model_args_of(checkpoint: dict) -> Tuple[Namespace, str]:
    """The model args of a fairseq checkpoint and where they are: ``cfg.model`` ("cfg"), or before fairseq 0.10
    ``args`` ("args")."""
    cfg = checkpoint.get("cfg")
    if cfg is not None and cfg.get("model") is not None:
        return cfg["model"], "cfg"
    if checkpoint.get("args") is not None:
        return checkpoint["args"], "args"
    raise ConversionError("the checkpoint has neither 'cfg' nor 'args': not a fairseq checkpoint")


def checkpoint_arch(checkpoint: dict) -> str:
    """The ``--arch`` a loaded fairseq checkpoint was trained with (``cfg.model`` or, before fairseq 0.10, ``args``)."""
    if not isinstance(checkpoint, dict) or "model" not in checkpoint:
        raise ConversionError("not a fairseq checkpoint: no 'model' entry")
    model_args, _ = model_args_of(checkpoint)
    if isinstance(model_args, dict):  # dataclass models store their config as a plain dict
        return model_args.get("arch") or model_args.get("_name")
    return getattr(model_args, "arch", None) or getattr(model_args, "_name", None)
