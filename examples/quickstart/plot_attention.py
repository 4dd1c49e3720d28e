"""Draw the decoder's attention for one translation as a heat map (source on x, target on y).

    python examples/quickstart/plot_attention.py [--out outputs/quickstart] [--png FILE] "two cats follow the old man"

draws it with the model a finished quickstart (examples/quickstart/run.py) left in --out; the quickstart calls
:func:`plot_attention` itself for its last stage.
"""

import argparse
import sys
from pathlib import Path


def plot_attention(checkpoint_dir: Path, data_dir: Path, spm_model: Path, sentence: str, png: Path) -> None:
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fairseq_convs2s import ConvS2SModel

    hub = ConvS2SModel.from_pretrained(
        str(checkpoint_dir),
        checkpoint_file="checkpoint_best.pt",
        data_name_or_path=str(data_dir),
        bpe="sentencepiece",
        sentencepiece_model=str(spm_model),
        source_lang="src",
        target_lang="tgt",
        cpu=True,
    )
    hub.eval()
    for model in hub.models:
        model.decoder.make_generation_fast_(need_attn=True)  # the hub prepared it without attention
    src_tokens = hub.encode(sentence)
    best = hub.generate([src_tokens], beam=5)[0][0]
    attention = best["attention"].float().numpy()  # src_len x tgt_len
    src_labels = [hub.src_dict[t] for t in src_tokens.tolist()]
    tgt_labels = [hub.tgt_dict[t] for t in best["tokens"].tolist()]

    fig, ax = plt.subplots(figsize=(0.45 * len(src_labels) + 2, 0.45 * len(tgt_labels) + 2))
    ax.imshow(attention.T, cmap="Greys", aspect="auto", vmin=0.0)
    ax.set_xticks(range(len(src_labels)), src_labels, rotation=90)
    ax.set_yticks(range(len(tgt_labels)), tgt_labels)
    ax.set_xlabel("source (sentencepiece)")
    ax.set_ylabel("translation")
    ax.set_title(f"ConvS2S attention, averaged over layers\n{hub.decode(best['tokens'])}", fontsize=9)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sentence", help="a sentence of the quickstart's source language")
    parser.add_argument("--out", type=Path, default=Path("outputs/quickstart"), help="a finished quickstart's --out")
    parser.add_argument("--png", type=Path, help="the picture to write (default: OUT/attention-own.png)")
    args = parser.parse_args(argv)
    needed = [args.out / "checkpoints" / "checkpoint_best.pt", args.out / "data-bin" / "dict.src.txt"]
    needed.append(args.out / "spm" / "spm.model")
    for path in needed:
        if not path.exists():
            parser.error(f"{path} not found: run examples/quickstart/run.py --out {args.out} first")
    png = args.png or args.out / "attention-own.png"
    plot_attention(needed[0].parent, needed[1].parent, needed[2], args.sentence, png)
    print(png)


if __name__ == "__main__":
    sys.exit(main())
