"""WMT'14 English-German with ConvS2S (paper section 4.2): raw statmt.org data to sacrebleu on newstest2014.

    python examples/wmt14_en_de/run.py                          # download (several GB), then everything else
    python examples/wmt14_en_de/run.py --raw-dir DIR            # local files: {train,valid,test}.{en,de}
    python examples/wmt14_en_de/run.py --train-args "--fp16 --update-freq 2"

See examples/wmt14_en_de/README.md for the data, the settings and the numbers to expect.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recipes.download import wmt14_downloader  # noqa: E402
from recipes.pipeline import Recipe, main  # noqa: E402

# the WMT'14 data of fairseq's prepare-wmt14en2de.sh --icml17 (the ConvS2S paper's training set, 4.5M pairs)
download = wmt14_downloader(
    archives=[
        "http://statmt.org/wmt13/training-parallel-europarl-v7.tgz",
        "http://statmt.org/wmt13/training-parallel-commoncrawl.tgz",
        "http://statmt.org/wmt14/training-parallel-nc-v9.tgz",
        "http://statmt.org/wmt14/test-full.tgz",
    ],
    corpora=["training/europarl-v7.de-en", "commoncrawl.de-en", "training/news-commentary-v9.de-en"],
    langs=("en", "de"),
    test_sgm=("newstest2014-deen-src.en.sgm", "newstest2014-deen-ref.de.sgm"),
    valid_every=100,
)

RECIPE = Recipe(
    name="wmt14_en_de",
    langs=("en", "de"),
    raw_prefixes={"train": "train", "valid": "valid", "test": "test"},
    download=download,
    vocab_size=40000,  # joint, as the paper and fairseq's prepare script (40k BPE) use
    character_coverage=0.9999,  # web-crawled text: leave the rarest characters to <unk>, not to own pieces
    arch="convs2s_wmt_en_de",
    # fairseq's fconv_wmt_en_de flags: lr 0.5, dropout 0.2, 4000 tokens a batch (per GPU)
    train_flags=["--lr", "0.5", "--dropout", "0.2", "--max-tokens", "4000"],
    average_last=5,
    reference=(
        "the paper reports 25.16 BLEU on newstest2014 (26.43 for an ensemble), computed on tokenized text "
        "with multi-bleu.perl; detokenized sacrebleu, printed here, is usually lower"
    ),
)

if __name__ == "__main__":
    main(RECIPE, __doc__)
