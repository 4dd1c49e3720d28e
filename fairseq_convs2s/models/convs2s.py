"""The ``convs2s`` model: registration with fairseq, the command-line flags, building from a config."""

import logging
from argparse import Namespace
from typing import Optional

import torch
from fairseq import utils
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import FairseqEncoderDecoderModel, register_model

from ..compat.checkpoints import is_building_to_load
from ..errors import InputError
from ..modules.attention import value_scale_for
from ..modules.weight_norm import WeightNorm
from .checkpoint_args import ConversionError, model_args_of
from .config import DEFAULT_MAX_POSITIONS, ConvS2SConfig
from .decoder import ConvS2SDecoder
from .dictionaries import (
    SIDES,
    USE_THE_TRAINING_DICTIONARY,
    check_dictionaries,
    dictionary_difference,
    dictionary_fingerprint,
    dictionary_label,
)
from .encoder import ConvS2SEncoder
from .layer_spec import LayerSpecError, parse_attention_spec, parse_attention_values, parse_layer_spec
from .structure import difference, structure_of

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
    def hub_models(cls):
        """The published fconv models (fairseq's ``FConvModel.hub_models``), by the same names.

        They are fconv checkpoints: ``from_pretrained`` downloads and unpacks one (fairseq's cache), converts its
        ``model.pt`` once into ``model.convs2s.pt`` beside it and loads that. They expect Moses tokenization and
        subword-nmt BPE: ``pip install sacremoses subword-nmt``.
        """

        def moses_subword(path):
            return {"path": path, "tokenizer": "moses", "bpe": "subword_nmt"}

        url = "https://dl.fbaipublicfiles.com/fairseq/models/"
        return {
            "conv.wmt14.en-fr": moses_subword(url + "wmt14.v2.en-fr.fconv-py.tar.bz2"),
            "conv.wmt14.en-de": moses_subword(url + "wmt14.en-de.fconv-py.tar.bz2"),
            "conv.wmt17.en-de": moses_subword(url + "wmt17.v2.en-de.fconv-py.tar.bz2"),
        }

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".", **kwargs):
        """fairseq's hub interface (``.translate(...)``) for a model directory, archive URL or ``hub_models`` name.

        As ``FairseqModel.from_pretrained``, except that an fconv checkpoint is converted on first load (to
        ``<name>.convs2s.pt`` beside it, reused afterwards); see ``models/pretrained.py``.
        """
        from .pretrained import from_pretrained

        return from_pretrained(cls, model_name_or_path, checkpoint_file, data_name_or_path, **kwargs)

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
        check_dictionaries(args, task)
        cfg = ConvS2SConfig.from_namespace(args)
        encoder_layers = parse_layer_spec(cfg.encoder_layers, "--encoder-layers")
        decoder_layers = parse_layer_spec(cfg.decoder_layers, "--decoder-layers")
        attention = parse_attention_spec(cfg.decoder_attention, len(decoder_layers))
        _check_sizes(cfg, args)
        if cfg.encoder_embed_dim != cfg.decoder_embed_dim:
            # the query d (decoder width f) is dotted with the keys z (encoder width f)
            raise InputError(
                f"--encoder-embed-dim ({cfg.encoder_embed_dim}) and --decoder-embed-dim ({cfg.decoder_embed_dim}) "
                "must be equal: attention scores are dot products between the two"
            )

        share_all = cfg.share_all_embeddings
        if share_all:
            _check_shared_embeddings(cfg, task)
        src_embed = _pretrained_embeddings(cfg, "encoder", task.source_dictionary)
        tgt_embed = None if share_all else _pretrained_embeddings(cfg, "decoder", task.target_dictionary)
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
            checkpoint_activations=cfg.checkpoint_activations,
        )
        decoder = ConvS2SDecoder(
            task.target_dictionary,
            embed_dim=cfg.decoder_embed_dim,
            layers=decoder_layers,
            attention=attention,
            out_embed_dim=cfg.decoder_out_embed_dim,
            dropout=cfg.dropout,
            max_positions=getattr(args, "max_target_positions", None) or DEFAULT_MAX_POSITIONS,
            share_embed=cfg.share_input_output_embed or share_all,
            attention_scaling=scaling,
            embed_dict=tgt_embed,
            checkpoint_activations=cfg.checkpoint_activations,
            embed_tokens=encoder.embed_tokens if share_all else None,
        )
        model = cls(encoder, decoder)
        model.dictionary_labels = {side: dictionary_label(task, side) for side in SIDES}
        model.structure = structure_of(args)
        model.dictionary_fingerprints = {side: getattr(args, f"{side}_dictionary_fingerprint") for side in SIDES}
        return model

    def checkpoint_difference(self, checkpoint: dict) -> Optional[str]:
        """Why a loaded fairseq checkpoint cannot be trained on as this model (another kind, other layers or
        settings: ``structure.py``; other dictionaries: ``dictionaries.py``), or None. fairseq-train asks before it
        loads one (``compat/broken_checkpoints.py``)."""
        if not hasattr(self, "structure"):
            return None
        found = difference(self.structure, checkpoint)
        if found is None:
            try:
                model_args, _ = model_args_of(checkpoint)
            except ConversionError:
                return None  # (not a fairseq checkpoint: fairseq's own loading names the file)
            found = dictionary_difference(self.dictionary_fingerprints, self.dictionary_labels, model_args)
        return found

    def make_generation_fast_(self, **kwargs):
        """fairseq's preparation for inference (``prepare_for_inference_``: fairseq-generate, fairseq-interactive,
        the hub interface), after which fairseq forbids training the model: the decoder returns attention only
        when asked (``need_attn``), and weight norm is folded once for good, in place (``weight_v`` becomes the
        weight: no folded copy beside it), instead of once per batch."""
        super().make_generation_fast_(**kwargs)
        for module in self.modules():
            if isinstance(module, WeightNorm):
                module.fold_in_place()

    def prepare_for_inference_(self, cfg):
        """fairseq's preparation for inference, then, with ``--bf16`` (``cfg.common.bf16``), the model cast to
        bfloat16: weight norm folded in fp32 first, then every weight rounded once. Decoding then runs its products
        in bf16 (faster on a CPU with AVX512-BF16: README, "Decoding in bf16"); log-probabilities and beam scores
        stay fp32.

        Porting note: stock fairseq-generate and fairseq-interactive read ``--bf16`` only to switch on TPU mode,
        which they do not use, and decode an fconv model in fp32 (``--fp16`` alone casts the model); a convs2s model
        honours ``--bf16``, on the CPU too. The hub interface passes the checkpoint's training settings here, so
        ``models/pretrained.py`` sets ``bf16`` to what ``from_pretrained`` was asked (default: fp32)."""
        super().prepare_for_inference_(cfg)
        if getattr(getattr(cfg, "common", None), "bf16", False):
            self.to(torch.bfloat16)

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """fairseq's loader, after checking that the checkpoint's vocabularies have the sizes of this model's
        dictionaries (torch would otherwise stop with a bare ``size mismatch for encoder.embed_tokens.weight``), and
        that a model with one embedding table (``--share-all-embeddings``) receives one: two different tables would
        load into it one over the other, silently (``--restore-file`` or ``--finetune-from-model`` of a checkpoint
        trained without the flag)."""
        tables = {}
        for side, name, module in (("source", "encoder", self.encoder), ("target", "decoder", self.decoder)):
            weight = tables[side] = state_dict.get(f"{name}.embed_tokens.weight")  # rows: the dictionary's size
            rows = module.embed_tokens.num_embeddings
            if weight is not None and weight.size(0) != rows:
                label = getattr(self, "dictionary_labels", {}).get(side, f"{side} dictionary")
                raise InputError(
                    f"dictionary mismatch: the checkpoint's {side} dictionary has {weight.size(0)} entries, "
                    f"the data's {label} has {rows}: {USE_THE_TRAINING_DICTIONARY}"
                )
        source, target = tables["source"], tables["target"]
        shared = self.encoder.embed_tokens is self.decoder.embed_tokens
        if shared and source is not None and target is not None and not torch.equal(source, target):
            raise InputError(
                "the checkpoint has separate source and target embeddings, and this model one table for both "
                "(--share-all-embeddings): build it as the checkpoint was trained, without the flag"
            )
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)


def _check_sizes(cfg: ConvS2SConfig, args: Namespace) -> None:
    """Refuse sizes no model has, naming the flag: fconv builds on with them and fails later with a bare
    ``ZeroDivisionError`` or ``math domain error`` (an initialization std of sqrt(p / 0) or of a negative
    retain probability p), trains on after a negative dropout, or sees every gradient turn NaN (dropout 1)."""
    if not 0.0 <= cfg.dropout < 1.0:
        raise InputError(f"--dropout must lie in [0, 1) (the probability of dropping a unit), got {cfg.dropout}")
    for flag, value in (
        ("--encoder-embed-dim", cfg.encoder_embed_dim),
        ("--decoder-embed-dim", cfg.decoder_embed_dim),
        ("--decoder-out-embed-dim", cfg.decoder_out_embed_dim),
        ("--max-source-positions", getattr(args, "max_source_positions", None)),
        ("--max-target-positions", getattr(args, "max_target_positions", None)),
    ):
        if value is not None and value < 1:
            raise InputError(f"{flag} must be at least 1, got {value}")


def _check_shared_embeddings(cfg: ConvS2SConfig, task) -> None:
    """What ``--share-all-embeddings`` needs: one dictionary on both sides, so a token id means one word; one
    width for the table, the decoder's output embedding included; at most one pre-trained embedding file.

    Porting note (fconv): fconv has no such flag; fairseq's transformer has it under the same name and the same
    conditions. The paper ties nothing; on a small corpus with a joint sub-word vocabulary the one table trains
    each piece from both languages' sentences (examples/multi30k/README.md measures it)."""
    source, target = task.source_dictionary, task.target_dictionary
    if dictionary_fingerprint(source) != dictionary_fingerprint(target):
        labels = dictionary_label(task, "source"), dictionary_label(task, "target")
        raise InputError(
            f"--share-all-embeddings needs one dictionary for both languages, but the {labels[0]} and the "
            f"{labels[1]} differ: preprocess with fairseq-preprocess --joined-dictionary"
        )
    if cfg.decoder_out_embed_dim != cfg.decoder_embed_dim:
        raise InputError(
            f"--share-all-embeddings needs --decoder-out-embed-dim ({cfg.decoder_out_embed_dim}) equal to "
            f"--decoder-embed-dim ({cfg.decoder_embed_dim}): the output projection is the embedding table"
        )
    if cfg.decoder_embed_path and cfg.decoder_embed_path != cfg.encoder_embed_path:
        raise InputError(
            "--share-all-embeddings reads pre-trained vectors from --encoder-embed-path only; "
            f"--decoder-embed-path ({cfg.decoder_embed_path}) would be a second table"
        )


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


def _pretrained_embeddings(cfg: ConvS2SConfig, side: str, dictionary) -> Optional[dict]:
    """The vectors of ``--{side}-embed-path`` for a model being trained, or None: without the flag, or for a model
    built to receive a checkpoint's weights, which replace them (``compat.checkpoints.build_models_to_load``)."""
    path = getattr(cfg, f"{side}_embed_path")
    if not path or is_building_to_load():
        return None
    return _load_embedding_file(path, dictionary, getattr(cfg, f"{side}_embed_dim"), side)


def _load_embedding_file(path, dictionary, embed_dim: int, side: str):
    """Pre-trained embeddings in fairseq's text format (a header line, then a word and its ``embed_dim`` numbers per
    line) -> {word: tensor}, as ``fairseq.utils.parse_embedding`` reads them.

    Porting note (fconv): fconv reads the file with ``parse_embedding`` and copies each vector into the table: a
    word followed by anything but numbers stops it with ``could not convert string to float``, a vector of another
    width with torch's ``The expanded size of the tensor (512) must match the existing size (300)``. Here both
    are a ``ValueError`` naming the flag, the file, the line and the word (and ``--<side>-embed-dim``)."""
    flag = f"--{side}-embed-path"
    embed_dict = {}
    with open(path, encoding="utf-8") as lines:
        next(lines, None)  # the header: word count and width
        for number, line in enumerate(lines, start=2):
            if not line.strip():
                continue  # (fairseq's reader files a blank line under the word '', which no dictionary holds)
            word, *numbers = line.rstrip().split(" ")
            try:
                vector = torch.tensor([float(x) for x in numbers])
            except ValueError:
                raise InputError(f"{flag} {path}, line {number}: {word!r} is not followed by numbers") from None
            if len(vector) != embed_dim:
                raise InputError(
                    f"{flag} {path}, line {number}: {word!r} has {len(vector)} numbers, the model's {side} "
                    f"embeddings {embed_dim} (--{side}-embed-dim)"
                )
            embed_dict[word] = vector
    utils.print_embed_overlap(embed_dict, dictionary)
    return embed_dict
