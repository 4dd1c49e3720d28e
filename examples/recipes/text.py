"""Plain-text stages of a recipe: read raw files, normalize, learn a joint sentencepiece model, encode and filter.

Everything streams in chunks, so the same code handles Multi30k's 29,000 pairs and WMT'14 En-Fr's 36 million.
"""

import contextlib
import gzip
import itertools
import re
import unicodedata
import zlib
from pathlib import Path
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

CHUNK_LINES = 100_000

# C0/C1 control characters except tab; what Moses' remove-non-printing-char.perl strips, besides zero-width marks
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028\u2029\ufeff]")
_SPACES = re.compile(r"\s+")


class DataError(ValueError):
    """A corpus the recipe cannot use as given: a file missing, two sides that do not align, a download or an
    archive that fails. The driver reports it in one line (``run.py: error: ...``), not a traceback."""


@contextlib.contextmanager
def open_text(path: Path) -> Iterator[Iterator[str]]:
    """The lines of a UTF-8 text file, gzipped or not (by its ``.gz`` suffix), as a context manager.

    A line that is not UTF-8 (a Latin-1 corpus) or a ``.gz`` that cannot be decompressed (cut short, or not gzip at
    all) is a :class:`DataError` naming the file, not U+FFFD in the data nor a traceback."""
    with _opener(path)(path, "rt", encoding="utf-8", newline="\n") as f:
        yield _checked_lines(path, f)


def _opener(path: Path):
    return gzip.open if path.suffix == ".gz" else open


def _checked_lines(path: Path, f) -> Iterator[str]:
    try:
        yield from f
    except UnicodeDecodeError:
        raise _not_utf8(path) from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:  # (raised only by gzip: a plain file has no such check)
        raise _not_gzip(path, e) from None


def _not_gzip(path: Path, error: Exception) -> DataError:
    return DataError(
        f"{path} cannot be decompressed ({type(error).__name__}: {error}): download or compress it again (a plain "
        "text file must not end in .gz)"
    )


def _not_utf8(path: Path) -> DataError:
    """The error for a file that is not UTF-8: its first bad line and how many there are (as scripts/check_utf8.py
    finds them: line by line, so the number is the line's, not a byte offset in a chunk)."""
    first, bad = None, 0
    try:
        with _opener(path)(path, "rb") as f:
            for number, line in enumerate(f, start=1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError:
                    first = first or number
                    bad += 1
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:  # (the lines up to the break are counted)
        if first is None:
            return _not_gzip(path, e)
    where = (
        f"line {first} is not valid UTF-8 ({bad} such line{'s' if bad > 1 else ''} in all)" if first else "not UTF-8"
    )
    listed = "" if path.suffix == ".gz" else f"; python scripts/check_utf8.py {path} lists them"
    return DataError(
        f"{path}: {where}: convert the file to UTF-8 (iconv -f LATIN1 -t UTF-8 when it is Latin-1{listed})"
    )


def find_raw_file(folder: Path, name: str) -> Path:
    """``folder/name``, or ``folder/name.gz`` when only the compressed file is there."""
    for candidate in (folder / name, folder / (name + ".gz")):
        if candidate.exists():
            return candidate
    raise DataError(f"{folder / name} (or {name}.gz) not found")


def normalize(line: str) -> str:
    """One sentence as the models see it: control characters dropped, whitespace runs collapsed, ends stripped.

    sentencepiece applies NFKC itself; this only removes what would otherwise become junk pieces.
    """
    return _SPACES.sub(" ", _CONTROL.sub("", unicodedata.normalize("NFC", line))).strip()


def read_pairs(src: Path, tgt: Path, limit: Optional[int] = None) -> Iterator[Tuple[str, str]]:
    """Aligned lines of two files; raises when one is missing or their line counts differ (a misaligned corpus)."""
    for path in (src, tgt):
        if not path.is_file():
            raise DataError(f"{path} not found")
    with open_text(src) as fs, open_text(tgt) as ft:
        for count, (s, t) in enumerate(itertools.zip_longest(fs, ft)):
            if limit is not None and count >= limit:
                return
            if s is None or t is None:
                raise DataError(
                    f"{src} and {tgt} have different numbers of lines ({src if s is None else tgt} "
                    f"ends after line {count})"
                )
            yield s.rstrip("\n"), t.rstrip("\n")


def chunks(items: Iterable, size: int = CHUNK_LINES) -> Iterator[list]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def write_normalized_pairs(
    pairs: Iterable[Tuple[str, str]], src_out: Path, tgt_out: Path, fix: Optional[Callable[[str], str]] = None
) -> int:
    """Normalize each pair (``fix`` first, if given) and write both sides; returns the number of pairs."""
    n = 0
    partial = [p.with_name(p.name + ".partial") for p in (src_out, tgt_out)]
    with open(partial[0], "w", encoding="utf-8") as fs, open(partial[1], "w", encoding="utf-8") as ft:
        for s, t in pairs:
            if fix is not None:
                s, t = fix(s), fix(t)
            fs.write(normalize(s) + "\n")
            ft.write(normalize(t) + "\n")
            n += 1
    # the final names only once both sides are complete: an interrupted run starts this split again
    partial[0].rename(src_out)
    partial[1].rename(tgt_out)
    return n


def train_sentencepiece(
    inputs: Sequence[Path],
    model_prefix: Path,
    vocab_size: int,
    model_type: str = "bpe",
    character_coverage: float = 1.0,
    threads: int = 2,
) -> Path:
    """One sentencepiece model over all ``inputs`` (source and target: a joint vocabulary); returns ``.model``."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        input=",".join(str(p) for p in inputs),
        model_prefix=str(model_prefix),
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        # WMT'14 En-Fr has 72M sentences; a random 2M of them learn the same merges in far less memory
        input_sentence_size=2_000_000,
        shuffle_input_sentence=True,
        num_threads=threads,
        # a tiny test corpus cannot always fill the requested vocabulary; shrink instead of failing
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return model_prefix.with_suffix(".model")


def encode_pairs(
    model: Path,
    src_in: Path,
    tgt_in: Path,
    src_out: Path,
    tgt_out: Path,
    max_tokens: Optional[int] = None,
    max_ratio: Optional[float] = None,
    threads: int = 2,
) -> Tuple[int, int]:
    """Encode a parallel split into space-separated pieces; returns (pairs kept, pairs read).

    With ``max_tokens``/``max_ratio`` a pair is dropped when either side is empty or longer than ``max_tokens``
    pieces, or when one side is more than ``max_ratio`` times longer than the other: the filters of Moses'
    ``clean-corpus-n.perl -ratio 1.5 ... 1 250`` that fairseq's prepare-wmt14 scripts apply after BPE.
    Without them every line is kept, empty ones included (test sets must keep their line numbering).
    """
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    kept = read = 0
    with open(src_out, "w", encoding="utf-8") as fs, open(tgt_out, "w", encoding="utf-8") as ft:
        for batch in chunks(read_pairs(src_in, tgt_in)):
            srcs = sp.encode([s for s, _ in batch], out_type=str, num_threads=threads)
            tgts = sp.encode([t for _, t in batch], out_type=str, num_threads=threads)
            for s, t in zip(srcs, tgts):
                read += 1
                if max_tokens is not None and not keep_pair(len(s), len(t), max_tokens, max_ratio):
                    continue
                fs.write(" ".join(s) + "\n")
                ft.write(" ".join(t) + "\n")
                kept += 1
    return kept, read


def keep_pair(src_len: int, tgt_len: int, max_tokens: int, max_ratio: Optional[float]) -> bool:
    if not (1 <= src_len <= max_tokens and 1 <= tgt_len <= max_tokens):
        return False
    return max_ratio is None or max(src_len / tgt_len, tgt_len / src_len) <= max_ratio


def read_lines(path: Path) -> List[str]:
    with open_text(path) as f:
        return [line.rstrip("\n") for line in f]


def read_references(raw: Path, name: str, lang: str) -> List[List[str]]:
    """The reference streams of test set ``name``: ``raw/<name>.<lang>``, then any more as ``raw/<name>.<lang>.ref*``
    (the recipe's layout for a set with several references, DUC's)."""
    return [read_lines(p) for p in [raw / f"{name}.{lang}", *sorted(raw.glob(f"{name}.{lang}.ref*"))]]
