"""``--arch`` presets: the paper's model sizes. Each only fills in flags the user did not give.

Widths and kernels are the paper's (Gehring et al. 2017, sections 4.2 and 6.3); where fairseq's fconv preset of
the same task differs, the comment says how, so a user can reproduce either.
"""

from dataclasses import MISSING, fields

from fairseq.models import register_model_architecture

from .config import ConvS2SConfig


def _default(args, name, value):
    if getattr(args, name, None) is None:
        setattr(args, name, value)


@register_model_architecture("convs2s", "convs2s")
def base_architecture(args):
    """fconv's base model: 20 blocks of 512 with kernel 3 on each side. Its values are the defaults of
    :class:`ConvS2SConfig` (``config.py``), written once there; every preset ends here, so a checkpoint's args
    that leave a flag out get the same default as the command line."""
    for flag in fields(ConvS2SConfig):
        if not flag.name.startswith("_"):  # (fairseq's own _name)
            _default(args, flag.name, flag.default if flag.default is not MISSING else flag.default_factory())


@register_model_architecture("convs2s", "convs2s_iwslt_de_en")
def convs2s_iwslt_de_en(args):
    """Small model for small data and CPUs: 4 encoder and 3 decoder blocks of 256 (fairseq's fconv_iwslt_de_en)."""
    _default(args, "encoder_embed_dim", 256)
    _default(args, "encoder_layers", "[(256, 3)] * 4")
    _default(args, "decoder_embed_dim", 256)
    _default(args, "decoder_layers", "[(256, 3)] * 3")
    _default(args, "decoder_out_embed_dim", 256)
    base_architecture(args)


@register_model_architecture("convs2s", "convs2s_wmt_en_ro")
def convs2s_wmt_en_ro(args):
    """WMT'16 En-Ro (paper 5.1): 20 blocks of 512, kernel 3, embeddings 512 (fconv_wmt_en_ro is the same)."""
    _default(args, "decoder_out_embed_dim", 512)
    base_architecture(args)


@register_model_architecture("convs2s", "convs2s_wmt_en_de")
def convs2s_wmt_en_de(args):
    """WMT'14 En-De (paper 4.2): 15 blocks, 10 of 512, 3 of 768 (kernel 3), 2 of 2048 (kernel 1); embeddings 512.

    fairseq's fconv_wmt_en_de uses 9 x 512, 4 x 1024, 2 x 2048 and embeddings 768.
    """
    layers = "[(512, 3)] * 10 + [(768, 3)] * 3 + [(2048, 1)] * 2"
    _default(args, "encoder_embed_dim", 512)
    _default(args, "encoder_layers", layers)
    _default(args, "decoder_embed_dim", 512)
    _default(args, "decoder_layers", layers)
    _default(args, "decoder_out_embed_dim", 512)
    base_architecture(args)


@register_model_architecture("convs2s", "convs2s_wmt_en_fr")
def convs2s_wmt_en_fr(args):
    """WMT'14 En-Fr (paper 4.2): 15 blocks, 6 of 512, 4 of 768, 3 of 1024 (kernel 3), 1 of 2048, 1 of 4096
    (kernel 1); embeddings 512. The paper's text lists 14 blocks but says 15, as fairseq's spec has; fairseq's
    fconv_wmt_en_fr has the same blocks with embeddings 768.
    """
    layers = "[(512, 3)] * 6 + [(768, 3)] * 4 + [(1024, 3)] * 3 + [(2048, 1)] * 1 + [(4096, 1)] * 1"
    _default(args, "encoder_embed_dim", 512)
    _default(args, "encoder_layers", layers)
    _default(args, "decoder_embed_dim", 512)
    _default(args, "decoder_layers", layers)
    _default(args, "decoder_out_embed_dim", 512)
    base_architecture(args)


@register_model_architecture("convs2s", "convs2s_gigaword")
def convs2s_gigaword(args):
    """Gigaword summarization (paper 4.1, 6.3): 6 encoder and 6 decoder blocks of 256, kernel 3, embeddings 256."""
    _default(args, "encoder_embed_dim", 256)
    _default(args, "encoder_layers", "[(256, 3)] * 6")
    _default(args, "decoder_embed_dim", 256)
    _default(args, "decoder_layers", "[(256, 3)] * 6")
    _default(args, "decoder_out_embed_dim", 256)
    base_architecture(args)
