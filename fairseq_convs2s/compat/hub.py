"""Say what is wrong with the sentences given to fairseq's hub interface (``from_pretrained(...).translate``), and
answer every one of them.

fairseq 0.12's ``GeneratorHubInterface.sample`` (which ``translate`` calls) takes one string or a list of them.
Anything else failed where it was first used: ``None`` in ``'NoneType' object is not iterable``, bytes in
sentencepiece's ``Input must be str or bytes``, a float beam in ``repeat()`` inside the search; a misspelt option
(``lenpn=2``) was set on the generation config and ignored. A sentence longer than the model's source positions
failed with a bare ``Exception`` naming a command-line flag (``--skip-invalid-size-inputs-valid-test``); with
``skip_invalid_size_inputs=True`` it was left out of the results without a word, so that the translations no longer
lined up with the sentences. ``print_alignment=True`` failed inside the search (``IndexError: Dimension out of
range``): the hub prepares the model for inference without its attention; 'hard' or 'soft' too. ``generate(...,
nbest=k)`` gave the whole beam, and one sentence as one tensor lost ``skip_invalid_size_inputs``. A sentence longer
than the hub's ``max_tokens`` (its batches' cap) was left out like one too long for the positions. And fairseq's own
``from_pretrained`` hands the model the checkpoint's training settings: a model trained with ``--bf16`` decoded in
bf16 there, unasked (a convs2s model's preparation for inference reads ``--bf16`` as a request).

With the plugin loaded: TypeError or ValueError naming the argument, before anything is encoded or decoded; a
sentence too long is named with its length and the limit; skipped, it is answered with no hypothesis (``generate``)
or an empty translation (``sample``, ``translate``), in its place, with a warning; ``nbest`` hypotheses a sentence;
the hub prepares its models in fp32 (``from_pretrained(..., bf16=True)`` asks for bf16). ``print_alignment`` ('hard',
'soft', or True for 'hard' as the bare command-line flag) gives fairseq-generate --print-alignment's alignments.
"""

import inspect
import logging
import operator
from collections.abc import Iterable
from contextlib import contextmanager

import torch
from fairseq import hub_utils
from omegaconf import open_dict

from fairseq_convs2s_autoload import is_replaced, replace

logger = logging.getLogger("fairseq_convs2s.hub")


def check_hub_inputs() -> None:
    """Wrap ``GeneratorHubInterface.sample``, ``.generate`` and ``__init__`` (idempotent)."""
    hub = hub_utils.GeneratorHubInterface
    if is_replaced(hub.generate, "hub_inputs"):
        return
    original_generate = hub.generate
    original_init = hub.__init__

    def __init__(self, cfg, task, models):
        # the cfg fairseq's from_pretrained hands over is the checkpoint's: its --bf16 says how the model trained,
        # not that it should decode in bf16, which a convs2s model's prepare_for_inference_ would take it for
        if getattr(getattr(cfg, "common", None), "bf16", False):
            with open_dict(cfg):
                cfg.common.bf16 = False
        original_init(self, cfg, task, models)

    own_arguments = set(inspect.signature(original_generate).parameters)  # (taken by generate, not by the config)

    def sample(self, sentences, beam: int = 1, verbose: bool = False, **kwargs):
        if isinstance(sentences, str):
            return sample(self, [sentences], beam, verbose, **kwargs)[0]
        sentences = _checked_sentences(sentences)
        _check_beam(beam)
        tokenized = [self.encode(sentence) for sentence in sentences]
        batched_hypos = self.generate(tokenized, beam, verbose, **kwargs)
        return [self.decode(hypos[0]["tokens"]) if hypos else "" for hypos in batched_hypos]  # ("": skipped)

    def generate(
        self, tokenized_sentences, beam: int = 5, verbose: bool = False, skip_invalid_size_inputs=False, **kwargs
    ):
        if torch.is_tensor(tokenized_sentences) and tokenized_sentences.dim() == 1:  # one sentence, its hypotheses
            # (fairseq's own path for it drops skip_invalid_size_inputs)
            return generate(self, [tokenized_sentences], beam, verbose, skip_invalid_size_inputs, **kwargs)[0]
        _check_beam(beam)
        generation = getattr(self.cfg, "generation", None)
        if generation is not None:  # (fairseq sets every other keyword on its generation config, read by nothing)
            unknown = sorted(set(kwargs) - set(generation.keys()) - own_arguments)
            if unknown:
                raise TypeError(f"no generation option {', '.join(unknown)}: the options are GenerationConfig's fields")
        if "print_alignment" in kwargs:
            kwargs["print_alignment"] = _alignment_kind(kwargs["print_alignment"])
        aligned = kwargs.get("print_alignment", getattr(generation, "print_alignment", None))
        with _attention_kept(self.models, bool(aligned)):
            found = _generate_in_order(self, tokenized_sentences, beam, verbose, skip_invalid_size_inputs, **kwargs)
        if kwargs.get("nbest") is not None:  # (fairseq sets it on the config, read by nothing: beam hypotheses each)
            found = [hypos[: kwargs["nbest"]] for hypos in found]
        return found

    def _generate_in_order(self, tokenized_sentences, beam, verbose, skip_invalid_size_inputs, **kwargs):
        limit = _source_positions(self.max_positions)
        what = f"the model's {limit} source positions"
        max_tokens = getattr(getattr(self.cfg, "dataset", None), "max_tokens", None)
        if max_tokens and (limit is None or max_tokens < limit):  # (the batcher caps sentences at max_tokens)
            limit, what = max_tokens, f"max_tokens {max_tokens} (from_pretrained(..., max_tokens=N) raises it)"
        too_long = [i for i, tokens in enumerate(tokenized_sentences) if limit is not None and len(tokens) > limit]
        if not too_long:
            return original_generate(self, tokenized_sentences, beam, verbose, skip_invalid_size_inputs, **kwargs)
        lengths = ", ".join(f"sentence {i}: {len(tokenized_sentences[i])} tokens" for i in too_long[:5])
        lengths += ", ..." if len(too_long) > 5 else ""
        if not skip_invalid_size_inputs:
            raise ValueError(
                f"{len(too_long)} of {len(tokenized_sentences)} sentences are longer than {what} (EOS included; "
                f"{lengths}): shorten them, or pass skip_invalid_size_inputs=True to have them answered with no "
                f"translation"
            )
        logger.warning("no translation for %d sentences longer than %s (%s)", len(too_long), what, lengths)
        skipped = set(too_long)
        kept = [tokens for i, tokens in enumerate(tokenized_sentences) if i not in skipped]
        found = iter(original_generate(self, kept, beam, verbose, **kwargs) if kept else [])
        return [[] if i in skipped else next(found) for i in range(len(tokenized_sentences))]

    replace(hub, "__init__", __init__, "hub_inputs")
    replace(hub, "sample", sample, "hub_inputs")
    replace(hub, "generate", generate, "hub_inputs")


def _checked_sentences(sentences) -> list:
    """``sentences`` as a list, if it holds strings only (any iterable but bytes); else TypeError naming the first
    that is not."""
    if isinstance(sentences, bytes) or not isinstance(sentences, Iterable):
        raise TypeError(f"sentences must be a str or a list of str, got {type(sentences).__name__}")
    sentences = list(sentences)
    for i, sentence in enumerate(sentences):
        if not isinstance(sentence, str):
            raise TypeError(f"sentences[{i}] must be a str, got {type(sentence).__name__} {sentence!r:.80}")
    return sentences


def _check_beam(beam) -> None:
    try:
        operator.index(beam)
    except TypeError:
        raise TypeError(f"beam must be an int, got {type(beam).__name__} {beam!r}") from None


def _alignment_kind(value):
    """``print_alignment`` as fairseq's generator takes it: 'hard' or 'soft' (True: 'hard', as the command line's
    bare ``--print-alignment``), None or False for none; anything else is a ValueError (fairseq: an
    AttributeError in the generator, after decoding)."""
    if value is True:
        return "hard"
    if value is None or value is False or value in ("hard", "soft"):
        return value
    raise ValueError(f"print_alignment must be 'hard', 'soft', True or False, got {value!r}")


@contextmanager
def _attention_kept(models, keep: bool):
    """With ``keep``, the attention of the models' modules turned on for the call, as fairseq-generate
    --print-alignment prepares them (``need_attn``: ``prepare_for_inference_`` set it from the hub's generation
    settings, None without print_alignment), and restored afterwards."""
    modules = [
        m for model in models for m in model.modules() if keep and getattr(m, "need_attn", True) in (None, False)
    ]
    before = [m.need_attn for m in modules]
    try:
        for m in modules:
            m.need_attn = True
        yield
    finally:
        for m, value in zip(modules, before):
            m.need_attn = value


def _source_positions(max_positions):
    """The longest source (tokens with EOS) of the hub's ``max_positions``: a (source, target) pair for translation,
    one number for other tasks, None for no limit."""
    if isinstance(max_positions, (tuple, list)):
        max_positions = max_positions[0]
    return max_positions
