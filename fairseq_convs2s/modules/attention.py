"""Multi-step attention (paper 3.3): every attending decoder layer looks at the source on its own."""

import math
from typing import Optional, Tuple

from torch import Tensor, nn

from convs2s_runtime.attention import attend

from .weight_norm import WeightNormLinear, linear_std


class MultiStepAttention(nn.Module):
    """Dot-product attention of one decoder layer over the last encoder layer.

    d_i = W_d h_i + b_d + g_i; a_ij = softmax_j(d_i . z_j); c_i = sum_j a_ij (z_j + e_j) * m sqrt(1/m);
    the output is (h_i + W_c c_i) * sqrt(0.5). The arithmetic is ``convs2s_runtime.attention.attend``, which the
    decoding steps of the fast path share.

    Porting note (fconv): fconv multiplies d_i by sqrt(0.5) and hands the layer values (z + e) * sqrt(0.5); the
    paper has neither factor. ``scaling="fconv"`` (the default, the numbers of fairseq's published models) keeps
    them; ``scaling="paper"`` drops them. The values' factor lives in the encoder output, the query's here.
    """

    def __init__(self, conv_channels: int, embed_dim: int, scaling: str = "fconv"):
        super().__init__()
        # W_d: decoder state (d) -> embedding width (f), where the scores are taken
        self.query_projection = WeightNormLinear(conv_channels, embed_dim, std=linear_std(conv_channels))
        # W_c: conditional input (f) -> decoder state (d)
        self.output_projection = WeightNormLinear(embed_dim, conv_channels, std=linear_std(embed_dim))
        self.query_scale = math.sqrt(0.5) if scaling == "fconv" else 1.0

    def forward(
        self,
        h: Tensor,
        target_embedding: Tensor,
        keys: Tensor,
        values: Tensor,
        key_padding_mask: Optional[Tensor],
        conditional_input_scale: Tensor,
    ) -> Tuple[Tensor, Tensor]:
        """h: B x T x d (or B x d for one step), target_embedding g: the same with f, the encoder's keys z and
        values z + e (B' x S x f), its padding mask (B' x S) and conditional-input scale (B' x 1 x 1); B = B' * G.
        Returns the new h and the attention weights, B x T x S (or B x S)."""
        return attend(
            h,
            target_embedding,
            keys,
            values,
            key_padding_mask,
            conditional_input_scale,
            self.query_projection,
            self.output_projection,
            self.query_scale,
        )


def value_scale_for(scaling: str) -> float:
    """The factor on the attention values: fconv hands attention (z + e) * sqrt(0.5), the paper z + e."""
    return math.sqrt(0.5) if scaling == "fconv" else 1.0
