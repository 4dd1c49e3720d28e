"""WMT'14 English-French with ConvS2S (paper section 4.2): raw statmt.org data to sacrebleu on newstest2014.

    python examples/wmt14_en_fr/run.py                          # download (several GB), then everything else
    python examples/wmt14_en_fr/run.py --raw-dir DIR            # local files: {train,valid,test}.{en,fr}
    python examples/wmt14_en_fr/run.py --train-args "--fp16 --update-freq 2"

See examples/wmt14_en_fr/README.md for the data, the settings and the numbers to expect.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recipes.download import wmt14_downloader  # noqa: E402
from recipes.pipeline import Recipe, main  # noqa: E402

# the data of fairseq's prepare-wmt14en2fr.sh: 36M pairs before cleaning (the paper: 35.5M after)
download = wmt14_downloader(
    archives=[
        "http://statmt.org/wmt13/training-parallel-europarl-v7.tgz",
        "http://statmt.org/wmt13/training-parallel-commoncrawl.tgz",
        "http://statmt.org/wmt13/training-parallel-un.tgz",
        "http://statmt.org/wmt14/training-parallel-nc-v9.tgz",
        "http://statmt.org/wmt10/training-giga-fren.tar",
        "http://statmt.org/wmt14/test-full.tgz",
    ],
    corpora=[
        "training/europarl-v7.fr-en",
        "commoncrawl.fr-en",
        "un/undoc.2000.fr-en",
        "training/news-commentary-v9.fr-en",
        "giga-fren.release2.fixed",  # shipped as .gz inside the .tar; read compressed
    ],
    langs=("en", "fr"),
    test_sgm=("newstest2014-fren-src.en.sgm", "newstest2014-fren-ref.fr.sgm"),
    valid_every=1333,
)

RECIPE = Recipe(
    name="wmt14_en_fr",
    langs=("en", "fr"),
    raw_prefixes={"train": "train", "valid": "valid", "test": "test"},
    download=download,
    vocab_size=40000,  # joint, as the paper and fairseq's prepare script (40k BPE) use
    character_coverage=0.9999,
    arch="convs2s_wmt_en_fr",
    # fairseq's fconv_wmt_en_fr flags: lr 0.5, dropout 0.1, 3000 tokens a batch (per GPU)
    train_flags=["--lr", "0.5", "--dropout", "0.1", "--max-tokens", "3000"],
    average_last=5,
    reference=(
        "the paper reports 40.51 BLEU on newstest2014 (41.62 for an ensemble), computed on tokenized text "
        "with multi-bleu.perl; detokenized sacrebleu, printed here, is usually lower"
    ),
)

if __name__ == "__main__":
    main(RECIPE, __doc__)
