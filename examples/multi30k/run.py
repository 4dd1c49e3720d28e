"""Multi30k (task 1, English-German image descriptions) with ConvS2S: raw text to sacrebleu on test_2016_flickr.

    python examples/multi30k/run.py                                    # download from github.com/multi30k/dataset
    python examples/multi30k/run.py --raw-dir ../shared/data/multi30k  # local files: train.en, val.en, ...
    python examples/multi30k/run.py --source-lang de --out outputs/multi30k_de_en   # German to English

29,000 training pairs: the corpus one machine, even a laptop CPU, can train a real translation model on.
See examples/multi30k/README.md for the measured result and the options.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recipes.download import fetch  # noqa: E402
from recipes.pipeline import Recipe, main  # noqa: E402

URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw/{prefix}.{lang}.gz"
PREFIXES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}


def download(folder: Path, mirror=None) -> Path:
    for prefix in PREFIXES.values():
        for lang in ("en", "de"):
            fetch(URL.format(prefix=prefix, lang=lang), folder, mirror=mirror)
    return folder  # the pipeline reads the .gz files directly


RECIPE = Recipe(
    name="multi30k",
    langs=("en", "de"),
    raw_prefixes=PREFIXES,
    download=download,
    # 8k joint pieces: Multi30k has about 10k English and 18k German word types; published systems use
    # joint BPE vocabularies of about 8k-10k on it
    vocab_size=8000,
    max_len_ratio=None,  # a clean, sentence-aligned corpus: nothing to filter but empty or overlong lines
    arch="convs2s_iwslt_de_en",  # 4 + 3 blocks of 256: the width that fits 29k sentences and a CPU
    train_flags=["--lr", "0.25", "--dropout", "0.2", "--max-tokens", "4000", "--max-epoch", "40"],
    # without a budget: 5,000 updates, past where the plateau rule stops (about 3,500) and still improving; and
    # one embedding table (README, "One embedding table")
    update_budget=5000,
    share_embeddings=True,
    average_last=5,
    reference="no ConvS2S number in the paper; see examples/multi30k/README.md for this recipe's measured BLEU",
)

if __name__ == "__main__":
    main(RECIPE, __doc__)
