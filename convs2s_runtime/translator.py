"""Translate with an exported model folder, without fairseq: the API follows CTranslate2's.

    translator = Translator("model_dir")                       # device="cpu", compute_type="float32", threads=None
    results = translator.translate_batch(["ein Satz .", ...])   # beam_size=5, max_len_b=200, length_penalty=1.0
    results[0].hypotheses[0].text, .tokens, .score

A source is a string: sentencepiece applied when the folder has a model, else whitespace-separated dictionary
tokens (fairseq-interactive's input). The hypotheses are fairseq-generate's for the same checkpoint (beam search as
fairseq's, ``search.py``, the beam at most the target vocabulary less one as fairseq's); ``score`` is fairseq's:
natural log, normalized by length ** length_penalty (fairseq-generate prints it in base 2).
"""

import logging
import math
import numbers
import operator
import os
import re
from pathlib import Path
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch

from .model import SENTENCEPIECE, Model, ModelDirError, read_vocabulary
from .search import beam_search

logger = logging.getLogger("convs2s_runtime")

COMPUTE_TYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
HEAD_WORDS_PER_POSITION = 8  # a source of more words than this a position is encoded from its head alone
_WORD, _SPACE = re.compile(r"\S+"), re.compile(r"\s")  # (the words str.split finds, and what parts them)


class TranslationHypothesis(NamedTuple):
    """One translation: ``tokens`` (target dictionary symbols, EOS left out), ``text`` (sentencepiece decoded, or
    the tokens joined by spaces), ``score`` (fairseq's), ``attention`` when asked: one row per target token and the
    final EOS, one column per source token and its EOS."""

    tokens: List[str]
    text: str  # (without <s>, as fairseq's Dictionary.string)
    score: float
    attention: Optional[List[List[float]]] = None


class TranslationResult(NamedTuple):
    """The hypotheses of one source, best first."""

    hypotheses: List[TranslationHypothesis]


class Translator:
    """An exported ConvS2S model, ready to translate (``python -m fairseq_convs2s.export`` writes the folder).

    ``compute_type="bfloat16"`` decodes in bf16 where the device supports it (on a CPU: AVX512-BF16 or AMX; else
    fp32, with a warning); log-probabilities and scores stay fp32. ``threads`` sets torch's intra-op threads.
    """

    def __init__(self, model_dir, device: str = "cpu", compute_type: str = "float32", threads: Optional[int] = None):
        if compute_type not in COMPUTE_TYPES:
            raise ValueError(f"compute_type must be one of {sorted(COMPUTE_TYPES)}, got {compute_type!r}")
        if threads is not None:
            torch.set_num_threads(_threads(threads))
        self.device = _device(device)
        model_dir = Path(model_dir)
        if model_dir.is_file():
            raise ModelDirError(
                f"{model_dir} is a file, not a model folder: export a checkpoint first, "
                f"python -m fairseq_convs2s.export {model_dir} MODEL_DIR"
            )
        if not model_dir.is_dir():
            raise ModelDirError(f"{model_dir}: no such folder")
        dtype = COMPUTE_TYPES[compute_type]
        if dtype == torch.bfloat16 and self.device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            logger.warning("this CPU has no bf16 instructions: decoding in float32")
            dtype = torch.float32
        self.compute_type = "bfloat16" if dtype == torch.bfloat16 else "float32"
        # (the config is read first: a folder that is no export is named)
        self.model = Model.load(model_dir, dtype, self.device)
        self.source_vocabulary = read_vocabulary(model_dir, "source")
        self.target_vocabulary = read_vocabulary(model_dir, "target")
        self._source_index = {symbol: i for i, symbol in enumerate(self.source_vocabulary)}
        for side, vocabulary, rows in (
            ("source", self.source_vocabulary, self.model.src_embed.size(0)),
            ("target", self.target_vocabulary, self.model.vocab_size),
        ):
            if len(vocabulary) != rows:
                raise ModelDirError(
                    f"{model_dir}: the {side} vocabulary has {len(vocabulary)} symbols, the model {rows}"
                )
        config = self.model.config
        self.unk, self.eos, self.pad = config["unk"], config["eos"], config["pad"]
        # (folders exported before the config named it: fairseq's dictionaries put <s> first)
        self.bos = config.get("bos", self.target_vocabulary.index("<s>") if "<s>" in self.target_vocabulary else None)
        self._sentencepiece = None
        if (model_dir / SENTENCEPIECE).is_file():
            import sentencepiece

            try:
                self._sentencepiece = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / SENTENCEPIECE))
            except (RuntimeError, OSError) as e:  # (truncated, empty, or not a sentencepiece model)
                raise ModelDirError(f"{model_dir / SENTENCEPIECE}: not a sentencepiece model ({e})") from None

    def source_ids(self, source: str, name: str = "a source") -> List[int]:
        """The dictionary ids of a source (its pieces, or whitespace-separated tokens) and EOS, cut to the model's
        source positions with a warning that calls it ``name``."""
        ids, length = self._ids_within_positions(source)
        if length is not None:
            logger.warning(f"{name}: {length} cut to the model's {self.model.max_source_positions} positions")
        return ids

    def _ids_within_positions(self, source: str) -> Tuple[List[int], Optional[str]]:
        """The source's ids within the positions, and where they were cut, its length: its tokens (EOS included),
        or, for a source of more than ``HEAD_WORDS_PER_POSITION`` words a position, its words. Only such a source's
        head is encoded (each word is one token or more): memory follows the positions, not the line."""
        limit = self.model.max_source_positions
        head, words = _head(source, HEAD_WORDS_PER_POSITION * limit)
        ids = self._encode(head)
        if words is not None and len(ids) < limit:  # (a head of words that make no token: the whole source)
            ids, words = self._encode(source), None
        if len(ids) <= limit:
            return ids, None
        length = f"{len(ids)} tokens (EOS included)" if words is None else f"{words} words"
        return ids[: limit - 1] + [self.eos], length

    def _encode(self, source: str) -> List[int]:
        if self._sentencepiece:
            # (split again on whitespace, as fairseq's encode_line splits the pieces it is given: a piece that holds
            # a character str.split takes for a space, U+0085 or U+001C, is no symbol of the dictionary)
            source = " ".join(self._sentencepiece.encode(source, out_type=str))
        pieces = source.split()
        return [self._source_index.get(piece, self.unk) for piece in pieces] + [self.eos]

    def max_hypothesis_length(self, source: str, max_len_a: float = 0.0, max_len_b: int = 200) -> int:
        """The most tokens (EOS excluded) a hypothesis of ``source`` may have: ``max_len_a * its tokens + max_len_b``
        (EOS included, after the cut to the source positions) within the model's target positions."""
        return self._max_len(len(self._ids_within_positions(source)[0]), max_len_a, max_len_b)

    def max_hypothesis_length_of_any(self, max_len_a: float = 0.0, max_len_b: int = 200) -> int:
        """The most tokens a hypothesis of any non-empty source may have (the longest source's, or the shortest's
        where ``max_len_a`` is negative)."""
        return max(self._max_len(n, max_len_a, max_len_b) for n in (2, self.model.max_source_positions))

    def translate_batch(
        self,
        sources: Sequence[str],
        beam_size: int = 5,
        max_len_a: float = 0.0,
        max_len_b: int = 200,
        length_penalty: float = 1.0,
        nbest: int = 1,
        return_attention: bool = False,
        max_batch_size: int = 0,
        min_len: int = 1,
        source_names: Optional[Sequence[str]] = None,
    ) -> List[TranslationResult]:
        """One result per source, in order. The sources are decoded in batches of similar length (all at once with
        ``max_batch_size`` 0); each hypothesis is at most ``max_len_a * source length + max_len_b`` tokens (and
        the model's target positions) long, and at least ``min_len`` before its EOS (fairseq's ``--min-len``).
        Settings under which a source could have no hypothesis (its maximum below ``min_len``) raise ValueError
        before anything is decoded, as do settings out of range; a source that is not a ``str`` (or ``sources``
        given as one string, which would be read as one source a character) raises TypeError. Warnings and errors
        call the sources ``source_names`` (default ``sources[i]``). A beam wider than the target vocabulary less
        one is narrowed to it, as fairseq's."""
        for name, value, least in (
            ("beam_size", beam_size, 1),
            ("nbest", nbest, 1),
            ("max_len_b", max_len_b, 0),
            ("max_batch_size", max_batch_size, 0),
            ("min_len", min_len, 0),
        ):
            _whole(name, value, least)
        if nbest > beam_size:
            raise ValueError(f"need 1 <= nbest ({nbest}) <= beam_size ({beam_size})")
        widest = self.model.vocab_size - 1  # (fairseq's SequenceGenerator: the beam within the vocabulary)
        if nbest > widest:
            raise ValueError(f"nbest {nbest}: the target vocabulary of {widest + 1} symbols allows {widest} hypotheses")
        beam_size = min(beam_size, widest)
        for name, value in (("max_len_a", max_len_a), ("length_penalty", length_penalty)):
            if not (isinstance(value, numbers.Real) and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        sources = _check_sources(sources)
        names = [f"sources[{i}]" for i in range(len(sources))] if source_names is None else list(source_names)
        if len(names) != len(sources):
            raise ValueError(f"{len(names)} source_names for {len(sources)} sources")
        ids = [self.source_ids(source, name) for source, name in zip(sources, names)]
        for name, source in zip(names, ids):
            n = len(source)  # (a source's tokens, EOS included)
            if self._max_len(n, max_len_a, max_len_b) < min_len:
                raise ValueError(
                    f"{name}: {n} tokens (EOS included) allow hypotheses of at most "
                    f"{self._max_len(n, max_len_a, max_len_b)} tokens (max_len_a * {n} + max_len_b = "
                    f"{max_len_a} * {n} + {max_len_b}, within the model's {self.model.max_target_positions - 1} "
                    f"positions), fewer than min_len {min_len}"
                )
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        size = max_batch_size if max_batch_size > 0 else max(len(ids), 1)
        results: List[Optional[TranslationResult]] = [None] * len(ids)
        with torch.inference_mode():
            for start in range(0, len(order), size):
                batch = order[start : start + size]
                settings = (beam_size, max_len_a, max_len_b, length_penalty, nbest, return_attention, min_len)
                for i, result in zip(batch, self._translate([ids[i] for i in batch], *settings)):
                    results[i] = result
        return results

    def _translate(self, batch, beam_size, max_len_a, max_len_b, length_penalty, nbest, return_attention, min_len):
        width = max(len(ids) for ids in batch)
        src = torch.full((len(batch), width), self.pad, dtype=torch.long)
        for row, ids in enumerate(batch):
            src[row, width - len(ids) :] = torch.tensor(ids)  # left-padded, as fairseq's sources
        max_len = torch.tensor([self._max_len(len(ids), max_len_a, max_len_b) for ids in batch])
        found = beam_search(
            self.model, src.to(self.device), max_len, beam_size, length_penalty, min_len, return_attention
        )
        results = []
        for ids, hypotheses in zip(batch, found):
            results.append(TranslationResult([self._hypothesis(h, len(ids)) for h in hypotheses[:nbest]]))
        return results

    def _max_len(self, source_length: int, max_len_a: float, max_len_b: int) -> int:
        """The longest hypothesis of a source (EOS excluded): fairseq's rule, within the target positions."""
        longest = max_len_a * source_length + max_len_b  # (a float: a huge max_len_a overflows no int)
        return int(max(min(longest, self.model.max_target_positions - 1), -1))

    def _hypothesis(self, hypothesis, source_length: int) -> TranslationHypothesis:
        ids = hypothesis.tokens[:-1]  # (the final EOS left out)
        tokens = [self.target_vocabulary[t] for t in ids]
        shown = [symbol for t, symbol in zip(ids, tokens) if t != self.bos]  # (as fairseq's Dictionary.string)
        if self._sentencepiece:
            text = "".join(shown).replace("\u2581", " ").strip()  # fairseq's --bpe sentencepiece decoding
        else:
            text = " ".join(shown)
        attention = None
        if hypothesis.attention is not None:
            attention = hypothesis.attention[:, -source_length:].tolist()  # the source's own positions (left-padded)
        return TranslationHypothesis(tokens, text, hypothesis.score, attention)


def _head(source: str, words: int) -> Tuple[str, Optional[int]]:
    """``source`` itself and None if it has at most ``words`` words; else its first ``words`` words and how many it
    has, counted 64 KiB at a time (a list of every word would take many times the line's size)."""
    end = None
    for count, match in enumerate(_WORD.finditer(source), 1):
        if count > words:
            break
        end = match.end()
    else:
        return source, None
    total, start = words, end
    while start < len(source):
        space = _SPACE.search(source, min(start + 2**16, len(source)))  # (a chunk ends between two words)
        stop = space.start() if space else len(source)
        total += len(source[start:stop].split())
        start = stop + 1
    return source[:end], total


def _whole(name: str, value, least: int) -> int:
    """``value`` as an int, if it is a whole number of at least ``least``; else TypeError or ValueError naming it."""
    try:
        whole = operator.index(value)  # (an int or a numpy integer; a float is refused)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None
    if whole < least:
        raise ValueError(f"{name} must be at least {least}, got {whole}")
    return whole


def _check_sources(sources) -> List[str]:
    """``sources`` as a list (a generator read once); TypeError unless it holds strings (one string, or bytes, is
    not a list of them)."""
    if isinstance(sources, (str, bytes)):
        raise TypeError(f"sources must be a list of strings, got one {type(sources).__name__}: pass [source]")
    sources = list(sources)
    for i, source in enumerate(sources):
        if not isinstance(source, str):
            raise TypeError(f"sources[{i}] must be a str, got {type(source).__name__} {source!r:.80}")
    return sources


def _threads(threads) -> int:
    """``threads`` if it is a whole number from 1 to the CPUs this machine has (more would only contend, and
    thousands make OpenMP fail or crash); else TypeError or ValueError naming it."""
    threads, cpus = _whole("threads", threads, least=1), os.cpu_count() or 1
    if threads > cpus:
        raise ValueError(f"threads must be at most {cpus}, the CPUs this machine has; got {threads}")
    return threads


def _device(name) -> torch.device:
    """torch's device of that name, if this torch can use it; else ValueError naming it."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device {name!r}: {error}") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {name!r}: the runtime decodes on cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: this torch sees no CUDA GPU (torch.cuda.is_available() is False)")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r}: this torch sees {torch.cuda.device_count()} CUDA GPUs, numbered from 0")
    return device
