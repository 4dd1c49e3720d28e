"""What ``--checkpoint-activations`` saves in memory and costs in time: convs2s's training update with and without.

``python -m benchmarks.checkpoint_activations [--sizes iwslt,wmt_en_de] [--sentences 64] [--length 25]
[--rounds 3] [--updates 5] [--device cpu|cuda]`` starts, per round, one fresh Python process per mode in turn
(``kept``: every activation kept for the backward pass, fairseq's and fconv's way; ``checkpointed``: each block's
input alone, the block run again in the backward pass). Each process builds the harness's convs2s (the
``benchmarks.pair`` size, dropout 0.2, the fused criterion, clip 0.1, NAG: ``measure.TrainStep``) on a batch of
``--sentences`` x (``--length`` + EOS) tokens, runs one update untimed, then times ``--updates`` updates, and
records the memory the updates reach above what the process held before the first (the model, its batch and the
framework): the gradients, the optimizer's state and the activations; on a CPU the peak resident set size,
sampled every 5 ms, on a GPU the peak of torch's allocator. A fresh process per mode, since an earlier update's
freed memory stays in the process's heap and would stand in either mode's peak. Reported: medians over the
rounds, and each round's ratios (memory kept / checkpointed: above 1, what the flag saves; time checkpointed /
kept: above 1, what it costs).
"""

import argparse
import json
import time
from pathlib import Path
from typing import Dict, List

import torch

from . import measure
from .arguments import device_name, positive_int, size_names
from .pair import SIZES

MODES = ("kept", "checkpointed")


def measure_mode(mode: str, size_name: str, sentences: int, length: int, updates: int, device_name: str) -> Dict:
    """Median seconds of ``updates`` training updates (after one untimed) and the memory all of them reach (MiB
    above the state before the first), at ``size_name`` with activations ``mode`` (of ``MODES``), in this process."""
    device = torch.device(device_name)
    fconv, model, sample, pad = measure.training_pair(size_name, device, sentences, length)
    del fconv  # its weights out of the measured memory
    for stack in (model.encoder, model.decoder):
        stack.checkpoint_activations = mode == "checkpointed"
    step = measure.TrainStep(model.to(device), sample, pad, fused_loss=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device) / 2**20
        torch.cuda.reset_peak_memory_stats(device)
    else:
        before = measure.PeakRSS.rss_mib()
    seconds = []
    with measure.PeakRSS() as rss:
        step()  # untimed: the first update allocates the gradients and the optimizer's state
        for _ in range(updates):
            start = time.perf_counter()
            step()
            measure.sync(device)
            seconds.append(time.perf_counter() - start)
    peak = measure.gpu_peak_mib(device) if device.type == "cuda" else rss.peak_mib
    # of that memory, the same in both modes: a gradient and NAG's momentum for every parameter
    state_mib = sum(2 * p.numel() * p.element_size() for p in step.params) / 2**20
    return {"seconds": measure.median(seconds), "memory_mib": peak - before, "state_mib": state_mib}


def _worker(mode: str, size_name: str, args) -> Dict:
    """``measure_mode`` in a fresh Python process."""
    cmd = ["--worker", mode, size_name, "--sentences", str(args.sentences), "--length", str(args.length)]
    cmd += ["--updates", str(args.updates), "--device", args.device, "--threads", str(args.threads)]
    return measure.fresh_process_json("benchmarks.checkpoint_activations", cmd)


def summary(rounds: List[Dict[str, Dict]]) -> Dict[str, object]:
    """Medians over the rounds per mode, and each round's memory ratio (kept / checkpointed) and time ratio
    (checkpointed / kept) with their medians."""
    out: Dict[str, object] = {}
    for mode in MODES:
        out[mode] = {key: measure.median([r[mode][key] for r in rounds]) for key in ("seconds", "memory_mib")}
    memory = [r["kept"]["memory_mib"] / r["checkpointed"]["memory_mib"] for r in rounds]
    cost = [r["checkpointed"]["seconds"] / r["kept"]["seconds"] for r in rounds]
    out.update(memory_ratios=memory, time_ratios=cost, memory_ratio=measure.median(memory))
    out["time_ratio"] = measure.median(cost)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=size_names, default="iwslt,wmt_en_de", help=f"comma-separated, of {sorted(SIZES)}")
    p.add_argument("--sentences", type=positive_int, default=64, help="sentences in the batch")
    p.add_argument("--length", type=int, default=25, help="tokens per source and target sentence, before EOS")
    p.add_argument("--rounds", type=positive_int, default=3, help="fresh processes per mode, modes in turn")
    p.add_argument("--updates", type=positive_int, default=5, help="timed updates per process (their median)")
    p.add_argument("--device", type=device_name, default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--threads", type=int, default=0, help="torch threads in each process (0: torch's default)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--worker", nargs=2, metavar=("MODE", "SIZE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    measure.use_threads(args.threads, need_onednn=args.device == "cpu")
    if args.worker:
        mode, size_name = args.worker
        print(json.dumps(measure_mode(mode, size_name, args.sentences, args.length, args.updates, args.device)))
        return
    started = time.time()
    machine = measure.describe_machine(torch.device(args.device))
    where = machine.get("gpu", f"{machine['cpu']}, {machine['torch_threads']} torch threads")
    memory_kind = "torch's allocator peak" if args.device == "cuda" else "peak RSS"
    print(f"{where}, torch {machine['torch']}; {args.sentences} x {args.length + 1} target tokens, fp32, {memory_kind}")
    results = {"machine": machine, "args": vars(args), "sizes": {}}
    for size_name in args.sizes.split(","):
        rounds = [{mode: _worker(mode, size_name, args) for mode in MODES} for _ in range(args.rounds)]
        s = summary(rounds)
        results["sizes"][size_name] = {"rounds": rounds, **s}
        kept, checkpointed = s["kept"], s["checkpointed"]
        state = rounds[0]["kept"]["state_mib"]
        print(
            f"{size_name}: update memory (gradients and momentum {state:.0f} MiB of it) "
            f"{kept['memory_mib']:.0f} MiB kept, {checkpointed['memory_mib']:.0f} MiB "
            f"checkpointed ({s['memory_ratio']:.2f}x less; per round {_ratios(s['memory_ratios'])}); update "
            f"{1e3 * kept['seconds']:.0f} ms kept, {1e3 * checkpointed['seconds']:.0f} ms checkpointed "
            f"({s['time_ratio']:.2f}x the time; per round {_ratios(s['time_ratios'])})",
            flush=True,
        )
    print(f"whole run: {(time.time() - started) / 60:.1f} min")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


def _ratios(xs: List[float]) -> str:
    return ", ".join(f"{x:.2f}x" for x in xs)


if __name__ == "__main__":
    main()
