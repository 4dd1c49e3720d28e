"""Gigaword headline generation with ConvS2S (paper sections 4.1 and 6.3): articles to ROUGE-1/2/L.

    python examples/gigaword/run.py                     # download the harvardnlp/sent-summary data, then the rest
    python examples/gigaword/run.py --raw-dir DIR       # local files: {train,dev,test}.{src,tgt}.txt
    python examples/gigaword/run.py --duc-source input.txt --duc-refs task1_ref0.txt task1_ref1.txt \\
        task1_ref2.txt task1_ref3.txt                   # DUC-2004 as well (licensed by NIST; not downloaded)

The source ("src") is an article's first sentence, the target ("tgt") its headline. See
examples/gigaword/README.md for the data, the settings and the numbers to expect.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recipes.download import extract, fetch  # noqa: E402
from recipes.pipeline import EvalSet, Recipe, main  # noqa: E402
from recipes.text import DataError  # noqa: E402

# Rush et al.'s (2015) Gigaword data as harvardnlp/sent-summary published it, in the "org_data" layout that
# microsoft/unilm repackaged (the archive the Hugging Face and TensorFlow "gigaword" datasets download)
ARCHIVE = "https://drive.usercontent.google.com/download?id=1USoQ8lJgN8kAWnUnRrupMGrPMLlDVqlV&export=download&confirm=t"

# DUC-2004 (paper): outputs of at least 14 words, scored by ROUGE recall on their first 75 bytes
DUC_MIN_LEN = 14
DUC_RECALL_BYTES = 75


def download(folder: Path, mirror=None) -> Path:
    archive = fetch(ARCHIVE, folder, name="gigaword.tar.gz", mirror=mirror)
    return extract(archive, folder / "gigaword") / "org_data"


def unify_unk(line: str) -> str:
    # train and dev write unknown words as "<unk>", test as "UNK": one spelling, so the model learns to emit
    # the token the test references contain (and sentencepiece does not split "<unk>" into "<", "unk", ">")
    return line.replace("<unk>", "UNK")


def add_args(parser):
    parser.add_argument("--duc-source", type=Path, help="DUC-2004 articles, one first sentence a line")
    parser.add_argument("--duc-refs", type=Path, nargs="+", help="DUC-2004 reference headlines (4 files)")
    parser.add_argument(
        "--duc-min-len",
        type=int,
        default=DUC_MIN_LEN,
        help="minimum output length on DUC in subword tokens, fairseq-generate --min-len (default: %(default)s)",
    )


def duc_eval_sets(args):
    """The DUC-2004 test set of --duc-source and --duc-refs; a flag without the other, or a file that is not there, is
    refused before any stage runs (one line, run.py: error: ...)."""
    if not args.duc_source:
        if args.duc_refs:
            raise DataError("--duc-refs needs --duc-source, the articles they are the headlines of")
        return []
    if not args.duc_refs:
        raise DataError("--duc-source needs --duc-refs, its reference headlines")
    for path in (args.duc_source, *args.duc_refs):
        if not path.is_file():
            raise DataError(f"{path} not found")
    return [
        EvalSet(
            "duc2004",
            source=args.duc_source,
            references=args.duc_refs,
            min_len=args.duc_min_len,
            rouge_recall_bytes=DUC_RECALL_BYTES,
        )
    ]


RECIPE = Recipe(
    name="gigaword",
    langs=("src", "tgt"),
    raw_prefixes={"train": "train", "valid": "dev", "test": "test"},
    raw_pattern="{prefix}.{lang}.txt",
    download=download,
    fix_line=unify_unk,
    max_valid_lines=10000,  # the dev set has 189,651 pairs; validating on all of them every epoch buys nothing
    vocab_size=30000,  # the paper's 30k (joint: article and headline are both English)
    character_coverage=1.0,
    max_len_ratio=None,  # a headline is much shorter than its article by design
    arch="convs2s_gigaword",
    train_flags=["--lr", "0.25", "--dropout", "0.2", "--max-tokens", "4000"],
    average_last=5,
    metric="rouge",
    add_args=add_args,
    extra_eval_sets=duc_eval_sets,
    reference=(
        "the paper reports ROUGE-1/2/L 35.88/17.48/33.29 on Gigaword (F1) and 30.44/10.84/26.90 on DUC-2004 "
        "(recall at 75 bytes), computed with the ROUGE-1.5.5 perl script"
    ),
)

if __name__ == "__main__":
    main(RECIPE, __doc__)
