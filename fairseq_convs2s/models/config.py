"""The convs2s model's configuration: one dataclass, one field per command-line flag."""

from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass

DEFAULT_MAX_POSITIONS = 1024

AttentionScaling = ChoiceEnum(["fconv", "paper"])


@dataclass
class ConvS2SConfig(FairseqDataclass):
    """Sizes and switches of a ConvS2S model; the presets in ``presets.py`` fill in the paper's values.

    The position-table sizes are not here: they are the translation task's ``--max-source-positions`` and
    ``--max-target-positions``, which the model reads from the same namespace.
    """

    dropout: float = field(
        default=0.1,
        metadata={"help": "dropout on the embeddings, on every block's input and on the decoder output"},
    )
    encoder_embed_dim: int = field(default=512, metadata={"help": "encoder embedding width f"})
    encoder_embed_path: Optional[str] = field(
        default=None, metadata={"help": "text file of pre-trained encoder embeddings (fairseq's format)"}
    )
    encoder_layers: str = field(
        default="[(512, 3)] * 20",
        metadata={"help": "encoder blocks: [(width, kernel[, residual]), ...], with + and * n, e.g. [(512, 3)] * 9"},
    )
    decoder_embed_dim: int = field(default=512, metadata={"help": "decoder embedding width f"})
    decoder_embed_path: Optional[str] = field(
        default=None, metadata={"help": "text file of pre-trained decoder embeddings (fairseq's format)"}
    )
    decoder_layers: str = field(
        default="[(512, 3)] * 20", metadata={"help": "decoder blocks, same syntax as --encoder-layers"}
    )
    decoder_out_embed_dim: int = field(
        default=256, metadata={"help": "width of the linear layer between the last block and the softmax"}
    )
    decoder_attention: str = field(
        default="True",
        metadata={"help": "which decoder layers attend: True, False or a list such as [False] * 2 + [True]"},
    )
    share_input_output_embed: bool = field(
        default=False,
        metadata={"help": "tie the decoder's input and output embeddings (needs decoder-out-embed-dim == embed-dim)"},
    )
    share_all_embeddings: bool = field(
        default=False,
        metadata={
            "help": "one table for the source embeddings, the target embeddings and the output projection (needs "
            "a joined dictionary, fairseq-preprocess --joined-dictionary, and equal embedding and out-embed widths)"
        },
    )
    attention_scaling: AttentionScaling = field(
        default="fconv",
        metadata={"help": "fconv: the sqrt(0.5) factors fairseq's fconv puts on queries and values; paper: none"},
    )
    checkpoint_activations: bool = field(
        default=False,
        metadata={
            "help": "in training, keep only each block's input and recompute the block in the backward pass: "
            "less memory for one more forward pass of the blocks"
        },
    )
