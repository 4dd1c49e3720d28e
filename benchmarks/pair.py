"""Two models with the same architecture and the same weights: fairseq's ``fconv`` and this plugin's ``convs2s``.

The fconv model is built by stock fairseq with its own initialization; the convs2s model is what
``fairseq_convs2s.convert_fconv`` makes of its checkpoint, so every difference measured is one of implementation.
"""

import argparse
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Dict, List, Optional

import torch
from fairseq.data import Dictionary
from fairseq.models.fconv import FConvModel
from fairseq.models.fconv import base_architecture as fconv_base_architecture

import fairseq_convs2s  # noqa: F401  (registers the model)
from fairseq_convs2s.models.convs2s import ConvS2SModel
from fairseq_convs2s.models.fconv_checkpoint import convert_checkpoint


@dataclass(frozen=True)
class Size:
    """An architecture both implementations can build (fconv flags, the same strings convs2s parses)."""

    name: str
    encoder_layers: str
    decoder_layers: str
    embed_dim: int
    out_embed_dim: int
    vocab: int


SIZES: Dict[str, Size] = {
    # convs2s_iwslt_de_en (fconv_iwslt_de_en has the same blocks)
    "iwslt": Size("convs2s_iwslt_de_en", "[(256, 3)] * 4", "[(256, 3)] * 3", 256, 256, 10_000),
    # convs2s_wmt_en_de, paper 4.2; WMT'14's 40k joint vocabulary shrunk to 10k to fit a 2-core time budget
    "wmt_en_de": Size(
        "convs2s_wmt_en_de",
        "[(512, 3)] * 10 + [(768, 3)] * 3 + [(2048, 1)] * 2",
        "[(512, 3)] * 10 + [(768, 3)] * 3 + [(2048, 1)] * 2",
        512,
        512,
        10_000,
    ),
}


def make_dictionary(size: int) -> Dictionary:
    """A joint dictionary of ``size`` entries (4 specials + words)."""
    d = Dictionary()
    for i in range(size - len(d)):
        d.add_symbol(f"w{i}")
    d.finalize(padding_factor=1)
    return d


def build_pair(
    size: Size, dictionary: Dictionary, dropout: float, seed: int = 1, target_dictionary: Optional[Dictionary] = None
):
    """(fconv, convs2s): stock fconv with fairseq's init, and its conversion; both in train mode. One joint
    dictionary unless ``target_dictionary`` is given."""
    torch.manual_seed(seed)
    args = argparse.Namespace(
        arch="fconv",
        encoder_layers=size.encoder_layers,
        decoder_layers=size.decoder_layers,
        encoder_embed_dim=size.embed_dim,
        decoder_embed_dim=size.embed_dim,
        decoder_out_embed_dim=size.out_embed_dim,
        dropout=dropout,
        max_source_positions=1024,
        max_target_positions=1024,
        share_input_output_embed=False,
    )
    fconv_base_architecture(args)
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=target_dictionary or dictionary)
    fconv = FConvModel.build_model(args, task)
    checkpoint = {"cfg": {"model": args, "task": {"_name": "translation"}}, "model": fconv.state_dict()}
    converted = convert_checkpoint(checkpoint, ConvS2SModel)
    convs2s = ConvS2SModel.build_model(argparse.Namespace(**vars(converted["cfg"]["model"])), task)
    convs2s.load_state_dict(converted["model"], strict=True)
    return fconv, convs2s


def random_sentences(dictionary: Dictionary, count: int, length: int, seed: int) -> List[torch.Tensor]:
    """``count`` sentences of ``length`` word ids (Zipf-like: frequent ids more likely), each ending in EOS."""
    g = torch.Generator().manual_seed(seed)
    words = len(dictionary) - dictionary.nspecial
    ranks = torch.arange(1, words + 1, dtype=torch.float)
    weights = 1.0 / ranks  # Zipf's law, as real text has
    out = []
    for _ in range(count):
        ids = torch.multinomial(weights, length, replacement=True, generator=g) + dictionary.nspecial
        out.append(torch.cat([ids, torch.tensor([dictionary.eos()])]))
    return out


def collate(sentences: List[torch.Tensor], pad: int, left_pad: bool) -> torch.Tensor:
    """B x T, padded on the left (sources, as fairseq does) or the right (targets)."""
    width = max(s.numel() for s in sentences)
    out = torch.full((len(sentences), width), pad, dtype=torch.long)
    for i, s in enumerate(sentences):
        if left_pad:
            out[i, width - s.numel() :] = s
        else:
            out[i, : s.numel()] = s
    return out
