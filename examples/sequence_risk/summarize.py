"""Several seeds of ``finetune.py`` in one table: BLEU per seed, means, and the paired difference of risk and
token-level training with its t statistic.

    python examples/sequence_risk/summarize.py outputs/multi30k_gpu_risk_s1 outputs/multi30k_gpu_risk_s2 ...

Each folder is one ``finetune.py --out`` (its ``results.json``), all from the same checkpoint with different
``--seed``; a folder without results (a run that did not finish) is named and skipped, folders whose recorded
commands differ in more than the seed (another checkpoint, data, --gen-subset, --lr ...) are refused, naming what
differs. Prints markdown.
"""

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from finetune import command_flags  # (this folder: the script's own)

RUNS = ("start", "risk", "token", "token-time")
# the flags of a recorded command that differ between the seeds of one experiment: the seed, each run's folder, and
# the time-matched run's length (the seconds its own seed's risk run took)
PER_SEED = ("--seed", "--save-dir", "--stop-time-hours")
# how finetune.py scored every model (results.json's "scored"), by flag
SCORED = {
    "gen_subset": "--gen-subset",
    "max_len_a": "--max-len-a",
    "max_len_b": "--max-len-b",
    "post_process": "--post-process",
}


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


def differences(first: dict, other: dict) -> List[str]:
    """How two results.json differ in more than the seed: ``--lr 0.05 vs 0.1``, one entry a flag (the runs' commands
    and how they were scored; what only one of them recorded is not compared)."""
    found: Dict[str, str] = {}

    def compare(flag: str, a: Optional[str], b: Optional[str]) -> None:
        if a != b and flag not in found:
            shown = ["not given" if v is None else v or "set" for v in (a, b)]
            found[flag] = f"{flag} {shown[0]} vs {shown[1]}"

    scored = [r.get("scored", {}) for r in (first, other)]
    for key in (k for k in SCORED if k in scored[0] and k in scored[1]):
        compare(SCORED[key], str(scored[0][key]), str(scored[1][key]))
    for run in RUNS:
        if "command" not in first.get(run, {}) or "command" not in other.get(run, {}):
            continue
        a, b = command_flags(first[run]["command"]), command_flags(other[run]["command"])
        for flag in [*a, *(f for f in b if f not in a)]:
            if flag not in PER_SEED:
                compare("the data folder" if flag == "data" else flag, a.get(flag), b.get(flag))
    return list(found.values())


def summarize(folders: Sequence[Path]) -> str:
    scores: List[Dict[str, float]] = []
    names: List[str] = []
    skipped = []
    first = None  # (folder, results) of the first folder with results: the others must be its other seeds
    for folder in folders:
        path = folder / "results.json"
        if not path.exists():
            skipped.append(str(folder))
            continue
        results = json.loads(path.read_text())
        if first is None:
            first = folder, results
        differ = differences(first[1], results)
        if differ:
            raise SystemExit(
                f"summarize.py: error: {first[0]} and {folder} differ in more than --seed ({'; '.join(differ)}): "
                "give the folders of one experiment, its seeds"
            )
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
