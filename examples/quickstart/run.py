"""The whole pipeline a user of this plugin runs, on a generated corpus, in a few minutes on 2 CPU cores.

    python examples/quickstart/run.py [--out outputs/quickstart] [--max-epoch 8]

Stages (each skipped when its output is already there, made with the same flags: OUT/settings.json; another
--vocab-size or --max-epoch into a finished --out stops with one line): corpus, sentencepiece, fairseq-preprocess,
fairseq-train (--arch convs2s_iwslt_de_en), fairseq-generate scored with sacrebleu, fairseq-interactive,
an attention heat map (PNG). Everything lands in the --out folder.
"""

import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
USER_DIR = HERE.parent.parent / "fairseq_convs2s"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from recipes.commands import OutLock, alone_in, child_options, errors_in_one_line, failure, fairseq, stage  # noqa: E402
from recipes.pipeline import count, out_dir  # noqa: E402
from recipes.settings import RunSettings, folders  # noqa: E402
from toy_corpus import make_corpus  # noqa: E402

SPLITS = {"train": 8000, "valid": 400, "test": 500}
INTERACTIVE_INPUT = [
    "the small dog sees a red ball in the garden",
    "two cats follow the old man",
    "a happy child paints the blue house and the woman watches three birds",
]


def run(cmd, lock: OutLock, **kwargs):
    """Run a command, holding the ``lock`` on OUT; :class:`recipes.commands.CommandFailed` when it fails, after any
    output it captured."""
    cmd = [str(c) for c in cmd]
    print("$ " + " ".join(cmd), flush=True)
    result = subprocess.run(cmd, **kwargs, **child_options(lock))  # (it stops when this script dies)
    if result.returncode != 0:
        if kwargs.get("capture_output"):  # its own words say why
            sys.stderr.write(result.stdout[-3000:] + result.stderr[-3000:])
        raise failure(cmd, result.returncode, None)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=out_dir, default=Path("outputs/quickstart"))
    parser.add_argument("--max-epoch", type=count, default=5)
    parser.add_argument("--vocab-size", type=count, default=120)
    args = parser.parse_args()
    with errors_in_one_line(parser.prog), alone_in(args.out.resolve()) as lock:  # (one command at a time in an --out)
        run_stages(args, lock)


def run_stages(args: argparse.Namespace, lock: OutLock) -> None:
    """The seven stages, each skipped when its output is there."""
    out = args.out.resolve()
    raw, spm_dir, bin_dir, ckpt = out / "raw", out / "spm", out / "data-bin", out / "checkpoints"
    started = time.time()
    settings = RunSettings(out)
    pieces = {"vocab_size": args.vocab_size}
    trained = {**pieces, "max_epoch": args.max_epoch}
    redo = f"delete {folders(out, spm_dir, bin_dir, ckpt)} to redo them"
    settings.refuse_changed("sentencepiece", pieces, spm_dir, redo)
    settings.refuse_changed("preprocess", pieces, bin_dir, redo)
    if (ckpt / "train.done").exists():
        settings.refuse_changed("train", trained, ckpt, f"delete {folders(out, ckpt)} to train anew")

    if stage("1/7 corpus", raw / "test.tgt"):
        raw.mkdir(parents=True, exist_ok=True)
        pairs = make_corpus(sum(SPLITS.values()), seed=1)
        start = 0
        for split, n in SPLITS.items():
            chunk = pairs[start : start + n]
            start += n
            (raw / f"{split}.src").write_text("".join(s + "\n" for s, _ in chunk))
            (raw / f"{split}.tgt").write_text("".join(t + "\n" for _, t in chunk))
        print(f"   {sum(SPLITS.values())} sentence pairs, e.g.\n   src: {pairs[0][0]}\n   tgt: {pairs[0][1]}")

    spm_model = spm_dir / "spm.model"
    if stage("2/7 sentencepiece (joint vocabulary)", spm_dir / "test.tgt"):
        import sentencepiece as spm

        spm_dir.mkdir(parents=True, exist_ok=True)
        spm.SentencePieceTrainer.train(
            input=f"{raw / 'train.src'},{raw / 'train.tgt'}",
            model_prefix=str(spm_dir / "spm"),
            vocab_size=args.vocab_size,
            character_coverage=1.0,
            model_type="unigram",
            hard_vocab_limit=False,  # a --vocab-size above what the corpus holds gives what it holds
            minloglevel=2,
        )
        sp = spm.SentencePieceProcessor(model_file=str(spm_model))
        for split in SPLITS:
            for side in ("src", "tgt"):
                lines = (raw / f"{split}.{side}").read_text().splitlines()
                encoded = [" ".join(sp.encode(line, out_type=str)) for line in lines]
                (spm_dir / f"{split}.{side}").write_text("".join(e + "\n" for e in encoded))
        settings.record("sentencepiece", pieces)

    # done with the last file fairseq-preprocess writes (the dictionaries come first): an interrupted one is redone
    if stage("3/7 fairseq-preprocess", bin_dir / "test.src-tgt.tgt.idx"):
        shutil.rmtree(bin_dir, ignore_errors=True)  # (what an interrupted one left)
        run(fairseq("preprocess") + [
            "--source-lang", "src", "--target-lang", "tgt", "--joined-dictionary",
            "--trainpref", spm_dir / "train", "--validpref", spm_dir / "valid", "--testpref", spm_dir / "test",
            "--destdir", bin_dir, "--workers", "2",
        ], lock)  # fmt: skip
        settings.record("preprocess", pieces)

    # done when training ends, not at the first checkpoint: an interrupted training resumes
    if stage("4/7 fairseq-train --arch convs2s_iwslt_de_en", ckpt / "train.done"):
        run(fairseq("train") + [
            bin_dir, "--user-dir", USER_DIR, "--arch", "convs2s_iwslt_de_en", "--cpu",
            "--optimizer", "nag", "--momentum", "0.99", "--lr", "0.25", "--clip-norm", "0.1",
            "--lr-scheduler", "reduce_lr_on_plateau", "--lr-shrink", "0.1", "--dropout", "0.1",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
            "--max-tokens", "2000", "--max-epoch", args.max_epoch, "--save-dir", ckpt,
            "--no-epoch-checkpoints", "--seed", "1", "--num-workers", "0",
        ], lock)  # fmt: skip
        (ckpt / "train.done").touch()
        settings.record("train", trained)
        for stale in ("generate-test.txt", "interactive.txt", "attention.png"):  # (an earlier model's)
            (out / stale).unlink(missing_ok=True)

    generate_log = out / "generate-test.txt"
    if stage("5/7 fairseq-generate (beam 5, sacrebleu on detokenized text)", generate_log):
        result = run(fairseq("generate") + [
            bin_dir, "--user-dir", USER_DIR, "--path", ckpt / "checkpoint_best.pt", "--cpu", "--gen-subset", "test",
            "--beam", "5", "--batch-size", "64", "--remove-bpe", "sentencepiece", "--scoring", "sacrebleu",
            "--required-batch-size-multiple", "1",  # else fairseq may drop the last sentences (issue 5036)
        ], lock, capture_output=True, text=True)  # fmt: skip
        generate_log.write_text(result.stdout)
    bleu = re.findall(r"BLEU = [\d.]+ .*", generate_log.read_text())
    print(f"   test set: {bleu[-1] if bleu else 'no BLEU line found'}  (full output: {generate_log})")

    interactive_log = out / "interactive.txt"
    if stage("6/7 fairseq-interactive (sentences on stdin)", interactive_log):
        result = run(fairseq("interactive") + [
            bin_dir, "--user-dir", USER_DIR, "--path", ckpt / "checkpoint_best.pt", "--cpu", "--beam", "5",
            "--source-lang", "src", "--target-lang", "tgt",
            "--bpe", "sentencepiece", "--sentencepiece-model", spm_model,
        ], lock, input="\n".join(INTERACTIVE_INPUT) + "\n", capture_output=True, text=True)  # fmt: skip
        interactive_log.write_text(result.stdout)
    for line in interactive_log.read_text().splitlines():
        if line.startswith(("S-", "D-")):
            print("   " + line)

    png = out / "attention.png"
    if stage("7/7 attention heat map", png):
        from plot_attention import plot_attention

        plot_attention(ckpt, bin_dir, spm_model, INTERACTIVE_INPUT[0], png)
    print(f"   attention of one translation: {png}")
    print(f"done in {time.time() - started:.0f} s; everything is in {out}")


if __name__ == "__main__":
    main()
