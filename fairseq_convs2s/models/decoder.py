"""The ConvS2S decoder (paper 3.2-3.3): causal convolutional blocks with multi-step attention, fast incremental."""

from typing import Dict, List, Optional, Tuple

import torch
from fairseq import utils
from fairseq.data import Dictionary
from fairseq.models import FairseqIncrementalDecoder
from fairseq.modules import FairseqDropout
from torch import Tensor, nn

from ..modules.attention import MultiStepAttention
from ..modules.conv_block import build_blocks
from ..modules.embedding import LearnedPositionalEmbedding, TokenEmbedding
from ..modules.weight_norm import WeightNormLinear, linear_std
from .encoder import ConvS2SEncoderOut
from .layer_spec import ConvLayer

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]


class ConvS2SDecoder(FairseqIncrementalDecoder):
    """Convolutional decoder: ``g = w + p``, causal blocks each followed (where chosen) by multi-step attention,
    then ``softmax(W_o h^L + b_o)`` through a linear map to the output embedding width.

    Incremental decoding (beam search) keeps, per block, a window of the last ``k - 1`` block inputs and applies
    the convolution as one matrix product per step; the encoder's keys and values come in once per source.
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
    ):
        super().__init__(dictionary)
        self.register_buffer("version", torch.tensor([2.0]))  # the state-dict format; see upgrade_state_dict_named
        padding_idx = dictionary.pad()
        self.dropout_module = FairseqDropout(dropout, module_name=type(self).__name__)
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
        **unused,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """
        prev_output_tokens: B x T, the target shifted right (starting with EOS); with ``incremental_state`` only
        the last column is new. Returns logits B x T x V (B x 1 x V incrementally) and the attention averaged over
        the attending layers, B x T x S (None while training or when not asked for).
        """
        x, attn = self.extract_features(prev_output_tokens, encoder_out, incremental_state)
        if not features_only:
            x = self.output_layer(x)
        return x, attn

    def extract_features(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Optional[ConvS2SEncoderOut],
        incremental_state: Optional[IncrementalState] = None,
        **unused,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        if encoder_out is None:
            raise ValueError("the ConvS2S decoder attends to the source: it needs encoder_out")
        incremental = incremental_state is not None
        positions = self.embed_positions(prev_output_tokens, incremental_state)
        tokens = prev_output_tokens[:, -1:] if incremental else prev_output_tokens
        g = self.dropout_module(self.embed_tokens(tokens) + positions)  # B x T x f, the target embedding
        x = self.input_projection(g)  # B x T x d

        windows = self._get_windows(incremental_state) if incremental else {}
        keep_attn = self.need_attn and not self.training
        attn_sum: Optional[Tensor] = None
        outputs = [x]
        for i, block in enumerate(self.blocks):
            if incremental:
                y, windows[str(i)] = block.glu_conv_step(x, windows.get(str(i)))  # B x 1 x d
            else:
                y = block.glu_conv(x)  # B x T x d
            if block.attention is not None:
                y, attn = block.attention(
                    y,
                    g,
                    encoder_out.keys,
                    encoder_out.values,
                    encoder_out.padding_mask,
                    encoder_out.conditional_input_scale,
                )
                if keep_attn:
                    attn_sum = attn if attn_sum is None else attn_sum + attn
            x = block.add_residual(y, outputs)
            outputs.append(x)
        if incremental:
            self.set_incremental_state(incremental_state, "conv_windows", windows)

        x = self.out_embed_projection(x)  # B x T x out_embed
        attn_avg = attn_sum / self.num_attention_layers if attn_sum is not None else None
        return x, attn_avg

    def output_layer(self, features: Tensor, **unused) -> Tensor:
        """B x T x out_embed -> B x T x V logits: dropout, then W_o."""
        return self.output_projection(self.dropout_module(features))

    def _get_windows(self, incremental_state: IncrementalState) -> Dict[str, Optional[Tensor]]:
        windows = self.get_incremental_state(incremental_state, "conv_windows")
        return dict(windows) if windows is not None else {}

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
