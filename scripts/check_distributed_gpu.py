"""On a GPU machine: two ranks with fairseq's ``pytorch_ddp`` equal one process with ``--update-freq 2``.

    python scripts/check_distributed_gpu.py [--workdir DIR] [--updates 10]

The GPU counterpart of tests/test_distributed.py (which runs two CPU ranks over gloo with ``legacy_ddp``): the same
generated corpus and tiny model, trained for ``--updates`` updates by (a) two ranks and (b) one process with
``--update-freq 2``, in fp32, ``--fp16`` and ``--bf16``; then the per-update losses and the saved parameters are
compared. fp32 and fp16 use stock ``fairseq-train``; bf16 uses ``python -m fairseq_convs2s.train`` (stock fairseq
turns ``--bf16`` into ``--tpu``). With two or more GPUs fairseq spawns one rank per GPU (NCCL); with one GPU the
two ranks share it, started one process per rank over gloo (NCCL refuses two ranks on one device).

Prints one line per precision and exits 1 if a difference exceeds its tolerance: 1e-5 for fp32; 1e-2 for fp16
and bf16, whose saved weights are the half-precision model's (a one-ulp flip of a weight near 1 is 1e-3 in fp16,
8e-3 in bf16).
"""

import argparse
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from cli_helpers import (  # noqa: E402
    MODEL_FLAGS,
    OPTIM_FLAGS,
    PLUGIN_DIR,
    checkpoint_updates,
    load_checkpoint,
    make_splits,
    max_param_difference,
    preprocess,
    update_records,
)

from fairseq_convs2s.train import free_port  # noqa: E402

TOLERANCE = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 1e-2}


def train_cmd(precision: str, save_dir: str, updates: int):
    tool = ["-m", "fairseq_convs2s.train"] if precision == "bf16" else ["-m", "fairseq_cli.train"]
    flags = [] if precision == "fp32" else [f"--{precision}"]
    return [sys.executable, *tool, "bin", "--user-dir", str(PLUGIN_DIR), *MODEL_FLAGS, *OPTIM_FLAGS, *flags,
            "--max-tokens", "200", "--max-update", str(updates), "--save-dir", save_dir, "--no-epoch-checkpoints",
            "--disable-validation", "--log-format", "json", "--log-interval", "1"]  # fmt: skip


def run(cmds, cwd):
    """Start the commands together (the ranks of one job), wait for all; return their combined output."""
    procs = [subprocess.Popen(c, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in cmds]
    outputs = [p.communicate(timeout=1800)[0] for p in procs]
    for p, out in zip(procs, outputs):
        if p.returncode != 0:
            sys.exit(f"{' '.join(p.args[:4])} ... failed:\n{out[-5000:]}")
    return "".join(outputs)


def two_ranks(precision: str, save_dir: str, updates: int):
    base = [*train_cmd(precision, save_dir, updates), "--ddp-backend", "pytorch_ddp", "--distributed-world-size", "2"]
    if torch.cuda.device_count() >= 2:
        return [base]  # fairseq spawns one process per GPU
    shared = ["--distributed-init-method", f"tcp://127.0.0.1:{free_port()}", "--distributed-backend", "gloo"]
    shared += ["--distributed-no-spawn", "--device-id", "0"]
    return [[*base, *shared, "--distributed-rank", str(rank)] for rank in (0, 1)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default="/tmp/convs2s_gpu_check")
    parser.add_argument("--updates", type=int, default=10)
    args = parser.parse_args()
    assert torch.cuda.is_available(), "no GPU visible: run tests/test_distributed.py for the CPU check"

    folder = Path(args.workdir)
    if not (folder / "bin").exists():
        make_splits(folder, {"train": 300})
        preprocess(folder, "bin", trainpref="train")
    print(f"{torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    failed = False
    for precision in ("fp32", "fp16", "bf16"):
        two_log = run(two_ranks(precision, f"{precision}_two", args.updates), folder)
        one_log = run([[*train_cmd(precision, f"{precision}_one", args.updates), "--update-freq", "2"]], folder)
        two = load_checkpoint(folder / f"{precision}_two/checkpoint_last.pt")
        one = load_checkpoint(folder / f"{precision}_one/checkpoint_last.pt")
        assert checkpoint_updates(two) == checkpoint_updates(one) == args.updates
        diff = max_param_difference(two, one)
        losses_two = [r["loss"] for r in update_records(two_log)]
        losses_one = [r["loss"] for r in update_records(one_log)]
        ok = diff <= TOLERANCE[precision] and len(losses_one) == args.updates
        failed |= not ok
        print(f"{precision}: max |param difference| {diff:.3g} (tolerance {TOLERANCE[precision]:g}); "
              f"losses equal at {sum(a == b for a, b in zip(losses_two, losses_one))}/{args.updates} updates; "
              f"{'OK' if ok else 'FAILED'}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
