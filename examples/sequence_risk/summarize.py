"""Several seeds of ``finetune.py`` in one table: BLEU per seed, means, and the paired difference of risk and
token-level training with its t statistic.

    python examples/sequence_risk/summarize.py outputs/multi30k_gpu_risk_s1 outputs/multi30k_gpu_risk_s2 ...

Each folder is one ``finetune.py --out`` (its ``results.json``), all from the same checkpoint with different
``--seed``; a folder without results (a run that did not finish) is named and skipped. Prints markdown.
"""

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

RUNS = ("start", "risk", "token", "token-time")


def bleu_score(text: str) -> float:
    """The score of a ``BLEU = 36.41 66.9/43.2/...`` line."""
    m = re.match(r"BLEU = ([0-9.]+)", text)
    if not m:
        raise ValueError(f"not a BLEU line: {text!r}")
    return float(m.group(1))


def paired_t(differences: Sequence[float]) -> Optional[float]:
    """Mean over its standard error (n - 1 degrees of freedom); None for fewer than 2 or no spread."""
    n = len(differences)
    if n < 2:
        return None
    mean = sum(differences) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / (n - 1))
    return mean / (sd / math.sqrt(n)) if sd > 0 else None


def summarize(folders: Sequence[Path]) -> str:
    scores: List[Dict[str, float]] = []
    names: List[str] = []
    skipped = []
    for folder in folders:
        path = folder / "results.json"
        if not path.exists():
            skipped.append(str(folder))
            continue
        results = json.loads(path.read_text())
        scores.append({run: bleu_score(results[run]["bleu"]) for run in RUNS if run in results})
        names.append(folder.name)
    if not scores:
        raise SystemExit(f"no results.json in {', '.join(map(str, folders))}")
    lines = ["| run | " + " | ".join(names) + " | mean |", "|---" * (len(names) + 2) + "|"]
    for run in RUNS:
        values = [s.get(run) for s in scores]
        if all(v is None for v in values):
            continue
        present = [v for v in values if v is not None]
        cells = ["-" if v is None else f"{v:.2f}" for v in values]
        lines.append(f"| {run} | " + " | ".join(cells) + f" | {sum(present) / len(present):.2f} |")
    pairs = [s["risk"] - s["token"] for s in scores if "risk" in s and "token" in s]
    if pairs:
        t = paired_t(pairs)
        ahead = sum(d > 0 for d in pairs)
        lines += [
            "",
            f"risk - token, paired over {len(pairs)} seeds: mean {sum(pairs) / len(pairs):+.2f} BLEU"
            + (f", t = {t:.2f} ({len(pairs) - 1} degrees of freedom)" if t is not None else "")
            + f"; risk ahead with {ahead} of {len(pairs)}",
        ]
    if skipped:
        lines += ["", "no results (not finished): " + ", ".join(skipped)]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", type=Path, nargs="+", help="finetune.py --out folders, one per seed")
    args = parser.parse_args(argv)
    print(summarize(args.folders))


if __name__ == "__main__":
    sys.exit(main())
