"""A generated translation task and a token-level ConvS2S model on it, to try ``finetune.py`` on in minutes.

    python examples/sequence_risk/toy_task.py --out outputs/risk_toy --max-epoch 6
    python examples/sequence_risk/finetune.py outputs/risk_toy/data-bin outputs/risk_toy/token/checkpoint_last.pt \\
        --out outputs/risk_toy/finetune

The task (the tests' corpus, with longer sentences): each source word ``s<i>`` translates to ``t<i>`` and the
target is the source reversed, 3 to MAX_LEN words from a 24-word vocabulary. The model is a small
``convs2s_iwslt_de_en`` (2 + 2 blocks of 64) trained with label smoothing for --max-epoch epochs: few enough
that it is still far from the task's ceiling, so that there is room for fine-tuning to show.
"""

import argparse
import random
import subprocess
import sys
from pathlib import Path

USER_DIR = Path(__file__).resolve().parent.parent.parent / "fairseq_convs2s"
VOCAB, MIN_LEN, MAX_LEN = 24, 3, 20
SPLITS = {"train": 3000, "valid": 200, "test": 500}
MODEL = [
    "--arch", "convs2s_iwslt_de_en", "--encoder-layers", "[(64, 3)] * 2", "--decoder-layers", "[(64, 3)] * 2",
    "--encoder-embed-dim", "64", "--decoder-embed-dim", "64", "--decoder-out-embed-dim", "64", "--dropout", "0.0",
]  # fmt: skip


def write_corpus(raw: Path, seed: int) -> None:
    rng = random.Random(seed)
    raw.mkdir(parents=True, exist_ok=True)
    for split, n in SPLITS.items():
        sources = [[f"s{rng.randrange(VOCAB)}" for _ in range(rng.randint(MIN_LEN, MAX_LEN))] for _ in range(n)]
        (raw / f"{split}.src").write_text("".join(" ".join(s) + "\n" for s in sources))
        (raw / f"{split}.tgt").write_text("".join(" ".join("t" + w[1:] for w in reversed(s)) + "\n" for s in sources))


def run(cmd):
    print("$ " + " ".join(str(c) for c in cmd[2:]), flush=True)
    subprocess.run([str(c) for c in cmd], check=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("outputs/risk_toy"))
    parser.add_argument("--max-epoch", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    raw, data = args.out / "raw", args.out / "data-bin"
    if not (data / "dict.tgt.txt").exists():  # a second call goes on training (fairseq resumes checkpoint_last)
        write_corpus(raw, args.seed)
        run([sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", "src", "--target-lang", "tgt",
             "--trainpref", raw / "train", "--validpref", raw / "valid", "--testpref", raw / "test",
             "--destdir", data, "--joined-dictionary", "--workers", "1"])  # fmt: skip
    run([sys.executable, "-m", "fairseq_cli.train", data, "--user-dir", USER_DIR, *MODEL,
         "--optimizer", "nag", "--momentum", "0.99", "--lr", "0.25", "--clip-norm", "0.1",
         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--max-tokens", "2000",
         "--max-epoch", str(args.max_epoch), "--seed", str(args.seed), "--save-dir", args.out / "token",
         "--no-epoch-checkpoints", "--cpu", "--log-format", "simple", "--log-interval", "1000"])  # fmt: skip


if __name__ == "__main__":
    main()
