"""The ``convs2s`` model: registration with fairseq, the command-line flags, building from a config."""

import logging
from argparse import Namespace

from fairseq import utils
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import FairseqEncoderDecoderModel, register_model

from ..modules.attention import value_scale_for
from .config import DEFAULT_MAX_POSITIONS, ConvS2SConfig
from .decoder import ConvS2SDecoder
from .encoder import ConvS2SEncoder
from .layer_spec import LayerSpecError, parse_attention_spec, parse_attention_values, parse_layer_spec

logger = logging.getLogger(__name__)

# flags whose values are layer specs: parsed at argument-parsing time so a typo fails before any work is done
_SPEC_FLAGS = {
    "--encoder-layers": parse_layer_spec,
    "--decoder-layers": parse_layer_spec,
    "--decoder-attention": parse_attention_values,  # the count against the layers is checked at build time
}


@register_model("convs2s")
class ConvS2SModel(FairseqEncoderDecoderModel):
    """Convolutional sequence to sequence learning (Gehring et al., ICML 2017, https://arxiv.org/abs/1705.03122).

    A convolutional encoder and a convolutional decoder with multi-step attention; see ``ConvS2SEncoder``,
    ``ConvS2SDecoder`` and the presets in ``presets.py``. Configured through argparse flags generated from
    ``ConvS2SConfig`` (the legacy pattern of fairseq's transformer), so ``--arch`` presets and explicit flags
    compose: an explicit flag always wins over the preset.
    """

    @classmethod
    def add_args(cls, parser):
        # no defaults here, so that the --arch preset functions can fill in what the user did not give
        gen_parser_from_dataclass(parser, ConvS2SConfig(), delete_default=True, with_prefix="")
        for action in parser._actions:
            for flag in action.option_strings:
                if flag in _SPEC_FLAGS:
                    action.type = _argparse_type(_SPEC_FLAGS[flag], flag)

    @classmethod
    def build_model(cls, args: Namespace, task) -> "ConvS2SModel":
        from .presets import base_architecture

        base_architecture(args)  # fill anything an older checkpoint or a bare --arch convs2s left out
        cfg = ConvS2SConfig.from_namespace(args)
        encoder_layers = parse_layer_spec(cfg.encoder_layers, "--encoder-layers")
        decoder_layers = parse_layer_spec(cfg.decoder_layers, "--decoder-layers")
        attention = parse_attention_spec(cfg.decoder_attention, len(decoder_layers))
        if cfg.encoder_embed_dim != cfg.decoder_embed_dim:
            # the query d (decoder width f) is dotted with the keys z (encoder width f)
            raise ValueError(
                f"--encoder-embed-dim ({cfg.encoder_embed_dim}) and --decoder-embed-dim ({cfg.decoder_embed_dim}) "
                "must be equal: attention scores are dot products between the two"
            )

        src_embed = _load_embedding_file(cfg.encoder_embed_path, task.source_dictionary)
        tgt_embed = _load_embedding_file(cfg.decoder_embed_path, task.target_dictionary)
        scaling = str(cfg.attention_scaling)
        encoder = ConvS2SEncoder(
            task.source_dictionary,
            embed_dim=cfg.encoder_embed_dim,
            layers=encoder_layers,
            dropout=cfg.dropout,
            max_positions=getattr(args, "max_source_positions", None) or DEFAULT_MAX_POSITIONS,
            num_attention_layers=sum(attention),
            value_scale=value_scale_for(scaling),
            embed_dict=src_embed,
        )
        decoder = ConvS2SDecoder(
            task.target_dictionary,
            embed_dim=cfg.decoder_embed_dim,
            layers=decoder_layers,
            attention=attention,
            out_embed_dim=cfg.decoder_out_embed_dim,
            dropout=cfg.dropout,
            max_positions=getattr(args, "max_target_positions", None) or DEFAULT_MAX_POSITIONS,
            share_embed=cfg.share_input_output_embed,
            attention_scaling=scaling,
            embed_dict=tgt_embed,
        )
        return cls(encoder, decoder)


def _argparse_type(parse, flag):
    """Wrap a spec parser so argparse reports a bad spec as a usage error (exit 2, no traceback)."""
    import argparse

    def check(text):
        try:
            parse(text, flag)
        except LayerSpecError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return text

    check.__name__ = "layer spec"
    return check


def _load_embedding_file(path, dictionary):
    if not path:
        return None
    embed_dict = utils.parse_embedding(path)
    utils.print_embed_overlap(embed_dict, dictionary)
    return embed_dict
