"""``python -m convs2s_runtime MODEL_DIR``: translate the lines of stdin to stdout, one line for each, in order.

An empty line gives an empty line; a line longer than the model's source positions is cut to them with a warning on
stderr; no line is ever dropped. Sentencepiece is applied when the folder has a model; the output is the best
hypothesis's text.
"""

import argparse
import itertools
import sys

from .model import ModelDirError
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
    p.add_argument("--lenpen", type=float, default=1.0, help="scores divided by length ** lenpen (default 1)")
    args = p.parse_args(argv)
    if args.beam < 1 or args.batch_size < 1:
        p.error("--beam and --batch-size must be at least 1")
    try:
        translator = Translator(
            args.model_dir, compute_type="bfloat16" if args.bf16 else "float32", threads=args.threads
        )
    except (ModelDirError, OSError) as e:
        print(f"convs2s_runtime: error: {e}", file=sys.stderr)
        return 1
    lines = (line.rstrip("\n") for line in sys.stdin)
    while True:
        chunk = list(itertools.islice(lines, args.batch_size))
        if not chunk:
            return 0
        todo = [i for i, line in enumerate(chunk) if line.strip()]
        results = translator.translate_batch(
            [chunk[i] for i in todo], args.beam, args.max_len_a, args.max_len_b, args.lenpen
        )
        out = [""] * len(chunk)
        for i, result in zip(todo, results):
            out[i] = result.hypotheses[0].text
        sys.stdout.write("".join(line + "\n" for line in out))
        sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
