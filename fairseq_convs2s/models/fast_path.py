"""The decoder's fast path at inference: folded weights, packed products, the attention moved to the sources, and
the first step of beam search once per source. One switch turns it off (``ConvS2SDecoder.fast_path``).

The step itself is ``convs2s_runtime.step`` (torch only, shared with the fairseq-free runtime); this file builds
its weights from the decoder's modules and keeps what a batch's steps derive once in an :class:`InferenceState`,
an explicit object that the encoder creates at each inference forward and the encoder output carries (beam
search's reorders carry it along). Nothing is kept in module-level state.

Porting note (fconv): fconv runs every step through its modules, re-applying weight norm at each. Here a step
calls products whose weights were folded (and, on a CPU, packed for oneDNN) once per batch, or once for good
after ``make_generation_fast_``; a weight edited in place between two steps of one batch is seen from the next
batch on (between batches, as ever, at once).
"""

from typing import Dict, Optional

import torch
from torch import Tensor, nn

from convs2s_runtime.attention import FoldedAttention
from convs2s_runtime.products import is_compiling
from convs2s_runtime.step import BlockStep, StepWeights, fold_sources

from ..modules.dropout import Dropout
from ..modules.weight_norm import WeightNorm


class InferenceState:
    """What the decoding steps of one batch derive once: whether the decoder takes the fast path and its
    :class:`StepWeights` (decided and made at the first step), and the sources folded for its attention
    (``fold_sources``: one row per source, selected with the encoder output's rows). Made by the encoder at a
    forward with gradients off; None in training."""

    def __init__(self):
        self.decided = False  # whether the first step has looked at the decoder yet
        self.step_weights: Optional[StepWeights] = None  # None once decided: the steps run through the modules
        self.sources_folded = False
        self.folded_sources: Optional[Dict[str, Tensor]] = None  # None once folded: none attends, or over budget

    def weights_for(self, decoder: nn.Module) -> Optional[StepWeights]:
        """The decoder's step weights, or None where it cannot take the fast path (:func:`can_take_fast_path`)."""
        if not self.decided:
            self.step_weights = step_weights_of(decoder) if can_take_fast_path(decoder) else None
            self.decided = True
        return self.step_weights

    def sources_for(self, encoder_out) -> Optional[Dict[str, Tensor]]:
        """The folded sources for the step weights (None where none attends or over the budget)."""
        if not self.sources_folded:
            self.folded_sources = fold_sources(self.step_weights, encoder_out[:4])
            self.sources_folded = True
        return self.folded_sources

    def select_sources(self, rows: Tensor) -> "InferenceState":
        """The state for the sources ``rows`` (B'' indices into B'), as beam search drops finished sentences."""
        state = InferenceState()
        state.decided, state.step_weights, state.sources_folded = self.decided, self.step_weights, self.sources_folded
        if self.folded_sources is not None:
            state.folded_sources = {name: t.index_select(0, rows) for name, t in self.folded_sources.items()}
        return state


def can_take_fast_path(decoder: nn.Module) -> bool:
    """Whether the decoder's steps can run on folded products: its switch is on and no dropout is active (training,
    or fairseq's ``--retain-dropout``: the products have no dropout in them)."""
    if not decoder.fast_path:
        return False
    return not any(
        m.p > 0 and (m.training or m.apply_during_inference) for m in decoder.modules() if isinstance(m, Dropout)
    )


def _product(layer: nn.Module):
    """A layer's product at inference: a weight-normalized layer's folded one, a tied output projection itself."""
    return layer.product() if isinstance(layer, WeightNorm) else layer


def step_weights_of(decoder: nn.Module) -> StepWeights:
    """The decoder's weights for ``convs2s_runtime.step.decoder_step``, folded now (or kept, once folded in place)."""
    blocks, attention_width = [], 0
    for b in decoder.blocks:
        residual = _product(b.residual_projection) if b.residual_projection is not None else None
        folded = query = output = None
        if b.attention is not None:
            query, output = b.attention.query_projection, b.attention.output_projection
            folded = FoldedAttention(
                query.inference_form(False),
                query.bias,
                output.inference_form(False),
                output.bias,
                b.attention.query_scale,
            )
            query, output = _product(query), _product(output)
            attention_width += b.attention.output_projection.bias.numel()
        blocks.append(BlockStep(_product(b.conv), b.kernel_size, b.residual, residual, folded, query, output))
    return StepWeights(
        _product(decoder.input_projection),
        blocks,
        _product(decoder.out_embed_projection),
        _product(decoder.output_projection),
        attention_width,
    )


def first_step_copies(decoder: nn.Module, prev_output_tokens: Tensor, encoder_out, incremental_state) -> int:
    """G where this is the first step of beam search on the fast path and the G rows of each source hold the same
    prefix (G copies of EOS for every source), else 1.

    Porting note (fconv): fairseq's beam search starts with G identical hypotheses per source and fconv computes
    each; here the first step costs one row per source (the model's products at that step on B' rows, not
    B' x G), and its results are repeated for the G copies."""
    copies = encoder_out.hypotheses_per_source
    if (
        copies < 2
        or prev_output_tokens.size(1) != 1
        or prev_output_tokens.size(0) != copies * len(encoder_out.keys)
        or decoder.get_incremental_state(incremental_state, "conv_windows") is not None
    ):
        return 1
    tokens = prev_output_tokens.view(-1, copies)  # B' x G
    return copies if bool((tokens == tokens[:, :1]).all()) else 1


def fast_step_weights(decoder: nn.Module, encoder_out, incremental_state) -> Optional[StepWeights]:
    """The step weights for an incremental step at inference (the encoder made an :class:`InferenceState`) that
    the decoder can take on its folded products; None: the step runs through the modules."""
    if incremental_state is None or encoder_out is None or encoder_out.inference_state is None:
        return None
    if torch.is_grad_enabled() or is_compiling():
        return None  # (a compiled step traces the modules: packing has no graph form)
    return encoder_out.inference_state.weights_for(decoder)
