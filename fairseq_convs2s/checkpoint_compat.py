"""Make fairseq's own checkpoints load under torch >= 2.6, whose ``torch.load`` defaults to ``weights_only=True``.

fairseq 0.12 calls ``torch.load(f, map_location=...)`` and its checkpoints pickle an ``argparse.Namespace`` (the
model's ``args``/``cfg.model``), so stock ``fairseq-generate --path ckpt.pt`` fails with "Unsupported global:
GLOBAL argparse.Namespace". Rather than turning the safe loader off, this allow-lists the few plain classes that
fairseq checkpoints hold; anything else still fails to unpickle, as torch intends.
"""

import argparse

import torch

# the classes fairseq 0.12 writes into checkpoints besides tensors and builtin containers
FAIRSEQ_CHECKPOINT_GLOBALS = [argparse.Namespace]


def allow_fairseq_checkpoints() -> None:
    """Register the classes above with torch's safe unpickler (a no-op on torch without it)."""
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is not None:
        add_safe_globals(FAIRSEQ_CHECKPOINT_GLOBALS)
