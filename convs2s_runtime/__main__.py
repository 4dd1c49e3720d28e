"""``python -m convs2s_runtime MODEL_DIR``: translate the lines of stdin to stdout, one line for each, in order.

An empty line gives an empty line; a line longer than the model's source positions is cut to them with a warning on
stderr; no line is ever dropped. Sentencepiece is applied when the folder has a model; the output is the best
hypothesis's text. Translations are written a batch at a time: an interrupt (exit 130) says how many lines were
answered before it, a reader that goes away (``| head``) ends the run quietly (exit 141, as SIGPIPE would), and
settings no line can meet end it in one line (exit 1).
"""

import argparse
import itertools
import os
import sys
from typing import Iterator, List

from .translator import Translator


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m convs2s_runtime", description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir", help="a folder written by python -m fairseq_convs2s.export")
    p.add_argument("--beam", type=int, default=5, help="beam size (default 5)")
    p.add_argument("--batch-size", type=int, default=64, help="lines decoded together (default 64)")
    p.add_argument("--bf16", action="store_true", help="decode in bfloat16 where the CPU has it")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--max-len-a", type=float, default=0.0, help="hypotheses at most a * source length + b tokens")
    p.add_argument("--max-len-b", type=int, default=200)
    p.add_argument("--min-len", type=int, default=1, help="hypotheses at least this many tokens (default 1)")
    p.add_argument("--lenpen", type=float, default=1.0, help="scores divided by length ** lenpen (default 1)")
    args = p.parse_args(argv)
    for flag in ("beam", "batch_size", "threads"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    written = 0  # lines answered on stdout
    try:
        translator = Translator(
            args.model_dir, compute_type="bfloat16" if args.bf16 else "float32", threads=args.threads
        )
        for out in _answers(translator, sys.stdin, args):
            sys.stdout.write("".join(line + "\n" for line in out))
            sys.stdout.flush()
            written += len(out)
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


def _answers(translator: Translator, stream, args) -> Iterator[List[str]]:
    """The best hypothesis's text for each line of ``stream``, a batch of lines at a time, in order; an empty line's
    is empty."""
    lines = (line.rstrip("\n") for line in stream)
    while chunk := list(itertools.islice(lines, args.batch_size)):
        todo = [i for i, line in enumerate(chunk) if line.strip()]
        results = translator.translate_batch(
            [chunk[i] for i in todo], args.beam, args.max_len_a, args.max_len_b, args.lenpen, min_len=args.min_len
        )
        out = [""] * len(chunk)
        for i, result in zip(todo, results):
            out[i] = result.hypotheses[0].text
        yield out


if __name__ == "__main__":
    sys.exit(main())
