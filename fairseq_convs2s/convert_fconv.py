"""Turn a fairseq ``fconv`` checkpoint into a ``convs2s`` one that gives the same outputs.

    python -m fairseq_convs2s.convert_fconv IN.pt OUT.pt

What is kept and which older formats are read: ``models/fconv_checkpoint.py``, which does the conversion. The
optimizer state is not carried over: the output is for generation or for fine-tuning with a fresh optimizer.
Nothing is written unless the whole conversion succeeds.
"""

import argparse
import os
import sys

from .models.convs2s import ConvS2SModel
from .models.fconv_checkpoint import ConversionError, convert_checkpoint, read_checkpoint, save_atomically


def check_output_path(in_path: str, out_path: str) -> None:
    """Refuse, before any reading, an ``out_path`` that cannot take the converted checkpoint: none (""), a
    directory (or a path ending in '/'), one in a directory that does not exist, or the fconv checkpoint itself
    (which the conversion would replace)."""
    if not out_path:
        raise ConversionError("no output file named: name the file to write, e.g. convs2s/checkpoint_best.pt")
    if os.path.isdir(out_path):
        example = os.path.join(out_path, "model.pt")
        raise ConversionError(f"{out_path} is a directory: name the file to write, e.g. {example}")
    if out_path.endswith(("/", os.sep)):  # (the directory part of abspath below drops the slash: not checked there)
        raise ConversionError(
            f"{out_path} names a directory, and there is none: name the file to write in an existing one"
        )
    out_dir = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(out_dir):
        raise ConversionError(f"{out_path}: no such directory {out_dir}")
    if os.path.exists(in_path) and os.path.exists(out_path) and os.path.samefile(in_path, out_path):
        raise ConversionError(f"{out_path} is the fconv checkpoint being converted: write the convs2s one elsewhere")


def convert_file(in_path: str, out_path: str) -> None:
    """Read ``in_path``, convert, write ``out_path`` atomically (a temporary file renamed when complete)."""
    check_output_path(in_path, out_path)
    checkpoint = convert_checkpoint(read_checkpoint(in_path), ConvS2SModel)  # (a broken file named in one line)
    try:
        save_atomically(checkpoint, out_path)
    except OSError as e:  # a directory without write permission, a full disk
        raise ConversionError(f"cannot write {out_path}: {e.strerror or e}") from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fairseq_convs2s.convert_fconv", description=__doc__.split("\n")[0])
    parser.add_argument("input", help="fconv checkpoint (.pt)")
    parser.add_argument("output", help="where to write the convs2s checkpoint")
    args = parser.parse_args(argv)
    try:
        convert_file(args.input, args.output)
    except ConversionError as e:
        print(f"convert_fconv: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.output}; use it with --user-dir fairseq_convs2s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
