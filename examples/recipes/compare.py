"""Recipe runs side by side, as the recipe READMEs compare convs2s with fconv under one budget:

    python examples/recipes/compare.py outputs/multi30k_30 outputs/multi30k_30_fconv --png compare.png

For each run folder (a recipe's ``--out``): the model, the seed, minutes of training, updates, the median logged
words/s, validation perplexity after a quarter, a half and three quarters of the shortest run's training and at its
end, the model tested and each test set's score. Then every run's BLEU on each test set against the first run's,
with sacreBLEU's paired bootstrap (its fixed seed, so the same runs give the same p), and with ``--png`` all the
validation curves in one picture. Reads only what the recipe wrote; trains and generates nothing.
"""

import argparse
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

if __package__ in (None, ""):  # run as a script: import the recipes package beside this file
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recipes import text  # noqa: E402
from recipes.curve import (  # noqa: E402
    SERIES_COLOURS,
    CurvePoint,
    read_validation_curve,
    train_inner_values,
    write_curves_png,
)

QUARTERS = (0.25, 0.5, 0.75)

_ARCH_RE = re.compile(r"\barch='([^']+)'")
_SEED_RE = re.compile(r"'seed': (\d+)")
_TARGET_RE = re.compile(r"\btarget_lang='([^']+)'")
_UPDATES_RE = re.compile(r"\| train \| epoch \d+ \|.*\| num_updates (\d+)")


@dataclass
class Run:
    """What one recipe run wrote, read back: ``scores`` maps a test tag (``<test set>.<checkpoint>``, the recipe's
    file names) to the first line of its score file."""

    name: str
    out: Path
    arch: str
    seed: Optional[int]
    target_lang: str
    curve: List[CurvePoint]
    updates: Optional[int]
    median_wps: Optional[float]
    tested: str
    scores: Dict[str, str]

    @property
    def minutes(self) -> Optional[float]:
        return self.curve[-1].minutes if self.curve else None


def read_run(out: Path, name: str) -> Run:
    """Read a recipe's output folder; SystemExit naming the folder and the file when it is not one."""
    log_file = out / "train.log"
    if not log_file.is_file():
        raise SystemExit(f"{out}: no train.log, so not a recipe's output folder (the --out of examples/<task>/run.py)")
    log = log_file.read_text(encoding="utf-8", errors="replace")
    arch, target = _ARCH_RE.search(log), _TARGET_RE.search(log)
    if not arch or not target:
        raise SystemExit(f"{log_file}: no fairseq-train configuration line (arch=..., target_lang=...) in it")
    seed = _SEED_RE.search(log)
    updates = [int(u) for u in _UPDATES_RE.findall(log)]
    wps = train_inner_values(log, "wps")
    chosen = out / "checkpoints" / "chosen.txt"
    tested = chosen.read_text(encoding="utf-8").split("\t")[0].strip() if chosen.is_file() else "-"
    scores = {}
    for path in sorted(out.glob("score-*.txt")):
        report = path.read_text(encoding="utf-8")
        if report.strip():
            scores[path.name[len("score-") : -len(".txt")]] = report.splitlines()[0]
    return Run(
        name=name,
        out=out,
        arch=arch.group(1),
        seed=int(seed.group(1)) if seed else None,
        target_lang=target.group(1),
        curve=read_validation_curve(log),
        updates=max(updates) if updates else None,
        median_wps=statistics.median(wps) if wps else None,
        tested=tested,
        scores=scores,
    )


def run_names(outs: Sequence[Path]) -> List[str]:
    """The folders' own names, or the paths as given where two share a name."""
    names = [out.name for out in outs]
    return names if len(set(names)) == len(names) else [str(out) for out in outs]


def perplexity_at(curve: Sequence[CurvePoint], minutes: float) -> Optional[float]:
    """The last validation perplexity a run had reached by ``minutes`` of training (None: none yet)."""
    reached = [p for p in curve if p.minutes <= minutes + 1e-9]
    return reached[-1].ppl if reached else None


def _number(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def headline(score_line: str) -> str:
    """A score line's figures without their details: 'BLEU 38.11', or ROUGE's three F1 (or recall) scores."""
    bleu = re.match(r"BLEU = ([0-9.]+)", score_line)
    return f"BLEU {bleu.group(1)}" if bleu else score_line.split("  (")[0]


def runs_table(runs: Sequence[Run]) -> List[str]:
    """One markdown row a run; the perplexity columns at fractions of the shortest run's training minutes."""
    lengths = [r.minutes for r in runs if r.minutes is not None]
    marks = [f * min(lengths) for f in QUARTERS] if lengths else []
    tags = sorted({tag for r in runs for tag in r.scores})
    head = ["run", "arch", "seed", "minutes", "updates", "median wps"]
    head += [f"ppl at {m:.1f} min" for m in marks] + ["ppl at the end", "tested"] + tags
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        cells = [r.name, r.arch, _number(r.seed, "d"), _number(r.minutes, ".1f"), _number(r.updates, ",d")]
        cells += [_number(r.median_wps, ",.0f")]
        cells += [_number(perplexity_at(r.curve, m), ".2f") for m in marks]
        cells += [_number(r.curve[-1].ppl if r.curve else None, ".2f"), r.tested]
        cells += [headline(r.scores[tag]) if tag in r.scores else "-" for tag in tags]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def references(run: Run, test_set: str) -> List[List[str]]:
    """The reference streams the recipe scored ``test_set`` against: raw/<set>.<tgt> and any raw/<set>.<tgt>.ref*."""
    main = run.out / "raw" / f"{test_set}.{run.target_lang}"
    if not main.is_file():
        raise SystemExit(f"{run.out}: {main} is missing: the recipe's references for {test_set}")
    return text.read_references(run.out / "raw", test_set, run.target_lang)


def paired_bleu(runs: Sequence[Run], tag: str, resamples: int) -> List[str]:
    """Lines comparing each run's BLEU on ``tag`` with the first run's: the difference, sacreBLEU's paired
    bootstrap p-value, and each run's bootstrap mean with its 95% interval; one line saying why not when the runs
    were tested against other references."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    test_set = tag.rsplit(".", 1)[0]
    refs = references(runs[0], test_set)
    other = [r.name for r in runs[1:] if references(r, test_set) != refs]
    if other:  # (another direction or corpus: the table and the curves still compare them)
        return [f"{tag}: no paired test: the references of {', '.join(other)} are not {runs[0].name}'s"]
    systems = []
    for r in runs:
        hyp_file = r.out / f"{tag}.hyp"
        if not hyp_file.is_file():
            raise SystemExit(f"{r.out}: {hyp_file.name} is missing beside score-{tag}.txt")
        hyps = text.read_lines(hyp_file)
        if len(hyps) != len(refs[0]):
            raise SystemExit(f"{hyp_file}: {len(hyps)} lines against {len(refs[0])} references")
        systems.append((r.name, hyps))
    _, scores = PairedTest(systems, {"BLEU": BLEU()}, refs, test_type="bs", n_samples=resamples)()
    base = scores["BLEU"][0]
    lines = [f"{tag}: BLEU against {runs[0].name} ({base.score:.2f}), paired bootstrap, {resamples} resamples"]
    for r, (_, hyps), result in zip(runs, systems, scores["BLEU"]):
        if result is base:
            p = "baseline"
        elif hyps == systems[0][1]:  # sacreBLEU's test gives such a pair its smallest p, not 1
            p = "the same output as the baseline"
        else:
            p = f"p = {result.p_value:.4f}"
        lines.append(
            f"   {r.name}: {result.score:.2f} ({result.score - base.score:+.2f}, {p}; "
            f"mean {result.mean:.2f} +- {result.ci:.2f})"
        )
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "outs", nargs="+", type=Path, metavar="OUT", help="recipe output folders; the first is the baseline"
    )
    parser.add_argument("--png", type=Path, help="write every run's validation curve in one picture here")
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (sacrebleu's default: 1000)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    if args.resamples < 1:
        raise SystemExit(f"--resamples {args.resamples}: give at least 1")
    if args.png and len(args.outs) > len(SERIES_COLOURS):
        raise SystemExit(f"--png draws at most {len(SERIES_COLOURS)} runs in one picture; {len(args.outs)} given")
    runs = [read_run(out, name) for out, name in zip(args.outs, run_names(args.outs))]
    print("\n".join(runs_table(runs)))
    for tag in sorted({tag for r in runs for tag in r.scores}):
        lacking = [r.name for r in runs if tag not in r.scores]
        if len(runs) < 2 or lacking:
            if lacking:
                print(f"{tag}: no paired test, not scored in {', '.join(lacking)}")
            continue
        if not all(r.scores[tag].startswith("BLEU") for r in runs):
            print(f"{tag}: no paired test: the paired bootstrap here is sacreBLEU's, for BLEU scores")
            continue
        print("\n".join(paired_bleu(runs, tag, args.resamples)))
    if args.png:
        series = [(r.name, r.curve) for r in runs]
        if not any(curve for _, curve in series):
            raise SystemExit("no run has validation points in its train.log: no picture")
        title = " / ".join(r.name for r in runs)
        write_curves_png(series, args.png, title if len(title) <= 100 else f"{len(runs)} runs")
        print(f"curves: {args.png}")


if __name__ == "__main__":
    main()
