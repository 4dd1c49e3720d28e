"""Whole CPU training runs with and without data-loading workers: wall time and the peak memory of all processes.

    python -m benchmarks.data_workers DATA [--updates 400] [--rounds 2] [--variants ...]

Each run is the Multi30k recipe's convs2s training command (``benchmarks.recipe_training``) through
``python -m fairseq_convs2s.train``, with validation each epoch and checkpoints, cut to ``--updates`` updates.
The variants, alternated (the order reversed every round): ``in-trainer``, the entry's CPU default
(``--num-workers 0``), and ``worker``, fairseq's default (``--num-workers 1``, a persistent worker).

Memory is the largest sum, over the run, of the proportional set size (``/proc/PID/smaps_rollup``, shared pages
split between the processes sharing them) of the trainer and its children: what the run takes from the machine.
DATA may be sharded, ``DIR1:DIR2:...`` (one shard an epoch), as fairseq-train takes it.
"""

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.arguments import data_bin, positive_int
from benchmarks.recipe_training import command

VARIANTS = {"in-trainer": [], "worker": ["--num-workers", "1"]}


def process_tree(root: int) -> list:
    """``root`` and its descendants, from /proc."""
    children = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def pss_mib(pid: int) -> float:
    """The proportional set size of process ``pid`` in MiB (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run(cmd) -> tuple:
    """Run one training; returns (seconds, peak MiB of its processes, most processes at once). Its output goes to a
    file, not a pipe read at the end, which a long log would fill and so stall the run."""
    with tempfile.TemporaryFile("w+") as log:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
        peak, most = 0.0, 0
        while proc.poll() is None:
            tree = process_tree(proc.pid)
            peak, most = max(peak, sum(pss_mib(pid) for pid in tree)), max(most, len(tree))
            time.sleep(0.5)
        seconds = time.perf_counter() - started
        if proc.returncode != 0:
            log.seek(0)
            raise SystemExit(f"training failed:\n{log.read()[-3000:]}")
    return seconds, peak, most


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=data_bin, help="a fairseq-preprocess folder, or several joined by ':'")
    parser.add_argument("--updates", type=positive_int, default=400)
    parser.add_argument("--rounds", type=positive_int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    results = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for name in variants if round_ % 2 == 0 else variants[::-1]:
                flags = VARIANTS[name]
                cmd, _ = command(Path(args.data), "convs2s", args.updates, 100, f"{tmp}/{name}{round_}", validate=True)
                cmd += flags
                results[name].append(run(cmd))
                seconds, peak, most = results[name][-1]
                print(f"round {round_ + 1}, {name}: {seconds:.1f} s, {peak:.0f} MiB, {most} processes", flush=True)
    print("\n| variant | seconds, median (runs) | peak MiB, median (runs) | most processes |\n|---|---|---|---|")
    for name in variants:
        seconds, peaks, most = zip(*results[name])
        print(
            f"| {name} | {statistics.median(seconds):.1f} ({', '.join(f'{s:.1f}' for s in seconds)}) | "
            f"{statistics.median(peaks):.0f} ({', '.join(f'{p:.0f}' for p in peaks)}) | {max(most)} |"
        )


if __name__ == "__main__":
    main()
