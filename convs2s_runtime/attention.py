"""Multi-step attention (paper 3.3) as tensor functions: the paper's form, and the decoding step's form with W_d and
W_c moved to the sources. Torch only: the plugin's ``MultiStepAttention`` and the fairseq-free runtime share them.

    d_i = (W_d h_i + b_d + g_i) * s;  a_ij = softmax_j(d_i . z_j);  c_i = sum_j a_ij v_j * m sqrt(1/m);
    h_i <- (h_i + W_c c_i + b_c) * sqrt(0.5)

with z the keys (the last encoder layer), v the values (z + e), s the query scale (fconv's sqrt(0.5), or 1).
"""

import math
from typing import Callable, NamedTuple, Optional, Tuple

import torch
from torch import Tensor


def attend(
    h: Tensor,
    target_embedding: Tensor,
    keys: Tensor,
    values: Tensor,
    key_padding_mask: Optional[Tensor],
    conditional_input_scale: Tensor,
    query_projection: Callable[[Tensor], Tensor],
    output_projection: Callable[[Tensor], Tensor],
    query_scale: float,
) -> Tuple[Tensor, Tensor]:
    """Multi-step attention of one layer, its projections W_d and W_c given (the layer's modules, or products).

    h: B x T x d (the GLU output of this layer), or B x d for one decoding step; target_embedding g: the same
    with f; keys z: B' x S x f; values (z + e): B' x S x f; key_padding_mask: B' x S (True at pads) or None;
    conditional_input_scale: B' x 1 x 1, m * sqrt(1/m) with m the non-pad source length.
    B = B' * G: rows r * G .. r * G + G - 1 (beam search's hypotheses of one sentence) attend to source r.
    Returns the new h (shaped as h) and the attention weights (B x T x S, or B x S).
    """
    residual = h
    sources, src_len = keys.size(0), keys.size(1)
    d = (query_projection(h) + target_embedding) * query_scale  # B x T x f
    d = d.view(sources, -1, d.size(-1))  # B' x G*T x f: a source's G hypotheses in one product
    scores = torch.bmm(d, keys.transpose(1, 2))  # B' x G*T x S
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask.unsqueeze(1), float("-inf"))
    attn = attention_weights(scores)
    conditional_input = torch.bmm(attn, values) * conditional_input_scale  # B' x G*T x f
    conditional_input = conditional_input.view(*h.shape[:-1], -1)  # B x T x f
    h = (output_projection(conditional_input) + residual) * math.sqrt(0.5)  # B x T x d
    return h, attn.view(*h.shape[:-1], src_len)


def attention_weights(scores: Tensor) -> Tensor:
    """softmax over the source positions (the last dimension), taken in fp32 (for fp16/bf16) and returned in the
    scores' dtype."""
    attn = scores.softmax(dim=-1, dtype=torch.float32)
    return attn.type_as(scores) if attn.dtype != scores.dtype else attn


class FoldedAttention(NamedTuple):
    """One layer's multi-step attention for decoding steps, with W_d and W_c moved from the step to the source
    (:func:`fold_source`, :func:`attend_folded`).

    Porting note (fconv): fconv projects every hypothesis's state through W_d and its conditional input through
    W_c at every step, two d x f products per attending layer. Both are linear, so

        d_i . z_j = (h_i . z_j W_d + z_j . b_d + g_i . z_j) * s,     W_c sum_j a_ij v_j = sum_j a_ij (v_j W_c^T),

    and here ``z W_d`` and ``v W_c^T`` are computed once per source and layer, which leaves a step only the two
    products with the S source positions it takes anyway (and ``g . z``, shared by every layer). The values are
    those of the layers' products, summed in another order: equal to the modules' to float rounding.
    """

    query_weight_t: Tensor  # W_d^T: d x f
    query_bias: Tensor  # b_d: f
    output_weight_t: Tensor  # W_c^T: f x d
    output_bias: Tensor  # b_c: d
    query_scale: float


def fold_source(
    attention: FoldedAttention,
    keys: Tensor,
    values: Tensor,
    key_padding_mask: Optional[Tensor],
    conditional_input_scale: Tensor,
) -> Tuple[Tensor, Tensor, Tensor]:
    """A layer's keys, score bias and values for :func:`attend_folded`, from the encoder output (shapes as in
    :func:`attend`): ``s z W_d`` (B' x S x d), ``s z . b_d`` with -inf at padding (B' x 1 x S), and
    ``(z + e) W_c^T`` times the conditional-input scale (B' x S x d)."""
    s = attention.query_scale
    folded_keys = torch.matmul(keys, attention.query_weight_t.t()).mul_(s)  # B' x S x f @ f x d
    score_bias = torch.matmul(keys, attention.query_bias).mul_(s).unsqueeze(1)  # B' x 1 x S
    if key_padding_mask is not None:
        score_bias = score_bias.masked_fill_(key_padding_mask.unsqueeze(1), float("-inf"))
    folded_values = torch.matmul(values, attention.output_weight_t).mul_(conditional_input_scale)  # B' x S x d
    return folded_keys, score_bias, folded_values


def target_scores(target_embedding: Tensor, scaled_keys: Tensor) -> Tensor:
    """The target embedding's part of every layer's scores at a step: g: B x f, scaled_keys s z: B' x S x f ->
    B' x G x S (B = B' * G)."""
    g = target_embedding.view(scaled_keys.size(0), -1, target_embedding.size(-1))  # B' x G x f
    return torch.bmm(g, scaled_keys.transpose(1, 2))


def attend_folded(
    h: Tensor,
    target_part: Tensor,
    folded_keys: Tensor,
    score_bias: Tensor,
    folded_values: Tensor,
    output_bias: Tensor,
) -> Tuple[Tensor, Tensor]:
    """One decoding step of a layer's attention on its :func:`fold_source` tensors: h: B x d (the GLU
    output), target_part: :func:`target_scores` (B' x G x S). Returns the new h (B x d) and the attention
    weights (B x S), as :func:`attend` returns them."""
    sources = folded_keys.size(0)
    scores = torch.baddbmm(score_bias, h.view(sources, -1, h.size(-1)), folded_keys.transpose(1, 2))  # B' x G x S
    scores = scores.add_(target_part)
    attn = attention_weights(scores)
    out = torch.baddbmm(output_bias, attn, folded_values).view_as(h)  # B' x G x d -> B x d
    return (out + h) * math.sqrt(0.5), attn.view(h.size(0), -1)
