"""Helpers for the command-line tests: a toy translation corpus and runners for the real fairseq CLI tools.

The corpus is a deterministic "language pair": each source word ``s<i>`` translates to the target word ``t<i>``
and the target sentence is the source sentence reversed. A model has to learn the word mapping and to attend to
the mirrored source position, so a high BLEU is out of reach for an untrained or broken model.
"""

import math
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

REPO_ROOT = Path(__file__).resolve().parent.parent
PLUGIN_DIR = REPO_ROOT / "fairseq_convs2s"

VOCAB_SIZE = 24
MIN_LEN, MAX_LEN = 3, 10

# a small model of the iwslt preset, shrunk by flags; nag with clip-norm 0.1 as in the paper
MODEL_FLAGS = [
    "--arch", "convs2s_iwslt_de_en",
    "--encoder-layers", "[(64, 3)] * 2",
    "--decoder-layers", "[(64, 3)] * 2",
    "--encoder-embed-dim", "64",
    "--decoder-embed-dim", "64",
    "--decoder-out-embed-dim", "64",
    "--dropout", "0.0",
]  # fmt: skip
# No background thread prefetching batches. A run stopped by --max-update in mid-epoch leaves fairseq's
# prefetching daemon thread inside torch code at interpreter exit, and once (1 of some hundreds of runs) that ended
# a finished training with "terminate called without an active exception" (SIGABRT). Same data, same order.
NO_PREFETCH = ["--data-buffer-size", "0"]

OPTIM_FLAGS = [
    "--optimizer", "nag",
    "--lr", "0.25",
    "--clip-norm", "0.1",
    "--criterion", "label_smoothed_cross_entropy",
    "--label-smoothing", "0.1",
    "--max-tokens", "2000",
    "--seed", "1",
]  # fmt: skip
# fairseq drops the last batch of an evaluation set when it is not a multiple of --required-batch-size-multiple
# (default 8; fairseq issue #5036), which would silently lose test sentences
EVAL_FLAGS = ["--required-batch-size-multiple", "1"]


def translate(words: Sequence[str]) -> List[str]:
    """The reference translation of a source sentence: map ``s<i>`` to ``t<i>`` and reverse the order."""
    return ["t" + w[1:] for w in reversed(words)]


def random_sentence(rng: random.Random, min_len: int = MIN_LEN, max_len: int = MAX_LEN) -> List[str]:
    return [f"s{rng.randrange(VOCAB_SIZE)}" for _ in range(rng.randint(min_len, max_len))]


def write_corpus(folder: Path, prefix: str, sources: Sequence[Sequence[str]]) -> None:
    """``<prefix>.src`` and ``<prefix>.tgt``: one sentence a line, targets from :func:`translate`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{prefix}.src").write_text("".join(" ".join(s) + "\n" for s in sources))
    (folder / f"{prefix}.tgt").write_text("".join(" ".join(translate(s)) + "\n" for s in sources))


def make_splits(folder: Path, sizes: Dict[str, int], seed: int = 1) -> None:
    rng = random.Random(seed)
    for split, n in sizes.items():
        write_corpus(folder, split, [random_sentence(rng) for _ in range(n)])


def run_cli(
    tool: str, args: Sequence[str], cwd: Path, stdin: Optional[str] = None, timeout: float = 300, env: Dict = None
):
    """Run ``python -m fairseq_cli.<tool> args`` (the console script ``fairseq-<tool>``) and capture its output;
    ``env``: variables to set on top of this process's."""
    cmd = [sys.executable, "-m", f"fairseq_cli.{tool}", *map(str, args)]
    env = {**os.environ, **env} if env else None
    return subprocess.run(cmd, cwd=cwd, input=stdin, capture_output=True, text=True, timeout=timeout, env=env)


def tail(proc: subprocess.CompletedProcess, n: int = 3000) -> str:
    """The end of a finished command's stderr and stdout, for assertion messages."""
    return f"\n--- rc={proc.returncode}; stderr tail ---\n{proc.stderr[-n:]}\n--- stdout tail ---\n{proc.stdout[-n:]}"


def check_ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"{' '.join(map(str, proc.args[:4]))} ... failed" + tail(proc)
    return proc


def preprocess(folder: Path, destdir: str = "bin", *extra: str, **prefixes: str) -> subprocess.CompletedProcess:
    """``fairseq-preprocess`` of src-tgt text files; ``prefixes`` as ``trainpref="train"``, ``testpref="test"``."""
    prefs = [arg for key, value in prefixes.items() for arg in (f"--{key}", value)]
    args = ["--source-lang", "src", "--target-lang", "tgt", *prefs, "--destdir", destdir, "--workers", "1", *extra]
    return check_ok(run_cli("preprocess", args, cwd=folder))


def train_args(data: str, save_dir: str, *extra: str) -> List:
    """The arguments of ``fairseq-train`` of the small model on CPU; ``extra`` flags come last, so they win."""
    return [
        data,
        "--user-dir", PLUGIN_DIR,
        *MODEL_FLAGS,
        *OPTIM_FLAGS,
        "--save-dir", save_dir,
        "--no-epoch-checkpoints",
        *NO_PREFETCH,
        "--cpu",
        "--log-format", "simple",
        "--log-interval", "1000",
        *extra,
    ]  # fmt: skip


def train(folder: Path, data: str, save_dir: str, *extra: str) -> subprocess.CompletedProcess:
    """``fairseq-train`` of the small model on CPU (:func:`train_args`), checked."""
    return check_ok(run_cli("train", train_args(data, save_dir, *extra), cwd=folder, timeout=600))


def generate(folder: Path, data: str, checkpoint: str, *extra: str, check: bool = True):
    args = [data, "--user-dir", PLUGIN_DIR, "--path", checkpoint, "--cpu", "--beam", "5", "--batch-size", "16"]
    proc = run_cli("generate", [*args, *EVAL_FLAGS, *extra], cwd=folder)
    return check_ok(proc) if check else proc


# ---- parsing fairseq's output ----------------------------------------------------------------------------------

# "| train | epoch 003 | loss 4.4 |" and "| valid | epoch 003 | valid on 'valid' subset | loss 4.7 |"
_EPOCH_STAT = re.compile(r"\| (train|valid) \| epoch (\d+) \|(?: valid on '[^']*' subset \|)? loss ([0-9.]+) \|")
_BLEU = re.compile(r"BLEU4 = ([0-9.]+)")


def epoch_losses(log: str, split: str) -> List[float]:
    """The per-epoch ``loss`` that ``fairseq-train --log-format simple`` reports for ``split`` (train or valid)."""
    return [float(m.group(3)) for m in _EPOCH_STAT.finditer(log) if m.group(1) == split]


def bleu_of(generate_stdout: str) -> float:
    m = _BLEU.search(generate_stdout)
    assert m, "fairseq-generate printed no BLEU4 line:\n" + generate_stdout[-2000:]
    return float(m.group(1))


def hypothesis_lines(stdout: str) -> Dict[str, Dict[int, str]]:
    """The S-/T-/H-/D-/P-/A- lines of fairseq-generate or fairseq-interactive, by kind and sentence id."""
    out: Dict[str, Dict[int, str]] = {k: {} for k in "STHDPA"}
    for line in stdout.splitlines():
        m = re.match(r"^([STHDPA])-(\d+)\t(.*)$", line)
        if m:
            out[m.group(1)][int(m.group(2))] = m.group(3)
    return out


def split_hypothesis(h_line: str) -> Tuple[float, List[str]]:
    """``H-i`` payload ``score<TAB>tokens`` -> (score, tokens)."""
    score, _, text = h_line.partition("\t")
    value = float(score)
    assert math.isfinite(value), f"hypothesis score is not finite: {h_line!r}"
    return value, text.split()


_VALID_STAT = re.compile(r"valid on '([^']+)' subset \| (.*)$", re.MULTILINE)


def validation_stats(log: str) -> Dict[str, Dict[str, float]]:
    """``fairseq-validate``'s summary lines, by subset: {'valid': {'loss': ..., 'nll_loss': ..., 'bsz': ...}}."""
    stats = {}
    for m in _VALID_STAT.finditer(log):
        fields = {}
        for item in m.group(2).split(" | "):
            key, _, value = item.strip().partition(" ")
            try:
                fields[key] = float(value)
            except ValueError:
                pass
        stats[m.group(1)] = fields
    return stats


def torch_frames(stderr: str) -> List[str]:
    """Traceback frames that lie inside torch itself (an error the plugin should have caught earlier)."""
    return [line for line in stderr.splitlines() if line.strip().startswith("File ") and "/torch/" in line]


# ---- the training launcher, python -m fairseq_convs2s.train ----------------------------------------------------


def launcher_cmd(data: str, save_dir: str, *extra: str, user_dir: Path = PLUGIN_DIR) -> List[str]:
    """``python -m fairseq_convs2s.train`` of the small model on CPU, no validation, one JSON log line per update;
    ``extra`` flags come last, so they win."""
    return [
        sys.executable, "-m", "fairseq_convs2s.train", data,
        "--user-dir", str(user_dir),
        *MODEL_FLAGS,
        *OPTIM_FLAGS,
        "--save-dir", save_dir,
        "--no-epoch-checkpoints",
        "--disable-validation",
        *NO_PREFETCH,
        "--cpu",
        "--log-format", "json",
        "--log-interval", "1",
        *extra,
    ]  # fmt: skip


def run_launcher(folder: Path, data: str, save_dir: str, *extra: str, user_dir: Path = PLUGIN_DIR):
    """Run :func:`launcher_cmd` to completion and capture its output (not checked: see :func:`check_ok`)."""
    cmd = launcher_cmd(data, save_dir, *extra, user_dir=user_dir)
    return subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=600)


_UPDATE_RECORD = re.compile(r"\| train_inner \| (\{.*\})\s*$", re.MULTILINE)


def update_records(log: str) -> List[Dict[str, float]]:
    """The per-update records of ``--log-format json --log-interval 1`` (loss, gnorm, num_updates, ...), as floats."""
    import json

    return [{k: float(v) for k, v in json.loads(m.group(1)).items()} for m in _UPDATE_RECORD.finditer(log)]


def load_checkpoint(path: Path) -> dict:
    """A checkpoint as fairseq itself loads it (``checkpoint_utils.load_checkpoint_to_cpu``)."""
    from fairseq import checkpoint_utils

    import fairseq_convs2s  # noqa: F401  (lets torch's safe unpickler read fairseq's argparse.Namespace)

    return checkpoint_utils.load_checkpoint_to_cpu(str(path))


def checkpoint_updates(state: dict) -> int:
    """The number of updates a loaded checkpoint was saved at."""
    return int(state["optimizer_history"][-1]["num_updates"])


def max_param_difference(a: dict, b: dict) -> float:
    """The largest absolute difference between two loaded checkpoints' parameters (same keys required)."""
    assert a["model"].keys() == b["model"].keys(), set(a["model"]) ^ set(b["model"])
    return max((a["model"][k].float() - b["model"][k].float()).abs().max().item() for k in a["model"])


def wait_until_sleeping(pid: int) -> None:
    """Until the main thread of process ``pid`` sleeps (Linux's /proc): for a command that has answered its input,
    until it waits for more."""
    for _ in range(12000):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "S":
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never waited for input")
