"""Make fairseq's own checkpoints load under torch >= 2.6, whose ``torch.load`` defaults to ``weights_only=True``.

fairseq 0.12 calls ``torch.load(f, map_location=...)`` and its checkpoints pickle an ``argparse.Namespace`` (the
model's ``args``/``cfg.model``), so stock ``fairseq-generate --path ckpt.pt`` fails with "Unsupported global:
GLOBAL argparse.Namespace". Rather than turning the safe loader off, this allow-lists the few plain classes that
fairseq checkpoints hold; anything else still fails to unpickle, as torch intends.

The checkpoint that rank 0 of a multi-process training loads and sends to the other ranks (fairseq pickles it with
``torch.save`` and reads it back with ``torch.load``) is read with the full unpickler: it comes from the same run,
not from a file, and holds the run's ``DictConfig`` (:func:`receive_broadcasts_whole`).

And a model built to load a checkpoint reads no pre-trained embedding file (:func:`build_models_to_load`).
"""

import argparse
import contextlib
import io

import torch
from fairseq import checkpoint_utils

from fairseq_convs2s_autoload import LOADING_CHECKPOINT, is_replaced, mark_checkpoint_loads, replace


def _numpy_globals() -> list:
    """What a numeric numpy array or scalar pickles as: fairseq-train --eval-bleu saves its BLEU meters' counts
    as numpy arrays in ``extra_state["metrics"]``. (An array of Python objects would also need each object's
    class, which stays refused.)"""
    import numpy as np

    multiarray = (getattr(np, "_core", None) or np.core).multiarray
    numeric = (np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.int8, np.uint8, np.bool_)
    return [np.ndarray, np.dtype, multiarray._reconstruct, multiarray.scalar] + [type(np.dtype(t)) for t in numeric]


# the classes fairseq 0.12 writes into checkpoints besides tensors and builtin containers
FAIRSEQ_CHECKPOINT_GLOBALS = [argparse.Namespace, *_numpy_globals()]


def allow_fairseq_checkpoints() -> None:
    """Register the classes above with torch's safe unpickler (a no-op on torch without it)."""
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is not None:
        add_safe_globals(FAIRSEQ_CHECKPOINT_GLOBALS)


def receive_broadcasts_whole() -> None:
    """Wrap ``distributed_utils._broadcast_object_slow`` (how ``Trainer.load_checkpoint`` sends rank 0's checkpoint
    to the others when a multi-process run resumes) so that the receiving ranks unpickle it with ``weights_only=False``
    (idempotent). Under torch >= 2.6 they refused it (Unsupported global: omegaconf.dictconfig.DictConfig), and no
    multi-process run could resume."""
    from fairseq.distributed import utils as distributed_utils

    if is_replaced(distributed_utils._broadcast_object_slow, "resume_ranks"):
        return
    replace(
        distributed_utils,
        "_broadcast_object_slow",
        _receiving_whole(distributed_utils._broadcast_object_slow),
        "resume_ranks",
    )


def _receiving_whole(broadcast_object_slow):
    def wrapper(obj, src_rank, group, dist_device):
        from fairseq.distributed import utils as distributed_utils

        if distributed_utils.get_rank(group) == src_rank:
            return broadcast_object_slow(obj, src_rank, group, dist_device)
        # fairseq's receiving side, but for the unpickler: the sender's length, then its bytes
        length = torch.LongTensor([0]).to(dist_device)
        distributed_utils.broadcast(length, src=src_rank, group=group)
        buffer = torch.ByteTensor(int(length.item())).to(dist_device)
        distributed_utils.broadcast(buffer, src=src_rank, group=group)
        return torch.load(io.BytesIO(buffer.cpu().numpy()), map_location="cpu", weights_only=False)

    return wrapper


@contextlib.contextmanager
def building_to_load():
    """Inside, a convs2s model is built only to receive a checkpoint's weights: it reads no pre-trained embedding
    file (``--encoder-embed-path``, ``--decoder-embed-path``), whose vectors those weights replace."""
    token = LOADING_CHECKPOINT.set(True)
    try:
        yield
    finally:
        LOADING_CHECKPOINT.reset(token)


def is_building_to_load() -> bool:
    """Inside :func:`building_to_load` or a call of ``load_model_ensemble_and_task`` (marked by the wrapper that
    this plugin and the installed package's start-up hook share: ``fairseq_convs2s_autoload``)."""
    return LOADING_CHECKPOINT.get()


def build_models_to_load() -> None:
    """Wrap ``checkpoint_utils.load_model_ensemble_and_task`` (what fairseq-generate, fairseq-interactive,
    fairseq-validate and the hub interface load checkpoints with: it builds each model from the checkpoint's cfg
    and loads the checkpoint's weights into it) so that its models are built inside :func:`building_to_load`
    (idempotent; the start-up hook installs the same wrapper when it sees fairseq first).

    Porting note (fconv): a model trained with ``--encoder-embed-path FILE`` keeps the path in its saved cfg, and
    fconv (as every fairseq model) reads FILE again whenever the checkpoint is loaded, only for the weights to
    overwrite what it read: decoding fails with ``FileNotFoundError`` wherever FILE is not (another machine), and
    re-parses a GloVe-size file at every load where it is. A convs2s model skips the file there; training a fresh
    model (``fairseq-train``, which builds without this wrapper) reads it as before."""
    mark_checkpoint_loads(checkpoint_utils)
