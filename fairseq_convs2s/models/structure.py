"""What a convs2s model's weights mean: the settings that must agree for a checkpoint to be trained on.

fairseq-train loads a checkpoint into the model the command line builds (its resume from ``checkpoint_last.pt``,
``--restore-file``, ``--finetune-from-model``). Where the two differ in shape, torch stops with a list of missing
and unexpected keys and fairseq adds "please ensure that the architectures match", naming no flag; where they
differ only in meaning (another residual lookback, ``--attention-scaling``, which layers attend where the
projections exist anyway), the weights load silently into a model that computes something else, and training
goes on from a model it never was. :func:`difference` names the flags that differ, with both values, so that the
trainer refuses before it loads (``compat/broken_checkpoints.py`` asks the model it trains).
"""

from argparse import Namespace
from typing import Dict, Optional

from .checkpoint_args import FCONV_ARCHS, ConversionError, checkpoint_arch, model_args_of
from .config import DEFAULT_MAX_POSITIONS
from .layer_spec import LayerSpecError, parse_attention_spec, parse_layer_spec

# the flags that decide what the weights compute; dropout, --checkpoint-activations and the like may change
STRUCTURE_FLAGS = (
    "encoder_layers",
    "decoder_layers",
    "decoder_attention",
    "encoder_embed_dim",
    "decoder_embed_dim",
    "decoder_out_embed_dim",
    "share_input_output_embed",
    "share_all_embeddings",
    "attention_scaling",
    "max_source_positions",
    "max_target_positions",
)


def structure_of(args: Namespace) -> Dict[str, object]:
    """{flag: value as given} of a built model's args (presets applied), for :func:`difference`."""
    return {flag: getattr(args, flag, None) for flag in STRUCTURE_FLAGS}


def _meaning(structure: Dict[str, object]) -> Dict[str, object]:
    """The values compared: layer specs parsed (``[(256,3)]*2`` is ``[(256, 3)] * 2``), defaults filled in."""
    meaning = dict(structure)
    for side in ("encoder", "decoder"):
        meaning[f"{side}_layers"] = parse_layer_spec(str(structure[f"{side}_layers"]))
    meaning["decoder_attention"] = parse_attention_spec(
        str(structure["decoder_attention"]), len(meaning["decoder_layers"])
    )
    for side in ("source", "target"):
        meaning[f"max_{side}_positions"] = structure[f"max_{side}_positions"] or DEFAULT_MAX_POSITIONS
    for flag in ("share_input_output_embed", "share_all_embeddings"):
        meaning[flag] = bool(structure[flag])
    meaning["attention_scaling"] = str(structure["attention_scaling"] or "fconv")
    return meaning


def difference(own: Dict[str, object], checkpoint: dict) -> Optional[str]:
    """Why a loaded fairseq checkpoint cannot be trained on as the model of ``own`` (:func:`structure_of`): a model
    of another kind, or the flags whose values differ; None if it can."""
    try:
        arch = checkpoint_arch(checkpoint)
        model_args, _ = model_args_of(checkpoint)
    except ConversionError:
        return None  # (not a fairseq checkpoint: fairseq's own loading names the file)
    if arch in FCONV_ARCHS:
        return (
            f"an fconv checkpoint (--arch {arch}): convert it first, python -m fairseq_convs2s.convert_fconv "
            "CHECKPOINT OUT.pt, and train from OUT.pt"
        )
    if not str(arch).startswith("convs2s"):
        return f"a checkpoint of --arch {arch}, not a convs2s model"
    from .presets import base_architecture

    saved = Namespace(**(dict(model_args) if not isinstance(model_args, Namespace) else vars(model_args)))
    base_architecture(saved)  # (as build_model does: what an older checkpoint left out)
    theirs = structure_of(saved)
    try:
        ours_meant, theirs_meant = _meaning(own), _meaning(theirs)
    except LayerSpecError:
        return None  # (a spec that does not parse: building the model says so)
    differing = [flag for flag in STRUCTURE_FLAGS if ours_meant[flag] != theirs_meant[flag]]
    if not differing:
        return None
    # a flag given alike whose meaning follows another's ("--decoder-attention True" over other layers) goes unnamed
    differing = [flag for flag in differing if str(own[flag]) != str(theirs[flag])] or differing
    listed = "; ".join(f"--{flag.replace('_', '-')} {theirs[flag]} there, {own[flag]} here" for flag in differing)
    return (
        f"its model is not the one this command builds ({listed}): give the checkpoint's values, or train anew "
        "in another --save-dir"
    )
