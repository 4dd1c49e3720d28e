"""Turn a fairseq ``fconv`` checkpoint into a ``convs2s`` one that gives the same outputs (the command line:
``python -m fairseq_convs2s.convert_fconv``; on first load: ``ConvS2SModel.from_pretrained``).

The layer specs, embedding sizes, dictionaries and position tables of the original are kept (not a preset's);
the attention keeps fconv's scaling (``--attention-scaling fconv``). Older formats are handled: ``args`` stored as
an argparse Namespace, decoder convolutions normalized over another dimension (decoder version < 2, fairseq
issue 73), and stray ``_linearized_weight`` tensors (fairseq issue 1949). The optimizer state is not carried over:
the output is for generation or for fine-tuning with a fresh optimizer. Nothing is written unless the whole
conversion succeeds.
"""

import os
import re
import tempfile
from argparse import Namespace
from types import SimpleNamespace
from typing import Dict

import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY
from torch import Tensor

from ..compat.broken_checkpoints import what_is_wrong
from ..compat.checkpoints import building_to_load
from .checkpoint_args import FCONV_ARCHS, ConversionError, checkpoint_arch, model_args_of

# fconv module path -> convs2s module path (the parameter names inside, weight_g/weight_v/bias, are the same)
_RENAMES = [
    (r"^encoder\.fc1\.", "encoder.input_projection."),
    (r"^encoder\.fc2\.", "encoder.output_projection."),
    (r"^decoder\.fc1\.", "decoder.input_projection."),
    (r"^decoder\.fc2\.", "decoder.out_embed_projection."),
    (r"^decoder\.fc3\.", "decoder.output_projection."),
    (r"^(encoder|decoder)\.projections\.(\d+)\.", r"\1.blocks.\2.residual_projection."),
    (r"^(encoder|decoder)\.convolutions\.(\d+)\.", r"\1.blocks.\2.conv."),
    (r"^decoder\.attention\.(\d+)\.in_projection\.", r"decoder.blocks.\1.attention.query_projection."),
    (r"^decoder\.attention\.(\d+)\.out_projection\.", r"decoder.blocks.\1.attention.output_projection."),
]
_KEPT = re.compile(r"^(encoder|decoder)\.(embed_tokens|embed_positions)\.weight$|^decoder\.version$")


def convert_state_dict(fconv_state: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """Map an fconv model state dict onto convs2s parameter names, upgrading old weight-norm layouts."""
    state = {k: v for k, v in fconv_state.items() if not k.endswith("_linearized_weight")}
    if float(state.get("decoder.version", torch.tensor([1.0])).flatten()[0]) < 2:
        _renormalize_old_decoder_convs(state)
    converted = {}
    for key, value in state.items():
        new_key = key
        for pattern, replacement in _RENAMES:
            new_key = re.sub(pattern, replacement, new_key)
        if new_key == key and not _KEPT.match(key):
            raise ConversionError(f"unexpected parameter {key!r}: this does not look like an fconv model")
        converted[new_key] = value
    converted["decoder.version"] = torch.tensor([2.0])
    return converted


def _renormalize_old_decoder_convs(state: Dict[str, Tensor]) -> None:
    """Version-1 decoders normalized conv kernels (k x in x out) over dims (1, 2); re-split over (0, 1)."""
    for key in [k for k in state if re.match(r"^decoder\.convolutions\.\d+\.weight_g$", k)]:
        prefix = key[: -len("weight_g")]
        g, v = state[key], state[prefix + "weight_v"]
        weight = v * (g / torch.linalg.vector_norm(v, dim=(1, 2), keepdim=True))  # g: k x 1 x 1
        state[prefix + "weight_v"] = weight
        state[key] = torch.linalg.vector_norm(weight, dim=(0, 1), keepdim=True)  # 1 x 1 x out


def convert_args(model_args: Namespace, state: Dict[str, Tensor]) -> Namespace:
    """The convs2s model args for an fconv model: its own sizes and specs, position tables as stored."""
    from fairseq.models.fconv import base_architecture

    args = Namespace(**vars(model_args))
    base_architecture(args)  # fconv's own defaults for anything an old checkpoint left out
    args.arch = "convs2s"
    args._name = "convs2s"
    args.attention_scaling = "fconv"
    pad = 1  # fairseq dictionaries put <pad> at index 1; fconv's tables have max_positions rows
    for side in ("encoder", "decoder"):
        rows = state[f"{side}.embed_positions.weight"].size(0)
        setattr(args, f"max_{'source' if side == 'encoder' else 'target'}_positions", rows - pad - 1)
    for spec in ("encoder_layers", "decoder_layers", "decoder_attention"):
        setattr(args, spec, str(getattr(args, spec)))
    return args


def convert_checkpoint(checkpoint: dict, model_class) -> dict:
    """Convert a loaded fairseq checkpoint dict (fconv) into a convs2s checkpoint dict, checked by loading it into
    a ``model_class`` (``ConvS2SModel``) built from the converted args."""
    arch = checkpoint_arch(checkpoint)
    model_args, where = model_args_of(checkpoint)
    if arch not in FCONV_ARCHS and ARCH_MODEL_REGISTRY.get(arch) is model_class:
        raise ConversionError(f"already a convs2s checkpoint (arch {arch!r}): use it as it is, no conversion needed")
    if arch not in FCONV_ARCHS:
        raise ConversionError(f"not an fconv translation model: its arch is {arch!r} (expected one of {FCONV_ARCHS})")
    state = convert_state_dict(checkpoint["model"])
    args = convert_args(model_args, state)
    _check_loads(args, state, model_class)

    dropped = ("last_optimizer_state", "optimizer_history", "optimizer")  # ('optimizer': fairseq's oldest format)
    out = {k: v for k, v in checkpoint.items() if k not in dropped}
    out["model"] = state
    out.setdefault("extra_state", {})  # (fairseq's loader reads it; a checkpoint stripped to its weights has none)
    out["optimizer_history"] = [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "none",
                                 "lr_scheduler_state": {}, "num_updates": 0}]  # fmt: skip
    if where == "cfg":
        out["cfg"] = dict(checkpoint["cfg"])
        out["cfg"]["model"] = args
    else:
        out["args"] = args
    return out


def _check_loads(args: Namespace, state: Dict[str, Tensor], model_class) -> None:
    """Build the convs2s model these args describe and load the state strictly: no weight left out or misfit."""

    def dictionary(size: int) -> Dictionary:
        d = Dictionary()
        for i in range(size - len(d)):
            d.add_symbol(f"<{i}>")
        return d

    src = dictionary(state["encoder.embed_tokens.weight"].size(0))
    tgt = dictionary(state["decoder.embed_tokens.weight"].size(0))
    with building_to_load():  # the state's weights, not the pre-trained embedding files fconv was trained from
        model = model_class.build_model(
            Namespace(**vars(args)), SimpleNamespace(source_dictionary=src, target_dictionary=tgt)
        )
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ConversionError(f"the converted weights do not fit the model they describe: {e}") from None


def read_checkpoint(path: str, mmap: bool = False) -> dict:
    """``torch.load`` a fairseq checkpoint onto the CPU; a missing, truncated, empty or non-torch file, or a torch
    file that is not a fairseq checkpoint, is a ConversionError that says which in one line.

    With ``mmap`` the tensors of a zip-format file are mapped, not read, which makes looking at the ``cfg`` of a
    large checkpoint cheap; files in torch's legacy format (before torch 1.6) are read in full. Importing this
    module ran the package's ``__init__``, which allow-lists fairseq's checkpoint classes (``compat``).
    """
    try:
        checkpoint = _load(path, mmap)
    except FileNotFoundError:
        raise ConversionError(f"{path}: no such file") from None
    except Exception as e:  # truncated, empty, not a torch file: which, in one line
        reason = str(e).strip().split("\n")[0]  # (torch's weights_only refusal goes on for lines)
        problem = what_is_wrong(path) or f"{path}: cannot be read as a torch checkpoint ({type(e).__name__}: {reason})"
        raise ConversionError(problem) from None
    if not isinstance(checkpoint, dict) or "model" not in checkpoint:
        problem = what_is_wrong(path, checksums=False)
        raise ConversionError(problem or f"{path}: not a fairseq checkpoint: no 'model' entry")
    return checkpoint


def _load(path: str, mmap: bool):
    if mmap:
        try:
            return torch.load(path, map_location="cpu", mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):  # only the legacy format's refusal falls through to a full read
                raise
    return torch.load(path, map_location="cpu")


def save_atomically(checkpoint: dict, out_path: str) -> None:
    """``torch.save`` to a temporary file beside ``out_path``, renamed over it only once complete.

    A reader never sees a half-written file, and a failure (full disk, interrupt) leaves no file behind. The file
    gets the permissions a plain ``open`` would give it (0666 less the umask), not the temporary file's 0600.
    """
    out_dir = os.path.dirname(os.path.abspath(out_path))
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".convert_fconv.", suffix=".pt")
    os.close(fd)
    try:
        torch.save(checkpoint, tmp)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, out_path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def current_umask() -> int:
    """The process's umask (reading it means setting it: put back at once)."""
    mask = os.umask(0o022)  # reading the umask means setting it: put it back at once
    os.umask(mask)
    return mask
