"""The ConvS2S decoder (paper 3.2-3.3): causal convolutional blocks with multi-step attention, fast incremental."""

from typing import Callable, Dict, List, NamedTuple, Optional, Tuple, Union

import torch
from fairseq import utils
from fairseq.data import Dictionary
from fairseq.models import FairseqIncrementalDecoder
from torch import Tensor, nn

from ..criterions.fused_label_smoothed import (
    ProjectedLoss,
    ProjectedLossTargets,
    loss_of_logits,
    projected_label_smoothed_loss,
    projects_in_chunks,
)
from ..modules.attention import (
    FoldedAttention,
    MultiStepAttention,
    attend,
    attend_folded,
    fold_source,
    target_scores,
)
from ..modules.conv_block import ConvBlock, build_blocks, run_block
from ..modules.dropout import Dropout
from ..modules.embedding import LearnedPositionalEmbedding, TokenEmbedding
from ..modules.weight_norm import (
    WeightNormLinear,
    current_inference_pass,
    folded_product,
    inference_weight,
    is_compiling,
    linear_std,
)
from .encoder import ConvS2SEncoderOut
from .layer_spec import ConvLayer

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]


class ConvS2SDecoder(FairseqIncrementalDecoder):
    """Convolutional decoder: ``g = w + p``, causal blocks each followed (where chosen) by multi-step attention,
    then ``softmax(W_o h^L + b_o)`` through a linear map to the output embedding width.

    Incremental decoding (beam search) keeps, per block, a window of the last ``k - 1`` block inputs and applies
    the convolution as one matrix product per step; the encoder's keys and values come in once per source. At
    inference a step calls every product with its weights folded for the pass (``_folded_products``), not
    through the modules, and the attention's W_d and W_c have been applied to the sources once for the batch
    (``_folded_sources``).
    """

    # incremental steps at inference call the folded products (False: through the modules, as in training)
    use_folded_products = True
    # ... and their attention has W_d and W_c moved to the sources (``FoldedAttention``) while the tensors that
    # takes stay under this many MiB for the batch; past it (0: always, as benchmarks.ablations'
    # ``per-step-attention`` times it), both products at every step, folded for the pass
    folded_attention_budget_mib = 512
    # the first step of beam search computes each source's hypotheses once (False: every row, as fconv does)
    first_step_once_per_source = True
    # forward(..., output_rows=mask) projects only the selected positions (fused_label_smoothed, sequence_risk)
    projects_selected_rows = True
    # forward(..., output_rows=mask, loss_targets=...) returns their loss instead (fused_label_smoothed)
    scores_projected_rows = True

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
    ):
        super().__init__(dictionary)
        self.checkpoint_activations = checkpoint_activations
        self.register_buffer("version", torch.tensor([2.0]))  # the state-dict format; see upgrade_state_dict_named
        padding_idx = dictionary.pad()
        self.dropout_module = Dropout(dropout, module_name=type(self).__name__)
        self.need_attn = True

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
            # a plain linear whose weight is the input lookup table (no weight norm on lookup tables)
            self.output_projection = nn.Linear(out_embed_dim, len(dictionary))
            self.output_projection.weight = self.embed_tokens.weight
            nn.init.zeros_(self.output_projection.bias)
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
        loss_targets: Optional[ProjectedLossTargets] = None,
        **unused,
    ) -> Tuple[Union[Tensor, ProjectedLoss], Optional[Tensor]]:
        """
        prev_output_tokens: B x T, the target shifted right (starting with EOS); with ``incremental_state`` only
        the last column is new. Returns logits B x T x V (B x 1 x V incrementally) and the attention averaged over
        the attending layers, B x T x S (None while training or when not asked for).

        B may be G times the encoder's batch B': rows r*G .. r*G+G-1 then read source r (beam search's
        hypotheses; sequence-level training's candidates, which so share one encoder pass).

        output_rows (B x T bool, full passes only): project only these positions, returning their logits N x V in
        row-major order (N = ``output_rows.sum()``), what the plugin's criteria ask for with the target's
        non-padding positions.

        loss_targets (with output_rows): instead of those logits, their label-smoothed loss summed, a
        :class:`ProjectedLoss` (``--criterion fused_label_smoothed_cross_entropy`` asks for it): on a CPU taken a
        chunk of rows at a time, the logits never stored whole (:meth:`score_rows`).
        """
        if loss_targets is not None and (output_rows is None or features_only):
            raise ValueError("loss_targets scores the output_rows positions: pass output_rows, not features_only")
        if output_rows is not None and (incremental_state is not None or output_rows.shape != prev_output_tokens.shape):
            raise ValueError(
                f"output_rows ({tuple(output_rows.shape)}) selects positions of a full pass over "
                f"prev_output_tokens ({tuple(prev_output_tokens.shape)}), not of an incremental step"
            )
        copies = self._copies_at_first_step(prev_output_tokens, encoder_out, incremental_state)
        if copies > 1:
            return self._first_step_once_per_source(
                prev_output_tokens, encoder_out, incremental_state, copies, features_only
            )
        x, attn = self.extract_features(prev_output_tokens, encoder_out, incremental_state)
        if loss_targets is not None:
            return self.score_rows(x, output_rows, loss_targets), attn
        if not features_only:
            x = self.output_layer(x, output_rows=output_rows)
        return x, attn

    def _copies_at_first_step(
        self, prev_output_tokens: Tensor, encoder_out: Optional[ConvS2SEncoderOut], incremental_state
    ) -> int:
        """G where this is the first step of incremental decoding at inference and the G rows of each source hold
        the same prefix (beam search's first step: G copies of EOS for every source), else 1."""
        if incremental_state is None or encoder_out is None or not self.first_step_once_per_source:
            return 1
        copies = encoder_out.hypotheses_per_source
        if (
            copies < 2
            or prev_output_tokens.size(1) != 1
            or prev_output_tokens.size(0) != copies * len(encoder_out.keys)
        ):
            return 1
        if self._folded_products() is None:
            return 1  # (with a dropout active the copies would not compute the same)
        if self.get_incremental_state(incremental_state, "conv_windows") is not None:
            return 1
        tokens = prev_output_tokens.view(-1, copies)  # B' x G
        return copies if bool((tokens == tokens[:, :1]).all()) else 1

    def _first_step_once_per_source(
        self,
        prev_output_tokens: Tensor,
        encoder_out: ConvS2SEncoderOut,
        incremental_state: IncrementalState,
        copies: int,
        features_only: bool,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """The first step on one row per source, its logits (B' x 1 x V; the features with ``features_only``),
        attention and conv windows then repeated for the G copies: B x 1 x V and B x 1 x S, what computing every
        row gives (to float rounding: products on fewer rows may take other kernels).

        Porting note (fconv): fairseq's beam search starts with G identical hypotheses per source and fconv
        computes each; here the first step costs one row per source (the model's products at that step on
        B' rows, not B' x G)."""
        one_each = encoder_out._replace(hypotheses_per_source=1)
        x, attn = self.extract_features(prev_output_tokens[::copies], one_each, incremental_state)
        windows = self.get_incremental_state(incremental_state, "conv_windows")
        repeated = {k: v.repeat_interleave(copies, dim=0) if v is not None else None for k, v in windows.items()}
        self.set_incremental_state(incremental_state, "conv_windows", repeated)
        out = x if features_only else self.output_layer(x)  # B' x 1 x (V | out_embed)
        attn = attn.repeat_interleave(copies, dim=0) if attn is not None else None
        return out.repeat_interleave(copies, dim=0), attn

    def extract_features(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Optional[ConvS2SEncoderOut],
        incremental_state: Optional[IncrementalState] = None,
        **unused,
    ) -> Tuple[Tensor, Optional[Tensor]]:
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
        """One step of incremental decoding, computed on B x C rows: the last column of prev_output_tokens
        (B x T) -> features B x 1 x out_embed and the averaged attention B x 1 x S (or None)."""
        bsz = prev_output_tokens.size(0)
        folded = self._folded_products()
        positions = self.embed_positions(prev_output_tokens, incremental_state)  # B x 1 x f
        g = (self.embed_tokens(prev_output_tokens[:, -1:]) + positions).view(bsz, -1)  # B x f
        if folded is None:
            g = self.dropout_module(g)
            x = self.input_projection(g)  # B x d
        else:
            x = folded.input_projection(g)

        windows = self.get_incremental_state(incremental_state, "conv_windows")
        windows = dict(windows) if windows is not None else {}
        keep_attn = self.need_attn and not self.training
        attn_sum: Optional[Tensor] = None
        sources = self._folded_sources(encoder_out, folded) if folded is not None else None
        if sources is not None:
            target_part = target_scores(g, sources["scaled_keys"])  # B' x G x S, every attending layer's
        outputs = [x]
        for i, block in enumerate(self.blocks):
            products = folded.blocks[i] if folded is not None else _THROUGH_MODULES
            y, windows[str(i)] = block.glu_conv_step(x, windows.get(str(i)), products.conv)  # B x d
            if block.attention is not None:
                if sources is not None:
                    y, attn = attend_folded(
                        y,
                        target_part,
                        sources[f"{i}.keys"],
                        sources[f"{i}.score_bias"],
                        sources[f"{i}.values"],
                        products.attention.output_bias,
                    )
                elif folded is not None:
                    scale = block.attention.query_scale
                    y, attn = attend(y, g, *encoder_out[:4], products.query, products.output, scale)
                else:
                    y, attn = block.attention(y, g, *encoder_out[:4])  # attn: B x S
                if keep_attn:
                    attn_sum = attn if attn_sum is None else attn_sum + attn
            x = block.add_residual(y, outputs, products.residual)
            outputs.append(x)
        self.set_incremental_state(incremental_state, "conv_windows", windows)

        x = (folded.out_embed_projection if folded is not None else self.out_embed_projection)(x)
        attn_avg = attn_sum.unsqueeze(1) / self.num_attention_layers if attn_sum is not None else None
        return x.unsqueeze(1), attn_avg  # B x 1 x out_embed, B x 1 x S

    def output_layer(self, features: Tensor, output_rows: Optional[Tensor] = None, **unused) -> Tensor:
        """B x T x out_embed -> B x T x V logits: dropout, then W_o (at inference, its folded product); with
        ``output_rows`` (B x T bool) the logits of those positions alone, N x V.

        Porting note: fconv projects every position of the batch to the vocabulary, the target's padding too,
        which its criterion then ignores. Given the positions that count (``output_rows``: the plugin's criteria
        pass the target's non-padding), only those rows are projected: the largest product of a training update
        and the loss over its N x V logits shrink by the batch's share of padding (13% of the target positions
        of the first 16 Multi30k batches of ``--max-tokens 4000``, ``benchmarks.real_batches``), with the same
        values. Dropout still draws its mask over all of B x T, so the random stream, and so training, is the
        same as without the selection.
        """
        folded = self._folded_products()
        if folded is None:
            x = self.dropout_module(features)  # B x T x out_embed
            return self.output_projection(x if output_rows is None else x[output_rows])  # (B x T | N) x V
        rows = features.reshape(-1, features.size(-1)) if output_rows is None else features[output_rows]
        logits = folded.output_projection(rows)  # (B*T | N) x V
        return logits if output_rows is not None else logits.view(*features.shape[:-1], -1)

    def score_rows(self, features: Tensor, output_rows: Tensor, targets: ProjectedLossTargets) -> ProjectedLoss:
        """The summed label-smoothed loss of the logits ``output_layer(features, output_rows)``; features:
        B x T x out_embed, output_rows: B x T bool, ``targets.target``: the N targets of those positions.

        Porting note (fconv): fconv's logits feed fairseq's criterion, which keeps the N x V log-probabilities
        and their gradient. Here, on a CPU in fp32, the projection and the loss run a chunk of rows
        at a time (``projected_label_smoothed_loss``), their gradients taken in the same pass: the same
        products and values, without the two N x V tensors. Elsewhere the logits come from ``output_layer``
        and the loss from them, in one fused pass.
        """
        if projects_in_chunks(features):
            x = self.dropout_module(features)[output_rows]  # N x out_embed (the mask drawn over all of B x T)
            projection = self.output_projection
            return projected_label_smoothed_loss(x, projection.weight, projection.bias, targets)
        return loss_of_logits(self.output_layer(features, output_rows=output_rows), targets)

    def _folded_products(self) -> Optional["_FoldedProducts"]:
        """The decoder's products with the weights folded for the current inference pass, or None where they
        cannot stand for the layers: gradients on, a dropout active (training, or fairseq's --retain-dropout),
        or turned off (``use_folded_products``).

        Porting note: fconv runs every step through its modules. Here a step calls the products directly,
        looked up once per pass (an encoder forward), so a weight edited in place between two steps of one
        batch is seen from the next batch on (between batches, as ever, at once)."""
        if torch.is_grad_enabled() or not self.use_folded_products or is_compiling():
            return None  # (a compiled step folds inside its graph, through the modules)
        inference_pass = current_inference_pass()
        cached = self.__dict__.get("_folded")
        if cached is None or cached[0] != inference_pass:
            active_dropout = any(
                m.p > 0 and (m.training or m.apply_during_inference) for m in self.modules() if isinstance(m, Dropout)
            )
            cached = (inference_pass, None if active_dropout else _FoldedProducts.of(self))
            self.__dict__["_folded"] = cached
        return cached[1]

    def _folded_sources(self, encoder_out: ConvS2SEncoderOut, folded: "_FoldedProducts") -> Optional[Dict[str, Tensor]]:
        """What the attending layers' steps take from the sources (``attend_folded``): each layer's
        ``fold_source`` tensors (``"{block}.keys"``, ``".score_bias"``, ``".values"``) and the keys times the
        query scale (``"scaled_keys"``, B' x S x f) for the target embedding's part of the scores. Derived at the
        first step into the encoder output's ``step_cache``, which beam search's reorders carry along (fresh at
        every step for an encoder output without one). None where no layer attends, or where these tensors
        would pass ``folded_attention_budget_mib`` (two B' x S x d per attending layer: at the wmt_en_de size
        about 90 KiB per source token in fp32): the steps then project through W_d and W_c."""
        if not folded.attention_width:
            return None
        cache = encoder_out.step_cache if encoder_out.step_cache is not None else {}
        if "scaled_keys" not in cache:
            sources, src_len, embed_dim = encoder_out.keys.shape
            size = sources * src_len * (2 * folded.attention_width + embed_dim) * encoder_out.keys.element_size()
            if size > self.folded_attention_budget_mib * 2**20:
                return None
            tensors, query_scale = encoder_out[:4], 1.0
            for i, products in enumerate(folded.blocks):
                if products.attention is not None:
                    keys, score_bias, values = fold_source(products.attention, *tensors)
                    cache[f"{i}.keys"], cache[f"{i}.score_bias"], cache[f"{i}.values"] = keys, score_bias, values
                    query_scale = products.attention.query_scale
            # every layer has the decoder's one attention scaling
            cache["scaled_keys"] = encoder_out.keys * query_scale
        return cache

    def __getstate__(self):
        # copies and pickles leave the folded products behind (oneDNN's packed tensors have no storage)
        return {k: v for k, v in super().__getstate__().items() if k != "_folded"}

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


class _BlockProducts(NamedTuple):
    """One block's products for a pass (None: the block's own modules)."""

    conv: Optional[Callable[[Tensor], Tensor]]  # B x k*in -> B x 2*out, the convolution over a window
    residual: Optional[Callable[[Tensor], Tensor]]
    attention: Optional[FoldedAttention]  # W_d and W_c, moved to the sources (None: the block does not attend)
    query: Optional[Callable[[Tensor], Tensor]]  # W_d and W_c as products at every step
    output: Optional[Callable[[Tensor], Tensor]]


_THROUGH_MODULES = _BlockProducts(None, None, None, None, None)  # every block product by the block's own modules


class _FoldedProducts(NamedTuple):
    """Every product of a decoding step, as ``folded_product`` makes them for one inference pass."""

    input_projection: Callable[[Tensor], Tensor]
    blocks: List[_BlockProducts]
    out_embed_projection: Callable[[Tensor], Tensor]
    output_projection: Callable[[Tensor], Tensor]
    attention_width: int  # the attending layers' widths summed (0: none attends)

    @classmethod
    def of(cls, decoder: "ConvS2SDecoder") -> "_FoldedProducts":
        blocks, attention_width = [], 0
        for b in decoder.blocks:
            residual = folded_product(b.residual_projection) if b.residual_projection is not None else None
            attention = query_product = output_product = None
            if b.attention is not None:
                query, output = b.attention.query_projection, b.attention.output_projection
                attention = FoldedAttention(
                    inference_weight(query, False),
                    query.bias,
                    inference_weight(output, False),
                    output.bias,
                    b.attention.query_scale,
                )
                query_product, output_product = folded_product(query), folded_product(output)
                attention_width += output.bias.numel()
            blocks.append(_BlockProducts(folded_product(b.conv), residual, attention, query_product, output_product))
        return cls(
            folded_product(decoder.input_projection),
            blocks,
            folded_product(decoder.out_embed_projection),
            folded_product(decoder.output_projection),
            attention_width,
        )
