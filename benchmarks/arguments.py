"""argparse types of the benchmarks' command lines: a size list or a data folder a tool cannot use is a usage error
in one line (``real_batches.py: error: argument data_bin: ...``), not a KeyError or FileNotFoundError traceback
once the tool has started."""

import argparse
import subprocess
from pathlib import Path

from .pair import SIZES


def size_names(text: str) -> str:
    """``--sizes``: comma-separated names of ``pair.SIZES``, returned as given (the tools split it)."""
    unknown = [name for name in text.split(",") if name not in SIZES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown size {unknown[0]!r}: choose from {', '.join(sorted(SIZES))}")
    return text


def data_bin(text: str) -> str:
    """A fairseq-preprocess folder (its dict.*.txt), or several joined by ':' as fairseq reads them."""
    for folder in map(Path, text.split(":")):
        if not folder.is_dir():
            raise argparse.ArgumentTypeError(f"{folder}: no such folder")
        if not any(folder.glob("dict.*.txt")):
            raise argparse.ArgumentTypeError(f"{folder} holds no dict.*.txt: not a fairseq-preprocess folder")
    return text


def data_bin_path(text: str) -> Path:
    return Path(data_bin(text))


def checkpoint_file(text: str) -> str:
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    return text


def names_of(choices, what: str = "variant"):
    """A type for a comma-separated list of ``choices``' names (``--variants``, ``--dtypes``), returned as given."""

    def names(text: str) -> str:
        unknown = [name for name in text.split(",") if name not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {unknown[0]!r}: choose from {', '.join(choices)}")
        return text

    return names


def positive_int(text: str) -> int:
    """A count that must be at least 1 (``--rounds``, ``--repeats``, ``--updates``, ``--batch``, ...)."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def positive_ints(text: str) -> str:
    """A comma-separated list of positive integers (``--batches``, ``--threads``), returned as given."""
    for item in text.split(","):
        if not item.strip().isdigit() or int(item) < 1:
            raise argparse.ArgumentTypeError(f"{item!r} is not a positive integer (comma-separated: 1,16,128)")
    return text


def git_revision(text: str) -> str:
    """A commit of this repository's history, as git names it (``HEAD~1``, a hash), returned as given."""
    root = Path(__file__).resolve().parent.parent
    known = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{text}^{{commit}}"], cwd=root, capture_output=True
    )
    if known.returncode != 0:
        raise argparse.ArgumentTypeError(f"{text!r}: not a commit of this repository")
    return text


def recipe_folder(text: str) -> str:
    """A recipe's output folder (``examples/*/run.py --out``): its ``data-bin``, ``spm/spm.model`` and ``raw`` text."""
    folder = Path(text)
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{folder}: no such folder")
    for part in ("data-bin", "spm/spm.model", "raw"):
        if not (folder / part).exists():
            raise argparse.ArgumentTypeError(f"{folder} holds no {part}: not a recipe's output folder")
    return text


def device_name(text: str) -> str:
    """``--device``: ``cuda`` only where torch has a CUDA device (argparse's ``choices`` check the name)."""
    import torch

    if text == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"cuda: torch {torch.__version__} has no CUDA device here")
    return text
