"""A ConvS2S model as an exported folder holds it, on plain tensors: the encoder's full pass and the decoder's steps.

The folder (``python -m fairseq_convs2s.export``) holds ``config.json`` (the sizes, :data:`FORMAT`), ``model.pt``
(every weight with weight norm folded, named as in the plugin's state dict with ``weight`` for ``weight_v`` and
``weight_g``), the vocabularies one symbol a line in index order, and optionally ``sentencepiece.model``.

The encoder computes as the plugin's ``ConvS2SEncoder`` at inference, the decoder's steps are the plugin's fast path
itself (:func:`convs2s_runtime.step.decoder_step`); both on the same products (:class:`~.products.Product`).
"""

import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import FoldedAttention
from .products import Product, padded_conv_tbc
from .step import BlockStep, StepWeights, add_residual, decoder_step, fold_sources

FORMAT = "convs2s-runtime"
VERSION = 1
CONFIG, WEIGHTS, SENTENCEPIECE = "config.json", "model.pt", "sentencepiece.model"
VOCABULARIES = {"source": "source_vocabulary.txt", "target": "target_vocabulary.txt"}


class ModelDirError(ValueError):
    """The folder is not an export this runtime reads; the message says why."""


def read_config(model_dir: Path) -> dict:
    path = model_dir / CONFIG
    if not path.is_file():
        raise ModelDirError(f"{model_dir}: no {CONFIG}: not a model folder written by python -m fairseq_convs2s.export")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ModelDirError(f"{path}: not JSON ({e})") from None
    if config.get("format") != FORMAT or config.get("version") != VERSION:
        raise ModelDirError(
            f"{path}: format {config.get('format')!r} version {config.get('version')!r}, this runtime reads "
            f"{FORMAT!r} version {VERSION}"
        )
    return config


def read_vocabulary(model_dir: Path, side: str) -> List[str]:
    path = model_dir / VOCABULARIES[side]
    if not path.is_file():
        raise ModelDirError(f"{model_dir}: no {VOCABULARIES[side]}")
    return path.read_text(encoding="utf-8").split("\n")[:-1]


class DecodeState:
    """One batch's decoding state: the encoder output (one row per source still decoding), its folded sources, and
    each decoder block's window of its last k - 1 inputs (one row per hypothesis)."""

    def __init__(self, encoder_out: Tuple[Tensor, ...], folded: Optional[Dict[str, Tensor]], blocks: int):
        self.encoder_out = encoder_out  # keys, values (B' x S x f), padding mask (B' x S), scale (B' x 1 x 1)
        self.folded = folded
        self.windows: List[Optional[Tensor]] = [None] * blocks

    def expand(self, beam: int) -> None:
        """After the first step (one row per source): every source's row copied for its ``beam`` hypotheses."""
        self.windows = [w.repeat_interleave(beam, dim=0) if w is not None else None for w in self.windows]

    def keep_sources(self, kept: Tensor, beam: int) -> None:
        """Only the sources ``kept`` (indices into B') decode on, each with its ``beam`` rows."""
        self.encoder_out = tuple(t.index_select(0, kept) for t in self.encoder_out)
        if self.folded is not None:
            self.folded = {name: t.index_select(0, kept) for name, t in self.folded.items()}
        self.windows = [
            w.view(-1, beam, w.size(1))[kept].view(-1, w.size(1)) if w is not None else None for w in self.windows
        ]

    def reorder(self, rows: Tensor) -> None:
        """Hypothesis i now continues row ``rows[i]``."""
        self.windows = [w.index_select(0, rows) if w is not None else None for w in self.windows]


class Model:
    """The network of an exported folder: ``encode`` a batch of sources, then ``step`` its hypotheses."""

    def __init__(self, config: dict, weights: Dict[str, Tensor], dtype: torch.dtype, device: torch.device):
        self.config = config
        self.pad, self.eos = config["pad"], config["eos"]
        w = {name: t.to(device=device, dtype=dtype) for name, t in weights.items()}
        self.dtype, self.device = dtype, device
        enc, dec = config["encoder"], config["decoder"]
        self.encoder_layers, self.value_scale = enc["layers"], config["value_scale"]
        self.max_source_positions, self.max_target_positions = enc["max_positions"], dec["max_positions"]
        self.src_embed, self.src_positions = w["encoder.embed_tokens.weight"], w["encoder.embed_positions.weight"]
        self.encoder_in = _on_rows(_product(w, "encoder.input_projection"))
        self.encoder_out = _on_rows(_product(w, "encoder.output_projection"))
        blocks = [f"encoder.blocks.{i}" for i in range(len(enc["layers"]))]
        self.encoder_convs = [(w[f"{b}.conv.weight"], w[f"{b}.conv.bias"]) for b in blocks]
        self.encoder_residuals = [_on_rows(_product(w, f"{b}.residual_projection")) for b in blocks]
        self.tgt_embed, self.tgt_positions = w["decoder.embed_tokens.weight"], w["decoder.embed_positions.weight"]
        self.attending_layers = sum(dec["attention"])
        self.step_weights = _step_weights(w, dec, config["query_scale"])

    @classmethod
    def load(cls, model_dir: Path, dtype: torch.dtype = torch.float32, device="cpu") -> "Model":
        config = read_config(model_dir)
        try:
            weights = torch.load(model_dir / WEIGHTS, map_location="cpu", weights_only=True)
        except Exception as e:  # missing, truncated, not a torch file
            raise ModelDirError(f"{model_dir / WEIGHTS}: cannot be read ({type(e).__name__}: {e})") from None
        try:
            return cls(config, weights, dtype, torch.device(device))
        except (KeyError, TypeError, ValueError, IndexError) as e:  # (a weight or a setting missing, or malformed)
            raise ModelDirError(
                f"{model_dir}: {WEIGHTS} and {CONFIG} do not describe one model ({type(e).__name__}: {e}): "
                "export the checkpoint again"
            ) from None

    @property
    def vocab_size(self) -> int:
        return self.tgt_embed.size(0)

    def encode(self, src_tokens: Tensor) -> DecodeState:
        """src_tokens: B x S (left-padded, each ending in EOS) -> the state the steps start from."""
        mask = src_tokens.eq(self.pad)  # B x S, True at padding
        keep = (~mask).long()
        positions = torch.cumsum(keep, dim=1) * keep + self.pad  # fairseq's make_positions
        e = self.src_embed[src_tokens] + self.src_positions[positions]  # B x S x f
        x = self.encoder_in(e)  # B x S x d
        outputs = [x]
        for (_width, kernel, residual), (weight, bias), projection in zip(
            self.encoder_layers, self.encoder_convs, self.encoder_residuals
        ):
            x = x.masked_fill(mask.unsqueeze(-1), 0.0)
            x = padded_conv_tbc(x.transpose(0, 1), weight, bias, ((kernel - 1) // 2, kernel // 2))  # S x B x 2d
            x = F.glu(x, dim=2).transpose(0, 1)  # B x S x d
            x = add_residual(x, outputs, residual, projection)
            outputs.append(x)
        z = self.encoder_out(x)  # B x S x f
        z = z.masked_fill(mask.unsqueeze(-1), 0.0)
        values = (z + e) * self.value_scale
        m = keep.sum(dim=1).to(z.dtype).view(-1, 1, 1)  # B x 1 x 1: the non-pad source length
        encoder_out = (z, values, mask, m * torch.rsqrt(m))
        return DecodeState(encoder_out, fold_sources(self.step_weights, encoder_out), len(self.step_weights.blocks))

    def step(self, state: DecodeState, tokens: Tensor, step: int, need_attn: bool) -> Tuple[Tensor, Optional[Tensor]]:
        """tokens: N, each hypothesis's newest token (at position ``step``) -> the logits N x V (fp32, a fresh
        tensor) and the attention averaged over the attending layers, N x S (or None)."""
        g = self.tgt_embed[tokens] + self.tgt_positions[self.pad + step + 1]  # N x f
        x, attn_sum, state.windows = decoder_step(
            self.step_weights, g, state.windows, state.encoder_out, state.folded, need_attn
        )
        logits = self.step_weights.output_projection(x)  # N x V
        attn = attn_sum.float() / self.attending_layers if attn_sum is not None else None
        return (logits.float() if logits.dtype != torch.float32 else logits), attn


def _product(w: Dict[str, Tensor], name: str) -> Optional[Product]:
    """The product of a linear layer ``name`` (None where the folder has none: no residual projection)."""
    if f"{name}.weight" not in w:
        return None
    return Product.of_weight(w[f"{name}.weight"], w[f"{name}.bias"])


def _on_rows(product: Optional[Product]):
    """The product applied to the last dimension of a B x S x in tensor (None stays None)."""
    if product is None:
        return None
    return lambda x: product(x.reshape(-1, x.size(-1))).view(*x.shape[:-1], -1)


def _step_weights(w: Dict[str, Tensor], dec: dict, query_scale: float) -> StepWeights:
    blocks, attention_width = [], 0
    for i, ((_width, kernel, residual), attends) in enumerate(zip(dec["layers"], dec["attention"])):
        prefix = f"decoder.blocks.{i}"
        kernel_weight = w[f"{prefix}.conv.weight"]  # k x in x out
        flat_kernel = kernel_weight.permute(2, 0, 1).reshape(kernel_weight.size(2), -1)  # out x (k * in)
        conv = Product.of_weight(flat_kernel, w[f"{prefix}.conv.bias"])
        folded = query = output = None
        if attends:
            qw, ow = w[f"{prefix}.attention.query_projection.weight"], w[f"{prefix}.attention.output_projection.weight"]
            qb, ob = w[f"{prefix}.attention.query_projection.bias"], w[f"{prefix}.attention.output_projection.bias"]
            folded = FoldedAttention(qw.t().contiguous(), qb, ow.t().contiguous(), ob, query_scale)
            query, output = Product.of_weight(qw, qb), Product.of_weight(ow, ob)
            attention_width += ob.numel()
        residual_projection = _product(w, f"{prefix}.residual_projection")
        blocks.append(BlockStep(conv, kernel, residual, residual_projection, folded, query, output))
    return StepWeights(
        _product(w, "decoder.input_projection"),
        blocks,
        _product(w, "decoder.out_embed_projection"),
        _product(w, "decoder.output_projection"),
        attention_width,
    )
