"""``python -m convs2s_runtime MODEL_DIR``: translate the lines of stdin to stdout, one line for each, in order.

Lines are translated as they arrive, the ones waiting together (at most ``--batch-size``): a line written alone is
answered at once. A byte-order mark before the first line and a CR before each newline are not read as text. An
empty line gives an empty line; a line longer than the model's source positions is cut to them with a warning on
stderr; bytes that are not UTF-8 are read as U+FFFD, with a warning; no line is ever dropped.
Sentencepiece is applied when the folder has a model; the output is the best hypothesis's text, or with ``--nbest N``
the N best of each line, best first, as ``LINE<TAB>SCORE<TAB>TEXT`` (LINE counts the input lines from 0, as
fairseq's ids; SCORE is the API's, fairseq's score in natural log, where fairseq-generate prints base 2; an empty
line's N lines have no score and no text). A line too short for ``--min-len`` under ``--max-len-a`` and
``--max-len-b`` is answered as an empty line, with a warning. An interrupt (exit 130) says how many lines were
answered before it, a reader that goes away (``| head``) ends the run quietly (exit 141, as SIGPIPE would), and
settings no line can meet end it in one line (exit 1).
"""

import argparse
import codecs
import collections
import logging
import os
import select
import sys
from typing import Iterator, List, Optional

from .translator import Translator

logger = logging.getLogger("convs2s_runtime")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m convs2s_runtime", description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir", help="a folder written by python -m fairseq_convs2s.export")
    p.add_argument("--beam", type=int, default=5, help="beam size (default 5)")
    p.add_argument(
        "--batch-size", type=int, default=64, help="at most this many waiting lines decoded together (default 64)"
    )
    p.add_argument("--device", default="cpu", help="torch's device name: cpu (default), cuda, cuda:1, ...")
    p.add_argument("--bf16", action="store_true", help="decode in bfloat16 where the device has it")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--max-len-a", type=float, default=0.0, help="hypotheses at most a * source length + b tokens")
    p.add_argument("--max-len-b", type=int, default=200)
    p.add_argument("--min-len", type=int, default=1, help="hypotheses at least this many tokens (default 1)")
    p.add_argument("--lenpen", type=float, default=1.0, help="scores divided by length ** lenpen (default 1)")
    p.add_argument(
        "--nbest",
        type=int,
        default=None,
        help="write the N best hypotheses of each line, best first, as LINE<TAB>SCORE<TAB>TEXT (LINE from 0; "
        "SCORE in natural log, where fairseq prints base 2)",
    )
    args = p.parse_args(argv)
    for flag in ("beam", "batch_size", "threads", "nbest"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    if args.nbest is not None and args.nbest > args.beam:
        p.error(f"--nbest {args.nbest} asks for more hypotheses than --beam {args.beam} keeps")
    closed = [name for name in ("stdin", "stdout") if getattr(sys, name) is None]
    if closed:
        p.error(f"{' and '.join(closed)} closed: the command reads lines from stdin and writes to stdout")
    written = 0  # lines answered on stdout
    try:
        compute_type = "bfloat16" if args.bf16 else "float32"
        translator = Translator(args.model_dir, args.device, compute_type, threads=args.threads)
        longest = translator.max_hypothesis_length_of_any(args.max_len_a, args.max_len_b)
        if longest < args.min_len:
            raise ValueError(
                f"--max-len-a {args.max_len_a} --max-len-b {args.max_len_b} allow no line a hypothesis of "
                f"--min-len {args.min_len} tokens (at most {longest}; the model's target positions allow "
                f"{translator.model.max_target_positions - 1})"
            )
        for answers in _answers(translator, sys.stdin.fileno(), args):
            sys.stdout.write("".join(line + "\n" for lines in answers for line in lines))
            sys.stdout.flush()
            written += len(answers)
        return 0
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (the exit's own flush has nowhere to fail)
        return 141
    except (ValueError, OSError) as e:  # (ModelDirError is a ValueError)
        done = f" (after writing the translations of the first {written} lines)" if written else ""
        print(f"convs2s_runtime: error: {e}{done}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            f"convs2s_runtime: interrupted after writing the translations of the first {written} lines", file=sys.stderr
        )
        return 130


def _answers(translator: Translator, fd: int, args) -> Iterator[List[List[str]]]:
    """The answers to the lines read from ``fd``, a batch of lines at a time, in order, each a list of output lines:
    the best hypothesis's text (an empty line's is empty, as is that of a line too short for ``--min-len``), or
    with ``--nbest`` its ``LINE<TAB>SCORE<TAB>TEXT`` lines."""
    first = 0  # the number of the batch's first line
    for batch in _batches(fd, args.batch_size):
        todo = [i for i, line in enumerate(batch) if line.strip() and _fits(translator, first + i + 1, line, args)]
        results = translator.translate_batch(
            [batch[i] for i in todo],
            args.beam,
            args.max_len_a,
            args.max_len_b,
            args.lenpen,
            nbest=args.nbest or 1,
            min_len=args.min_len,
            source_names=[f"line {first + i + 1}" for i in todo],
        )
        hypotheses = [[] for _ in batch]
        for i, result in zip(todo, results):
            hypotheses[i] = result.hypotheses
        if args.nbest is None:
            yield [[found[0].text if found else ""] for found in hypotheses]
        else:
            yield [
                [f"{first + i}\t{h.score}\t{h.text}" if h else f"{first + i}\t\t" for h in found or [None] * args.nbest]
                for i, found in enumerate(hypotheses)
            ]
        first += len(batch)


def _fits(translator: Translator, number: int, line: str, args) -> bool:
    """Whether line ``number`` may have a hypothesis of ``--min-len`` tokens; if not, a warning says so. Without
    ``--max-len-a`` every line's limit is the same, checked before any line is read: nothing is encoded here."""
    if args.max_len_a == 0:
        return True
    longest = translator.max_hypothesis_length(line, args.max_len_a, args.max_len_b)
    if longest >= args.min_len:
        return True
    logger.warning(
        f"line {number}: its hypotheses may have at most {longest} tokens (--max-len-a {args.max_len_a} times its "
        f"tokens + --max-len-b {args.max_len_b}), fewer than --min-len {args.min_len}: answered with an empty line"
    )
    return False


def _batches(fd: int, batch_size: int) -> Iterator[List[str]]:
    """The lines read from ``fd`` in batches: the next line and those that have already arrived after it, at most
    ``batch_size``. A process that writes one line to the pipe and waits gets its answer (a batch that waited to fill
    would never come); a file fills every batch. Lines are UTF-8: bytes that are not are read as U+FFFD, with a
    warning, and the line is answered."""
    lines, number = _Lines(fd), 0
    while (raw := lines.next(wait=True)) is not None:
        batch: List[str] = []
        while raw is not None:
            number += 1
            batch.append(_decoded(number, raw))
            if len(batch) == batch_size:
                break
            raw = lines.next(wait=False)
        yield batch


class _Lines:
    """The lines of a file descriptor as they arrive (bytes, without their newline), read by the thread that asks:
    an interrupt lands in the read or the select that waits for input."""

    def __init__(self, fd: int):
        self.fd, self.pending, self.ready, self.ended = fd, bytearray(), collections.deque(), False

    def next(self, wait: bool) -> Optional[bytes]:
        """The next line: waiting for it (None at the end of input), or only if it has arrived (else None)."""
        while not self.ready and not self.ended:
            if not wait and (os.name == "nt" or not select.select([self.fd], [], [], 0)[0]):
                return None  # (Windows selects sockets only: there a batch holds what one read brought)
            chunk = os.read(self.fd, 1 << 16)  # (what is there, at least a byte, or b"" at the end)
            if not chunk:
                self.ended = True
                if self.pending:  # (a last line without its newline)
                    self.ready.append(bytes(self.pending))
                break
            self.pending += chunk
            if b"\n" not in chunk:  # (a line longer than a read: split once its end has come, not at every read)
                continue
            *lines, rest = self.pending.split(b"\n")
            self.ready.extend(bytes(line) for line in lines)
            self.pending = bytearray(rest)
        return self.ready.popleft() if self.ready else None


def _decoded(number: int, raw: bytes) -> str:
    """Line ``number`` as text, without its line end, nor the byte-order mark that starts the first line of a file
    some Windows editors save (it read as a character of the first word: one <unk>)."""
    if number == 1:
        raw = raw.removeprefix(codecs.BOM_UTF8)
    try:
        return raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as e:
        logger.warning(f"line {number} is not UTF-8 ({e.reason} at byte {e.start}): read with U+FFFD in its place")
        return raw.decode("utf-8", errors="replace").rstrip("\r\n")


if __name__ == "__main__":
    sys.exit(main())
