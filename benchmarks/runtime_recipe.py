"""The runtime on a recipe's own model and test set, as a user runs both: ``fairseq-generate`` against
``python -m convs2s_runtime``, whole commands.

    python -m benchmarks.runtime_recipe OUT [--checkpoint avg] [--batch-size 64] [--repeats 3] [--bf16]

OUT is a recipe's output folder (``examples/multi30k/run.py --out OUT``): its checkpoint, ``data-bin``,
``spm/spm.model`` and the normalized raw test set. The checkpoint is exported (``python -m fairseq_convs2s.export``)
to ``OUT/runtime_model``; then ``fairseq-generate`` on the binarized test set (beam 5, the recipe's flags) and
``python -m convs2s_runtime`` on the raw test sources (beam 5) are timed alternately, each a whole command in a fresh
process, start-up included (medians). Printed: sentences/s of each, how many best hypotheses are the same text,
the largest difference between fairseq's scores and the API's (``Translator.translate_batch``), and the sacreBLEU
of each against the raw references.
"""

import argparse
import contextlib
import json
import math
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Tuple

from .arguments import positive_int, recipe_folder

USER_DIR = Path(__file__).resolve().parent.parent / "fairseq_convs2s"


def _run(cmd: List[str], stdin_path=None) -> Tuple[float, str]:
    start = time.perf_counter()
    with open(stdin_path, "rb") if stdin_path else contextlib.nullcontext(subprocess.DEVNULL) as stdin:
        proc = subprocess.run(cmd, stdin=stdin, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed:\n{proc.stderr[-3000:]}")
    return seconds, proc.stdout


def fairseq_hypotheses(stdout: str) -> Tuple[List[str], List[float]]:
    """fairseq-generate's best hypotheses (detokenized) and their scores (natural log), in sentence order."""
    found = {}
    for m in re.finditer(r"^H-(\d+)\t(\S+)\t(.*)$", stdout, re.MULTILINE):
        found[int(m.group(1))] = (m.group(3), float(m.group(2)) * math.log(2))  # it prints log base 2
    ids = sorted(found)
    return [found[i][0] for i in ids], [found[i][1] for i in ids]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=recipe_folder, help="a recipe's output folder")
    p.add_argument(
        "--checkpoint", default="avg", choices=["avg", "best", "last"], help="default avg, as the recipe scores"
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--bf16", action="store_true", help="both commands with --bf16")
    args = p.parse_args(argv)
    out = Path(args.out)
    checkpoint = out / "checkpoints" / f"checkpoint_{args.checkpoint}.pt"
    if not checkpoint.is_file():
        p.error(f"argument --checkpoint: {checkpoint}: no such file")
    model_dir = out / "runtime_model"
    _run([sys.executable, "-m", "fairseq_convs2s.export", checkpoint, model_dir, "--data", out / "data-bin",
          "--sentencepiece-model", out / "spm" / "spm.model"])  # fmt: skip
    config = json.loads((model_dir / "config.json").read_text())
    src, tgt = config["source_lang"], config["target_lang"]  # as the checkpoint was trained
    bf16 = ["--bf16"] if args.bf16 else []
    generate = [
        sys.executable, "-m", "fairseq_cli.generate", out / "data-bin", "--user-dir", USER_DIR, "--path", checkpoint,
        "--source-lang", src, "--target-lang", tgt, "--beam", "5", "--batch-size", str(args.batch_size),
        "--remove-bpe", "sentencepiece", "--cpu", *bf16,
    ]  # fmt: skip
    runtime = [sys.executable, "-m", "convs2s_runtime", model_dir, "--beam", "5", "--batch-size", str(args.batch_size)]
    runtime += bf16
    sources = out / "raw" / f"test.{src}"
    times = {"fairseq-generate": [], "convs2s_runtime": []}
    for r in range(args.repeats):
        for name in ("fairseq-generate", "convs2s_runtime")[:: 1 if r % 2 == 0 else -1]:
            seconds, stdout = _run(generate if name == "fairseq-generate" else runtime, sources)
            times[name].append(seconds)
            if name == "fairseq-generate":
                fairseq_text, fairseq_scores = fairseq_hypotheses(stdout)
            else:
                runtime_text = stdout.split("\n")[:-1]
    sentences = len(runtime_text)
    speed = {name: sentences / statistics.median(t) for name, t in times.items()}
    same = sum(a == b for a, b in zip(fairseq_text, runtime_text))

    from convs2s_runtime import Translator  # the scores, in this process

    lines = sources.read_text(encoding="utf-8").split("\n")[:sentences]
    results = Translator(model_dir, compute_type="bfloat16" if args.bf16 else "float32").translate_batch(
        lines, max_batch_size=args.batch_size
    )
    score_diff = max(abs(r.hypotheses[0].score - s) for r, s in zip(results, fairseq_scores))

    import sacrebleu

    references = (out / "raw" / f"test.{tgt}").read_text(encoding="utf-8").split("\n")[:sentences]
    print(f"{out} ({checkpoint.name}), {sentences} sentences, beam 5, batch {args.batch_size}"
          f"{', bf16' if args.bf16 else ''}, whole commands (medians of {args.repeats}):")  # fmt: skip
    for name in times:
        text = fairseq_text if name == "fairseq-generate" else runtime_text
        bleu = sacrebleu.corpus_bleu(text, [references]).score
        print(f"  {name}: {statistics.median(times[name]):.1f} s, {speed[name]:.1f} sentences/s, BLEU {bleu:.2f}")
    print(f"  runtime / fairseq-generate: {speed['convs2s_runtime'] / speed['fairseq-generate']:.2f}x")
    print(f"  identical best hypotheses: {same} of {sentences}; largest score difference {score_diff:.2e}")


if __name__ == "__main__":
    main()
