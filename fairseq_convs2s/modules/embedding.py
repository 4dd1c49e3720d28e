"""Token and learned absolute position embeddings, ``e_j = w_j + p_j`` (paper 3.1), initialized N(0, 0.1) (3.5)."""

from typing import Optional

import torch
import torch.nn.functional as F
from fairseq import utils
from torch import Tensor, nn

from ..errors import InputError
from .training_products import training_linear


class TokenEmbedding(nn.Embedding):
    """The lookup table ``w``: N(0, 0.1), the padding row zero. No weight normalization (paper 3.5)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int):
        super().__init__(num_embeddings, embedding_dim, padding_idx=padding_idx)
        nn.init.normal_(self.weight, 0.0, 0.1)
        with torch.no_grad():
            self.weight[padding_idx].zero_()


class TiedOutputProjection(nn.Module):
    """The output matrix ``W_o`` that is a lookup table (``--share-input-output-embed``, ``--share-all-embeddings``):
    ``y = x W^T + b``, W the table's own parameter, with no weight normalization (none on lookup tables, 3.5). In
    training its product runs as the other large linears' do (``training_linear``: oneDNN on a CPU)."""

    def __init__(self, table: nn.Embedding):
        super().__init__()
        self.in_features, self.out_features = table.embedding_dim, table.num_embeddings
        self.weight = table.weight  # V x C: the same parameter
        self.bias = nn.Parameter(torch.zeros(table.num_embeddings))

    def forward(self, x: Tensor) -> Tensor:
        """x: ... x C -> ... x V."""
        rows = x.reshape(-1, self.in_features)
        if torch.is_grad_enabled():
            out = training_linear(rows, self.weight, self.bias)
        else:
            out = F.linear(rows, self.weight, self.bias)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, tied"


class LearnedPositionalEmbedding(nn.Embedding):
    """The position table ``p``, indexed as fairseq does: the first real token takes row ``padding_idx + 1``.

    Porting note (fconv): fconv allocates ``max_positions`` rows, so only ``max_positions - padding_idx - 1``
    tokens fit. Here the table has ``max_positions + padding_idx + 1`` rows and ``--max-source-positions 1024``
    means 1024 tokens. The converter keeps an fconv table as it is and sets ``max_positions`` to what it holds.
    """

    def __init__(self, max_positions: int, embedding_dim: int, padding_idx: int, side: str = "source"):
        super().__init__(max_positions + padding_idx + 1, embedding_dim, padding_idx=padding_idx)
        self.max_positions = max_positions
        self.side = side
        nn.init.normal_(self.weight, 0.0, 0.1)
        with torch.no_grad():
            self.weight[padding_idx].zero_()

    def forward(self, tokens: Tensor, incremental_state: Optional[dict] = None) -> Tensor:
        """tokens: B x T -> B x T x C (or B x 1 x C for the last step when decoding incrementally)."""
        length = tokens.size(1)
        if length > self.max_positions:
            flag = "--max-source-positions" if self.side == "source" else "--max-target-positions"
            raise InputError(
                f"a {self.side} sequence of {length} tokens is longer than the model's {self.max_positions} "
                f"positions; shorten the input (fairseq's --truncate-source for sources, "
                f"--skip-invalid-size-inputs-valid-test to skip), or train a model with a larger {flag}"
            )
        if incremental_state is not None:
            # every hypothesis is at the same step: position padding_idx + step (targets are never left-padded)
            row = self.weight[self.padding_idx + length]  # C
            if not torch.is_grad_enabled():
                # a view of a parameter reports requires_grad even under no_grad, with no graph behind it
                # (torch's FLOP counter, for one, refuses such a module output)
                row = row.detach()
            return row.view(1, 1, -1).expand(tokens.size(0), 1, -1)
        positions = utils.make_positions(tokens, self.padding_idx, onnx_trace=False)  # B x T, pads stay padding_idx
        return super().forward(positions)
