"""The ConvS2S decoder (paper 3.2-3.3): causal convolutional blocks with multi-step attention, fast incremental."""

from typing import Dict, List, Optional, Tuple

import torch
from fairseq import utils
from fairseq.data import Dictionary
from fairseq.models import FairseqIncrementalDecoder
from torch import Tensor, nn

from convs2s_runtime.step import StepWeights, decoder_step

from ..modules.attention import MultiStepAttention
from ..modules.conv_block import ConvBlock, build_blocks, run_block
from ..modules.dropout import Dropout
from ..modules.embedding import LearnedPositionalEmbedding, TiedOutputProjection, TokenEmbedding
from ..modules.weight_norm import WeightNormLinear, linear_std
from .encoder import ConvS2SEncoderOut
from .fast_path import fast_step_weights, first_step_copies
from .layer_spec import ConvLayer

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]


class ConvS2SDecoder(FairseqIncrementalDecoder):
    """Convolutional decoder: ``g = w + p``, causal blocks each followed (where chosen) by multi-step attention,
    then ``softmax(W_o h^L + b_o)`` through a linear map to the output embedding width.

    Incremental decoding (beam search) keeps, per block, a window of the last ``k - 1`` block inputs and applies
    the convolution as one matrix product per step (:meth:`_step`, through the modules, as the paper reads). At
    inference the steps take the fast path instead (``fast_path.py``: folded products, the attention moved to the
    sources, the first step once per source), unless ``fast_path`` is False or a dropout is active.
    """

    def __init__(
        self,
        dictionary: Dictionary,
        embed_dim: int,
        layers: List[ConvLayer],
        attention: List[bool],
        out_embed_dim: int,
        dropout: float,
        max_positions: int,
        share_embed: bool,
        attention_scaling: str,
        embed_dict: Optional[dict] = None,
        checkpoint_activations: bool = False,
        embed_tokens: Optional[nn.Embedding] = None,
    ):
        super().__init__(dictionary)
        self.checkpoint_activations = checkpoint_activations
        self.fast_path = True  # incremental steps at inference on folded products (fast_path.py)
        self.register_buffer("version", torch.tensor([2.0]))  # fconv's decoder.version, kept in the state dict
        padding_idx = dictionary.pad()
        self.dropout_module = Dropout(dropout, module_name=type(self).__name__)
        self.need_attn = True

        if embed_tokens is not None:  # the encoder's table (--share-all-embeddings)
            self.embed_tokens = embed_tokens
        else:
            self.embed_tokens = TokenEmbedding(len(dictionary), embed_dim, padding_idx)
            if embed_dict is not None:
                self.embed_tokens = utils.load_embedding(embed_dict, dictionary, self.embed_tokens)
        self.embed_positions = LearnedPositionalEmbedding(max_positions, embed_dim, padding_idx, "target")
        self.input_projection = WeightNormLinear(embed_dim, layers[0].width, std=linear_std(embed_dim, dropout))
        self.blocks = nn.ModuleList(build_blocks(layers, dropout, causal=True))
        for block, layer, attends in zip(self.blocks, layers, attention):
            if attends:
                block.attention = MultiStepAttention(layer.width, embed_dim, attention_scaling)
        # Porting note (fconv): fconv divides the summed attention by its number of layers, attending or not, so
        # with a partial --decoder-attention its "average" sums to (attending / layers) over the source. Here it is
        # the mean over the attending layers, a distribution; every preset attends in every layer, where the two
        # agree. Hard alignments (--print-alignment) are the same either way.
        self.num_attention_layers = sum(attention)

        self.out_embed_projection = WeightNormLinear(layers[-1].width, out_embed_dim, std=linear_std(layers[-1].width))
        if share_embed:
            if out_embed_dim != embed_dim:
                raise ValueError(
                    f"--share-input-output-embed needs --decoder-out-embed-dim ({out_embed_dim}) "
                    f"equal to --decoder-embed-dim ({embed_dim})"
                )
            self.output_projection = TiedOutputProjection(self.embed_tokens)
        else:
            self.output_projection = WeightNormLinear(
                out_embed_dim, len(dictionary), std=linear_std(out_embed_dim, dropout)
            )

    def forward(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Optional[ConvS2SEncoderOut] = None,
        incremental_state: Optional[IncrementalState] = None,
        features_only: bool = False,
        output_rows: Optional[Tensor] = None,
        **unused,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """
        prev_output_tokens: B x T, the target shifted right (starting with EOS); with ``incremental_state`` only
        the last column is new. Returns logits B x T x V (B x 1 x V incrementally; the features B x T x out_embed
        with ``features_only``) and the attention averaged over the attending layers, B x T x S (None while
        training or when not asked for).

        B may be G times the encoder's batch B': rows r*G .. r*G+G-1 then read source r (beam search's
        hypotheses; sequence-level training's candidates, which so share one encoder pass).

        output_rows (B x T bool, full passes only): project only these positions, returning their logits N x V in
        row-major order (N = ``output_rows.sum()``), what the plugin's criteria ask for with the target's
        non-padding positions (:meth:`output_layer`).
        """
        if output_rows is not None and (incremental_state is not None or output_rows.shape != prev_output_tokens.shape):
            raise ValueError(
                f"output_rows ({tuple(output_rows.shape)}) selects positions of a full pass over "
                f"prev_output_tokens ({tuple(prev_output_tokens.shape)}), not of an incremental step"
            )
        weights = fast_step_weights(self, encoder_out, incremental_state)
        if weights is not None:
            return self._fast_step(prev_output_tokens, encoder_out, incremental_state, weights, features_only)
        x, attn = self.extract_features(prev_output_tokens, encoder_out, incremental_state)
        if not features_only:
            x = self.output_layer(x, output_rows=output_rows)
        return x, attn

    def extract_features(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Optional[ConvS2SEncoderOut],
        incremental_state: Optional[IncrementalState] = None,
        **unused,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """The paper's decoder (3.2-3.3) over the whole target (or one incremental step, :meth:`_step`): features
        B x T x out_embed and the averaged attention B x T x S (None while training or when not asked for)."""
        if encoder_out is None:
            raise ValueError("the ConvS2S decoder attends to the source: it needs encoder_out")
        if incremental_state is not None:
            return self._step(prev_output_tokens, encoder_out, incremental_state)
        positions = self.embed_positions(prev_output_tokens)
        g = self.dropout_module(self.embed_tokens(prev_output_tokens) + positions)  # B x T x f, the target embedding
        x = self.input_projection(g)  # B x T x d

        keep_attn = self.need_attn and not self.training
        attn_sum: Optional[Tensor] = None
        outputs = [x]
        sources = encoder_out[:4]  # keys, values, padding mask, scale
        for block in self.blocks:
            x, attn = run_block(
                _decoder_block, block, x, tuple(outputs), g, sources, checkpointed=self.checkpoint_activations
            )  # B x T x d, B x T x S
            if keep_attn and attn is not None:
                attn_sum = attn if attn_sum is None else attn_sum + attn
            outputs.append(x)

        x = self.out_embed_projection(x)  # B x T x out_embed
        attn_avg = attn_sum / self.num_attention_layers if attn_sum is not None else None
        return x, attn_avg

    def _step(
        self, prev_output_tokens: Tensor, encoder_out: ConvS2SEncoderOut, incremental_state: IncrementalState
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """One step of incremental decoding through the modules, as the full pass computes the last position: the
        last column of prev_output_tokens (B x T) -> features B x 1 x out_embed and the averaged attention
        B x 1 x S (or None). Each block keeps the window of its last k - 1 inputs in ``incremental_state``."""
        bsz = prev_output_tokens.size(0)
        positions = self.embed_positions(prev_output_tokens, incremental_state)  # B x 1 x f
        g = self.dropout_module(self.embed_tokens(prev_output_tokens[:, -1:]) + positions).view(bsz, -1)  # B x f
        x = self.input_projection(g)  # B x d

        windows = dict(self.get_incremental_state(incremental_state, "conv_windows") or {})
        keep_attn = self.need_attn and not self.training
        attn_sum: Optional[Tensor] = None
        outputs = [x]
        for i, block in enumerate(self.blocks):
            y, windows[str(i)] = block.glu_conv_step(x, windows.get(str(i)))  # B x d
            if block.attention is not None:
                y, attn = block.attention(y, g, *encoder_out[:4])  # attn: B x S
                if keep_attn:
                    attn_sum = attn if attn_sum is None else attn_sum + attn
            x = block.add_residual(y, outputs)
            outputs.append(x)
        self.set_incremental_state(incremental_state, "conv_windows", windows)

        x = self.out_embed_projection(x)
        attn_avg = attn_sum.unsqueeze(1) / self.num_attention_layers if attn_sum is not None else None
        return x.unsqueeze(1), attn_avg  # B x 1 x out_embed, B x 1 x S

    def _fast_step(
        self,
        prev_output_tokens: Tensor,
        encoder_out: ConvS2SEncoderOut,
        incremental_state: IncrementalState,
        weights: StepWeights,
        features_only: bool,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """One step of incremental decoding on the fast path (``fast_path.py``, ``convs2s_runtime.step``): logits
        B x 1 x V (features with ``features_only``) and the averaged attention B x 1 x S (or None). At beam
        search's first step each source's G identical rows are computed once, then repeated (to float rounding
        what computing every row gives: products on fewer rows may take other kernels)."""
        copies = first_step_copies(self, prev_output_tokens, encoder_out, incremental_state)
        if copies > 1:
            prev_output_tokens = prev_output_tokens[::copies]  # B' x T
        bsz = prev_output_tokens.size(0)
        positions = self.embed_positions(prev_output_tokens, incremental_state)  # B x 1 x f
        g = (self.embed_tokens(prev_output_tokens[:, -1:]) + positions).view(bsz, -1)  # B x f
        saved = self.get_incremental_state(incremental_state, "conv_windows") or {}
        windows = [saved.get(str(i)) for i in range(len(self.blocks))]
        sources = encoder_out.inference_state.sources_for(encoder_out)
        keep_attn = self.need_attn and not self.training
        x, attn_sum, windows = decoder_step(weights, g, windows, encoder_out[:4], sources, keep_attn)
        out = x if features_only else self.output_layer(x, step_weights=weights)  # B x (V | out_embed)
        attn = attn_sum / self.num_attention_layers if attn_sum is not None else None  # B x S
        if copies > 1:
            out = out.repeat_interleave(copies, dim=0)
            attn = attn.repeat_interleave(copies, dim=0) if attn is not None else None
            windows = [w.repeat_interleave(copies, dim=0) if w is not None else None for w in windows]
        self.set_incremental_state(incremental_state, "conv_windows", {str(i): w for i, w in enumerate(windows)})
        return out.unsqueeze(1), attn.unsqueeze(1) if attn is not None else None

    def output_features(self, features: Tensor, output_rows: Optional[Tensor] = None) -> Tensor:
        """What the vocabulary projection W_o takes: the features (B x T x out_embed) after dropout, or with
        ``output_rows`` (B x T bool) those positions alone, N x out_embed (the mask drawn over all of B x T, so
        the random stream is the same either way)."""
        x = self.dropout_module(features)
        return x if output_rows is None else x[output_rows]

    def output_layer(
        self,
        features: Tensor,
        output_rows: Optional[Tensor] = None,
        step_weights: Optional[StepWeights] = None,
        **unused,
    ) -> Tensor:
        """... x out_embed -> ... x V logits: dropout, then W_o; with ``output_rows`` (B x T bool) the logits of
        those positions alone, N x V; on the fast path (``step_weights``) its product of W_o.

        Porting note (fconv): fconv projects every position of the batch to the vocabulary, the target's padding
        too, which its criterion then ignores. Given the positions that count (``output_rows``: the plugin's
        criteria pass the target's non-padding), only those rows are projected: the largest product of a
        training update and the loss over its N x V logits shrink by the batch's share of padding, with the same
        values (BENCHMARKS.md, "The speed-ups").
        """
        if step_weights is not None:
            return step_weights.output_projection(features)  # (no dropout is active on the fast path)
        return self.output_projection(self.output_features(features, output_rows))  # (B x T | N) x V

    def reorder_incremental_state_scripting(self, incremental_state: IncrementalState, new_order: Tensor) -> None:
        """What fairseq's beam search calls at every step. Porting note (fconv): fairseq's version walks every
        submodule for one with state to reorder (fconv's convolutions keep their own); here only the decoder
        keeps state, so the walk, a few percent of a small model's step, is skipped."""
        self.reorder_incremental_state(incremental_state, new_order)

    def reorder_incremental_state(self, incremental_state: IncrementalState, new_order: Tensor) -> None:
        """Beam search reordered or pruned hypotheses: select the same rows of every cached window."""
        windows = self.get_incremental_state(incremental_state, "conv_windows")
        if windows is None:
            return
        reordered = {k: (v.index_select(0, new_order) if v is not None else None) for k, v in windows.items()}
        self.set_incremental_state(incremental_state, "conv_windows", reordered)

    def max_positions(self) -> int:
        return self.embed_positions.max_positions

    def make_generation_fast_(self, need_attn: bool = False, **kwargs) -> None:
        """Only compute the averaged attention when it is asked for (``--print-alignment``)."""
        self.need_attn = need_attn


def _decoder_block(
    block: ConvBlock, x: Tensor, outputs: Tuple[Tensor, ...], g: Tensor, sources: tuple
) -> Tuple[Tensor, Optional[Tensor]]:
    """One decoder block of a full pass: x (B x T x d_in, the last output), g (B x T x f, the target embedding),
    sources (the encoder's keys, values, padding mask, scale) -> B x T x d and its attention B x T x S (None
    where the block does not attend)."""
    y = block.glu_conv(x)  # B x T x d
    attn = None
    if block.attention is not None:
        y, attn = block.attention(y, g, *sources)
    return block.add_residual(y, outputs), attn
