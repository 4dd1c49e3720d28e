"""One step of incremental decoding on folded weights: the decoder's fast path at inference.

A step takes the newest target position of every hypothesis (its embedding ``g``: B x f) and, per block, the
window of that block's last ``k - 1`` inputs, and gives the features of that position (B x out_embed) and the next
windows. Every product is a :class:`~convs2s_runtime.products.Product` with its weight folded (weight norm applied)
once, and each attending layer's W_d and W_c are moved to the sources (:mod:`convs2s_runtime.attention`), computed
once per batch by :func:`fold_sources`. Torch only: the plugin's decoder (``fairseq_convs2s/models/fast_path.py``
builds :class:`StepWeights` from its modules) and the fairseq-free runtime share this file.

Rows: B = B' * G decoder rows read B' sources, rows r*G .. r*G+G-1 source r (beam search's hypotheses).
"""

import math
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import FoldedAttention, attend, attend_folded, fold_source, target_scores

Linear = Callable[[Tensor], Tensor]  # N x in -> N x out

# The folded sources are two B' x S x d tensors per attending layer (at the wmt_en_de size about 90 KiB per source
# token in fp32); above this many bytes for a batch, the steps multiply by W_d and W_c instead.
FOLDED_SOURCES_BUDGET = 512 * 2**20


class BlockStep(NamedTuple):
    """One block's weights for a step."""

    conv: Linear  # B x k*in -> B x 2*out: the convolution over a window, the kernel as one matrix
    kernel_size: int
    residual: int  # the residual comes from this many outputs back (0: none)
    residual_projection: Optional[Linear]  # where the widths differ
    attention: Optional[FoldedAttention]  # None: the block does not attend
    query_projection: Optional[Linear]  # W_d and W_c as products, for steps on sources that are not folded
    output_projection: Optional[Linear]


class StepWeights(NamedTuple):
    """Every weight of a decoding step."""

    input_projection: Linear  # f -> d
    blocks: List[BlockStep]
    out_embed_projection: Linear  # d -> out_embed
    output_projection: Linear  # out_embed -> V, the logits (applied by the caller)
    attention_width: int  # the attending layers' widths summed (0: none attends)


def glu_conv_step(
    x: Tensor, window: Optional[Tensor], conv: Linear, kernel_size: int
) -> Tuple[Tensor, Optional[Tensor]]:
    """A causal block's convolution and GLU at one position: x: B x in, the new input; window: the previous
    k - 1 inputs flattened time-major, B x (k-1)*in (None at the first step, which sees the left zero padding).
    Returns the GLU output (B x out) and the next window: the convolution is one product with the kernel
    flattened to out x (k * in), over the window and the new input."""
    if kernel_size > 1:
        if window is None:
            window = x.new_zeros(x.size(0), (kernel_size - 1) * x.size(1))
        x = torch.cat([window, x], dim=1)  # B x k*in
        window = x[:, x.size(1) // kernel_size :]  # drop the oldest input
    return F.glu(conv(x), dim=1), window  # B x out


def add_residual(x: Tensor, outputs: Sequence[Tensor], residual: int, projection: Optional[Linear]) -> Tensor:
    """(x + the output ``residual`` back, projected where the widths differ) * sqrt(0.5) (paper 3.2, 3.4)."""
    if residual == 0:
        return x
    r = outputs[-residual]
    if projection is not None:
        r = projection(r)
    return (x + r) * math.sqrt(0.5)


def fold_sources(
    weights: StepWeights, encoder_out: Sequence[Tensor], budget: Optional[int] = None
) -> Optional[Dict[str, Tensor]]:
    """What the attending layers' steps take from the sources (:func:`attend_folded`): each layer's
    :func:`fold_source` tensors (``"{block}.keys"``, ``".score_bias"``, ``".values"``, each B' x ...) and the keys
    times the query scale (``"scaled_keys"``, B' x S x f) for the target embedding's part of the scores.
    encoder_out: keys, values (B' x S x f), padding mask (B' x S or None), conditional-input scale (B' x 1 x 1).
    None where no layer attends, or where the tensors would pass ``budget`` bytes (:data:`FOLDED_SOURCES_BUDGET`)."""
    if not weights.attention_width:
        return None
    budget = FOLDED_SOURCES_BUDGET if budget is None else budget
    keys = encoder_out[0]
    sources, src_len, embed_dim = keys.shape
    if sources * src_len * (2 * weights.attention_width + embed_dim) * keys.element_size() > budget:
        return None
    folded, query_scale = {}, 1.0
    for i, block in enumerate(weights.blocks):
        if block.attention is not None:
            folded[f"{i}.keys"], folded[f"{i}.score_bias"], folded[f"{i}.values"] = fold_source(
                block.attention, *encoder_out[:4]
            )
            query_scale = block.attention.query_scale  # (every layer has the decoder's one attention scaling)
    folded["scaled_keys"] = keys * query_scale
    return folded


def decoder_step(
    weights: StepWeights,
    g: Tensor,
    windows: List[Optional[Tensor]],
    encoder_out: Sequence[Tensor],
    folded_sources: Optional[Dict[str, Tensor]],
    need_attn: bool,
) -> Tuple[Tensor, Optional[Tensor], List[Optional[Tensor]]]:
    """One decoding step: g (B x f, the newest position's target embedding), the blocks' windows, the encoder's
    keys, values, padding mask and scale, and their :func:`fold_sources` (None: W_d and W_c at the step).
    Returns the features (B x out_embed), the attention summed over the attending layers (B x S, or None
    unless ``need_attn``) and the next windows."""
    x = weights.input_projection(g)  # B x d
    attn_sum: Optional[Tensor] = None
    if folded_sources is not None:
        target_part = target_scores(g, folded_sources["scaled_keys"])  # B' x G x S, every attending layer's
    outputs, next_windows = [x], []
    for i, block in enumerate(weights.blocks):
        y, window = glu_conv_step(x, windows[i], block.conv, block.kernel_size)  # B x d
        next_windows.append(window)
        if block.attention is not None:
            if folded_sources is not None:
                y, attn = attend_folded(
                    y,
                    target_part,
                    folded_sources[f"{i}.keys"],
                    folded_sources[f"{i}.score_bias"],
                    folded_sources[f"{i}.values"],
                    block.attention.output_bias,
                )
            else:
                scale = block.attention.query_scale
                y, attn = attend(y, g, *encoder_out[:4], block.query_projection, block.output_projection, scale)
            if need_attn:
                attn_sum = attn if attn_sum is None else attn_sum + attn  # B x S
        x = add_residual(y, outputs, block.residual, block.residual_projection)
        outputs.append(x)
    return weights.out_embed_projection(x), attn_sum, next_windows
