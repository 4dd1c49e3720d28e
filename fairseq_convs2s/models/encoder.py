"""The ConvS2S encoder (paper 3.2): embeddings, a stack of convolutional blocks, keys and values for attention."""

from typing import List, NamedTuple, Optional, Tuple

import torch
from fairseq import utils
from fairseq.data import Dictionary
from fairseq.models import FairseqEncoder
from fairseq.modules import GradMultiply
from torch import Tensor, nn

from convs2s_runtime.products import is_compiling

from ..modules.conv_block import ConvBlock, build_blocks, run_block
from ..modules.dropout import Dropout
from ..modules.embedding import LearnedPositionalEmbedding, TokenEmbedding
from ..modules.weight_norm import WeightNormLinear, linear_std
from .fast_path import InferenceState
from .layer_spec import ConvLayer


class ConvS2SEncoderOut(NamedTuple):
    """What the decoder's attention needs of one batch of sources, computed once per source.

    B sources serve B * ``hypotheses_per_source`` decoder rows: row r attends to source r // that (beam search's
    hypotheses of one sentence are consecutive rows; see ``ConvS2SEncoder.reorder_encoder_out``).
    """

    keys: Tensor  # B x S x f: z^u, the last encoder layer projected to the embedding width
    values: Tensor  # B x S x f: z^u + e (times sqrt(0.5) with fconv scaling)
    padding_mask: Optional[Tensor]  # B x S, True at padding; None when the batch has none
    conditional_input_scale: Tensor  # B x 1 x 1: m * sqrt(1/m), m the non-pad source length
    hypotheses_per_source: int = 1
    # at inference, what the decoder's steps derive once for this batch (``fast_path.InferenceState``); None in
    # training
    inference_state: Optional[InferenceState] = None


class ConvS2SEncoder(FairseqEncoder):
    """Convolutional encoder: ``e = w + p``, a linear map to the block width, the blocks, a linear map back.

    Padded positions are zeroed before every block and in the output, so a sentence encodes the same alone and
    in a padded batch. The output ``z`` has its gradient scaled by ``1 / (2 * attention layers)`` (paper 3.4);
    the embedding path into the values is not scaled.
    """

    def __init__(
        self,
        dictionary: Dictionary,
        embed_dim: int,
        layers: List[ConvLayer],
        dropout: float,
        max_positions: int,
        num_attention_layers: int,
        value_scale: float,
        embed_dict: Optional[dict] = None,
        checkpoint_activations: bool = False,
    ):
        super().__init__(dictionary)
        self.checkpoint_activations = checkpoint_activations
        self.padding_idx = dictionary.pad()
        self.dropout_module = Dropout(dropout, module_name=type(self).__name__)
        self.embed_tokens = TokenEmbedding(len(dictionary), embed_dim, self.padding_idx)
        if embed_dict is not None:
            self.embed_tokens = utils.load_embedding(embed_dict, dictionary, self.embed_tokens)
        self.embed_positions = LearnedPositionalEmbedding(max_positions, embed_dim, self.padding_idx, "source")
        # the embeddings are dropped out before this layer: std sqrt(p / f)
        self.input_projection = WeightNormLinear(embed_dim, layers[0].width, std=linear_std(embed_dim, dropout))
        self.blocks = nn.ModuleList(build_blocks(layers, dropout, causal=False))
        self.output_projection = WeightNormLinear(layers[-1].width, embed_dim, std=linear_std(layers[-1].width))
        self.grad_scale = 1.0 / (2.0 * num_attention_layers)
        self.value_scale = value_scale

    def forward(self, src_tokens: Tensor, src_lengths: Optional[Tensor] = None, **unused) -> ConvS2SEncoderOut:
        """src_tokens: B x S (left- or right-padded); src_lengths: B (unused: the padding mask says it)."""
        padding_mask = src_tokens.eq(self.padding_idx)  # B x S
        # unpadded batches skip the masking; under torch.compile it always runs (masking nothing changes
        # nothing), as a data-dependent branch would split the compiled graph in two
        if not is_compiling() and not padding_mask.any():
            padding_mask = None

        e = self.embed_tokens(src_tokens) + self.embed_positions(src_tokens)  # B x S x f
        e = self.dropout_module(e)
        x = self.input_projection(e)  # B x S x d

        outputs = [x]
        for block in self.blocks:
            x = run_block(
                _encoder_block, block, x, tuple(outputs), padding_mask, checkpointed=self.checkpoint_activations
            )
            outputs.append(x)  # B x S x d

        z = self.output_projection(x)  # B x S x f
        if padding_mask is not None:
            z = z.masked_fill(padding_mask.unsqueeze(-1), 0.0)
        z = GradMultiply.apply(z, self.grad_scale)  # scales the backward pass only
        values = (z + e) * self.value_scale  # B x S x f

        if padding_mask is None:
            m = torch.full((src_tokens.size(0), 1, 1), float(src_tokens.size(1)), device=z.device, dtype=z.dtype)
        else:
            m = (~padding_mask).sum(dim=1).to(z.dtype).view(-1, 1, 1)  # B x 1 x 1
        state = None if torch.is_grad_enabled() or is_compiling() else InferenceState()
        return ConvS2SEncoderOut(z, values, padding_mask, m * torch.rsqrt(m), inference_state=state)

    def reorder_encoder_out(self, encoder_out: ConvS2SEncoderOut, new_order: Tensor) -> ConvS2SEncoderOut:
        """Decoder row i now continues row ``new_order[i]`` (beam search expands, reorders and prunes hypotheses).

        Porting note (fconv): fconv copies the keys and values for every hypothesis, and again at every step
        of beam search, which reorders hypotheses within each sentence. Here, while the new rows come in runs
        of equal length that each read one source (what beam search's orders are), the keys and values stay
        one row per source: copied only when sentences finish, and attention takes a source's hypotheses as
        one product (``MultiStepAttention``). Any other order falls back to one row per hypothesis.
        """
        group = encoder_out.hypotheses_per_source
        sources = new_order // group if group > 1 else new_order  # the source row each new decoder row reads
        new_group = _run_length(sources)
        rows = sources[::new_group] if new_group > 1 else sources  # one per run
        tensors, state = encoder_out[:4], encoder_out.inference_state
        if rows.numel() != encoder_out.keys.size(0) or not torch.equal(
            rows, torch.arange(rows.numel(), device=rows.device)
        ):
            tensors = tuple(t.index_select(0, rows) if t is not None else None for t in tensors)
            if state is not None:
                state = state.select_sources(rows)
        return ConvS2SEncoderOut(*tensors, hypotheses_per_source=new_group, inference_state=state)

    def max_positions(self) -> int:
        return self.embed_positions.max_positions


def _encoder_block(block: ConvBlock, x: Tensor, outputs: Tuple[Tensor, ...], padding_mask: Optional[Tensor]) -> Tensor:
    """One encoder block of a full pass: x (B x S x d_in, the last output) -> B x S x d; no block sees padding."""
    if padding_mask is not None:
        x = x.masked_fill(padding_mask.unsqueeze(-1), 0.0)
    return block.add_residual(block.glu_conv(x), outputs)


def _run_length(sources: Tensor) -> int:
    """g when ``sources`` (N) is runs of g equal values each, else 1."""
    n = sources.numel()
    if n < 2:
        return 1
    runs = 1 + int(sources[1:].ne(sources[:-1]).sum())
    if n % runs:
        return 1
    blocks = sources.view(runs, n // runs)
    return n // runs if bool(blocks.eq(blocks[:, :1]).all()) else 1
