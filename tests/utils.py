"""Small helpers shared by the tests: dictionaries, tiny models, generated parallel data."""

import argparse
import random
from types import SimpleNamespace
from typing import List, Optional

import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

import fairseq_convs2s  # noqa: F401  (registers the model)
from fairseq_convs2s.models.convs2s import ConvS2SModel

# every registered convs2s preset (a new one is tested without a list to add it to)
PRESETS = sorted(name for name, model in ARCH_MODEL_REGISTRY.items() if model is ConvS2SModel)


def make_dictionary(num_symbols: int = 20) -> Dictionary:
    d = Dictionary()
    for i in range(num_symbols):
        d.add_symbol(f"w{i}")
    d.finalize(padding_factor=1)
    return d


def shrink_spec(spec: str, width: int = 16) -> str:
    """The same blocks (count, kernel, width changes) at tiny widths: width w becomes w * width // 512."""
    from fairseq_convs2s.models.layer_spec import parse_layer_spec

    layers = parse_layer_spec(spec)
    tiny = [f"({max(4, layer.width * width // 512)}, {layer.kernel}, {layer.residual})" for layer in layers]
    return "[" + ", ".join(tiny) + "]"


def build_model(
    arch: str = "convs2s_iwslt_de_en", dictionary: Optional[Dictionary] = None, shrink: bool = True, **overrides
) -> ConvS2SModel:
    """A ConvS2S model of the given preset, shrunk to tiny widths unless ``shrink`` is False."""
    dictionary = dictionary or make_dictionary()
    args = argparse.Namespace(**overrides)
    ARCH_CONFIG_REGISTRY[arch](args)
    if shrink:
        for side in ("encoder", "decoder"):
            if f"{side}_layers" not in overrides:
                setattr(args, f"{side}_layers", shrink_spec(getattr(args, f"{side}_layers")))
            if f"{side}_embed_dim" not in overrides:
                setattr(args, f"{side}_embed_dim", 12)
        if "decoder_out_embed_dim" not in overrides:
            args.decoder_out_embed_dim = 12 if args.share_input_output_embed or args.share_all_embeddings else 10
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    return ConvS2SModel.build_model(args, task)


def random_batch(dictionary: Dictionary, lengths: List[int], seed: int = 0, left_pad: bool = True) -> torch.Tensor:
    """B x max(lengths) token ids ending in EOS, padded on the left (fairseq's source layout) or right."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        body = torch.randint(dictionary.nspecial, len(dictionary), (n - 1,), generator=g)
        rows.append(torch.cat([body, torch.tensor([dictionary.eos()])]))
    out = torch.full((len(lengths), max(lengths)), dictionary.pad(), dtype=torch.long)
    for i, row in enumerate(rows):
        if left_pad:
            out[i, out.size(1) - len(row) :] = row
        else:
            out[i, : len(row)] = row
    return out


def incremental_log_probs(model: ConvS2SModel, src: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """Decode ``prev`` one step at a time through the incremental path; B x T x V log-probs."""
    encoder_out = model.encoder(src, src_lengths=None)
    state: dict = {}
    steps = []
    for t in range(prev.size(1)):
        logits, _ = model.decoder(prev[:, : t + 1], encoder_out, incremental_state=state)
        steps.append(model.get_normalized_probs((logits, None), log_probs=True))
    return torch.cat(steps, dim=1)


def full_log_probs(model: ConvS2SModel, src: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    logits, _ = model(src, None, prev)
    return model.get_normalized_probs((logits, None), log_probs=True)


def beam_search(models, dictionary: Dictionary, src: torch.Tensor, ids: Optional[List[int]] = None, **generator_args):
    """fairseq's ``SequenceGenerator`` over ``models`` (more than one: an ensemble, as ``--path a.pt:b.pt``), beam 5
    and at most 12 tokens unless ``generator_args`` say otherwise; ``ids``: the sentences' dataset ids (what
    fairseq-generate puts in ``sample["id"]``). Per sentence, each hypothesis's tokens, score and attention
    (source x target)."""
    from fairseq.sequence_generator import SequenceGenerator

    generator_args = {"beam_size": 5, "max_len_b": 12, **generator_args}
    generator = SequenceGenerator(models, dictionary, **generator_args)
    sample = {"net_input": {"src_tokens": src, "src_lengths": src.ne(dictionary.pad()).sum(1)}}
    if ids is not None:
        sample["id"] = torch.tensor(ids)
    with torch.no_grad():
        hypos = generator.generate(models, sample)
    return [[(h["tokens"].tolist(), h["score"].item(), h["attention"]) for h in beam] for beam in hypos]


def seed_all(seed: int = 0) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def assert_close_to_scale(actual: torch.Tensor, expected: torch.Tensor, rel: float = 1e-5, msg=None) -> None:
    """``torch.testing.assert_close`` with tolerances that follow the size of what is compared: float rounding grows
    with the magnitude of the values a result is summed from, so each element may differ by ``rel`` times the
    largest magnitude in ``expected`` (and by ``rel`` of its own). A fixed absolute tolerance is too loose for small
    values and, for values that grow (weights scaled up, sums over a longer input), fails at random."""
    scale = expected.detach().abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=rel, atol=rel * scale, msg=msg)
