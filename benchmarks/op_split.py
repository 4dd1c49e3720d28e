"""Where a training update's time goes, products against everything else, each operator timed as it runs.

``python -m benchmarks.op_split [--sizes iwslt] [--repeats 7] [--keep-freed-memory] [--operators 8]`` builds the
harness's pair (``benchmarks.pair``: fconv and its conversion, the same weights), times one update of each
alternately (64 x 26 target tokens, dropout 0.2, backward, clip 0.1, NAG; fconv with fairseq's
``label_smoothed_cross_entropy``, as its recipes train it, convs2s with the plugin's fused criterion), then runs
updates under a ``TorchDispatchMode`` that times every aten operator, forward and backward, around its own call: the
matrix products (``PRODUCTS``) against all other operators; what is left of the untimed update is the rest: Python
and dispatch, and whatever the timed updates ran faster than the alternated ones (a drift of the shared machine
between the two phases). With torch's FLOP counter (``measure.count_flops``) and the 2048^3 matmul peak of the same
run it prints what the products reach, and what the rest of convs2s's update may cost at most for it to run at 1.3x
fconv's speed: the issue's training target. Unlike ``torch.profiler`` (``benchmarks.profile``), the timer adds its
overhead outside the timed calls, not to them. Each model's products are listed by operand shapes too
(``--products``, the slowest first), with their FLOPs and the share of the peak each reaches: which products run
below the matmul's pace.

``--data DATA_BIN [--max-tokens 1000] [--batches 8]`` takes a corpus's own batches instead (``real_batches``: the
first of fairseq-train's epoch-1 batches, padding and all, and the pair built over its dictionaries): a run is then
one update on each batch in turn, every figure is per update (the pass's divided by ``--batches``), and the
products are listed by operator alone, their shapes changing from batch to batch.
"""

import argparse
import time
from collections import defaultdict
from typing import Dict, List, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fairseq_convs2s.train import keep_freed_memory

from . import measure
from .arguments import data_bin, positive_int, size_names
from .pair import SIZES, build_pair
from .real_batches import load_batches

# the matrix products of an update: torch's and oneDNN's, conv_tbc (fconv's convolutions) and its backward
PRODUCTS = frozenset(
    {"mm", "addmm", "addmm_", "bmm", "baddbmm", "addbmm", "_linear_pointwise", "conv_tbc", "conv_tbc_backward"}
)
TARGET = 1.3


class OperatorTimer(TorchDispatchMode):
    """Seconds and calls per aten operator (by name, all overloads together) while active; with ``by_shape``,
    also seconds, calls and FLOPs per product and operand shapes (``products``)."""

    def __init__(self, by_shape: bool = False):
        super().__init__()
        self.seconds: Dict[str, float] = defaultdict(float)
        self.calls: Dict[str, int] = defaultdict(int)
        self.by_shape = by_shape
        self.products: Dict[Tuple[str, tuple], List[float]] = defaultdict(lambda: [0.0, 0, 0])  # s, calls, FLOPs

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        seconds = time.perf_counter() - start
        name = func.overloadpacket.__name__
        self.seconds[name] += seconds
        self.calls[name] += 1
        if self.by_shape and name in PRODUCTS:
            shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
            formula = measure.flop_formulas().get(func.overloadpacket)  # (every product of an update has one)
            flops = formula(*args, **(kwargs or {}), out_val=out) if formula else 0
            entry = self.products[(name, shapes)]
            entry[0] += seconds
            entry[1] += 1
            entry[2] += flops
        return out

    def split(self) -> Dict[str, float]:
        """{"products": s, "other": s}, summed over the operators timed."""
        products = sum(s for name, s in self.seconds.items() if name in PRODUCTS)
        return {"products": products, "other": sum(self.seconds.values()) - products}

    def product_rows(self, runs: int, by_shape: bool = True) -> List[Dict[str, object]]:
        """Per product and operand shapes (or, without ``by_shape``, per product alone, its shapes ``()``),
        slowest first: calls, seconds and FLOPs per run, and GFLOP/s."""
        products = self.products
        if not by_shape:
            products = defaultdict(lambda: [0.0, 0, 0])
            for (name, _), entry in self.products.items():
                products[(name, ())] = [a + b for a, b in zip(products[(name, ())], entry)]
        rows = []
        for (name, shapes), (seconds, calls, flops) in products.items():
            rate = flops / seconds / 1e9 if seconds else 0.0
            rows.append(
                {
                    "op": name,
                    "shapes": shapes,
                    "calls": calls // runs,
                    "seconds": seconds / runs,
                    "gflop": flops / runs / 1e9,
                    "gflops": rate,
                }
            )
        return sorted(rows, key=lambda r: -r["seconds"])


def split_update(step, runs: int, operators: int = 8, updates: int = 1) -> Dict[str, object]:
    """Per update: seconds in products and in other operators, the other operators' calls, the ``operators`` slowest
    operators, and the products by operand shapes (``OperatorTimer.product_rows``). ``step`` runs ``updates``
    updates a call (a :class:`Pass`; the products then by operator alone), called ``runs`` times."""
    timer = OperatorTimer(by_shape=True)
    with timer:
        for _ in range(runs):
            step()
    per = runs * updates
    split = {k: v / per for k, v in timer.split().items()}
    top = sorted(timer.seconds.items(), key=lambda kv: -kv[1])[:operators]
    return {
        **split,
        "calls": sum(c for name, c in timer.calls.items() if name not in PRODUCTS) // per,
        "top": [(name, s / per, timer.calls[name] // per) for name, s in top],
        "products_by_shape": timer.product_rows(per, by_shape=updates == 1),
    }


class Pass:
    """One update of ``step`` (a ``measure.TrainStep``: one model, one optimizer) on each of ``samples`` in turn."""

    def __init__(self, step: measure.TrainStep, samples: list):
        self.step, self.samples = step, samples

    def _each(self, fn) -> None:
        for sample in self.samples:
            self.step.sample = sample
            fn()

    def __call__(self) -> None:
        self._each(self.step)

    def forward_backward(self) -> None:
        self._each(self.step.forward_backward)


def _steps(args, size_name: str, cpu: torch.device):
    """({"fconv": step, "convs2s": step}, updates a step runs): the harness's batch, or ``--data``'s batches."""
    if args.data is None:
        fconv, convs2s, sample, pad = measure.training_pair(size_name, cpu)
        return {
            "fconv": measure.TrainStep(fconv, sample, pad),
            "convs2s": measure.TrainStep(convs2s, sample, pad, fused_loss=True),
        }, 1
    task, samples = load_batches(args.data, args.max_tokens, args.batches)
    source, target = task.source_dictionary, task.target_dictionary
    fconv, convs2s = build_pair(SIZES[size_name], source, dropout=0.2, target_dictionary=target)
    pad = target.pad()
    steps = {
        "fconv": Pass(measure.TrainStep(fconv, samples[0], pad), samples),
        "convs2s": Pass(measure.TrainStep(convs2s, samples[0], pad, fused_loss=True), samples),
    }
    words = sum(s["ntokens"] for s in samples)
    print(f"{size_name}: {len(samples)} batches of {args.data} (--max-tokens {args.max_tokens}), {words} target tokens")
    return steps, len(samples)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=size_names, default="iwslt", help=f"comma-separated, of {sorted(SIZES)}")
    p.add_argument("--repeats", type=positive_int, default=7, help="timed updates per model (medians), and timed runs")
    measure.add_malloc_flag(p)
    p.add_argument("--products", type=int, default=8, help="product shapes listed per model, slowest first")
    p.add_argument("--operators", type=int, default=8, help="operators listed per model, slowest first")
    p.add_argument("--data", type=data_bin, help="a fairseq-preprocess folder: its training batches, not the harness's")
    p.add_argument("--max-tokens", type=positive_int, default=1000, help="--data's batch size (default: %(default)s)")
    p.add_argument("--batches", type=positive_int, default=8, help="--data's batches a run (default: %(default)s)")
    args = p.parse_args(argv)
    cpu = torch.device("cpu")
    kept = args.keep_freed_memory and keep_freed_memory()
    peak = measure.matmul_peak(torch.float32, cpu)
    print(f"{measure.machine_line(kept)}; fp32 2048^3 matmul peak {peak:.0f} GFLOP/s at the start")
    for size_name in args.sizes.split(","):
        steps, updates = _steps(args, size_name, cpu)
        times = measure.alternate(steps, args.repeats, warmup=1, device=cpu)
        rows = {}
        for name, step in steps.items():
            split = split_update(step, args.repeats, args.operators, updates)
            gflop = measure.count_flops(step.forward_backward) / 1e9 / updates
            rows[name] = {"wall": measure.median(times[name]) / updates, "gflop": gflop, **split}
        # measured again beside the updates, the higher kept (as benchmarks.run does): one slow spell of the
        # shared machine would otherwise put products above "100%" of it
        peak = max(peak, measure.matmul_peak(torch.float32, cpu))
        print(f"\n{size_name}: fp32 matmul peak {peak:.0f} GFLOP/s (the higher of the start's and now)")
        for name, row in rows.items():
            wall, gflop = row["wall"], row["gflop"]
            rest = wall - row["products"] - row["other"]
            print(
                f"\n{size_name} {name}: update {wall * 1e3:.0f} ms = products {row['products'] * 1e3:.0f} ms "
                f"({gflop:.1f} GFLOP at {gflop / row['products']:.0f} GFLOP/s, "
                f"{gflop / row['products'] / peak:.0%} of the peak) + {row['calls']} other operator calls "
                f"{row['other'] * 1e3:.0f} ms + the rest (Python, dispatch, drift) {rest * 1e3:.0f} ms"
            )
            for op, seconds, calls in row["top"]:
                print(f"  {op:32s} {seconds * 1e3:7.1f} ms {calls:5d} calls{'  (product)' if op in PRODUCTS else ''}")
            print(f"  its products by {'operand shapes' if updates == 1 else 'operator'}, the {args.products} slowest:")
            for r in row["products_by_shape"][: args.products]:
                print(
                    f"    {r['op']:18s} {r['seconds'] * 1e3:7.1f} ms {r['calls']:3d} calls {r['gflops']:5.0f} "
                    f"GFLOP/s ({r['gflops'] / peak:4.0%})  {' '.join('x'.join(map(str, s)) for s in r['shapes'])}"
                )
        f, c = rows["fconv"], rows["convs2s"]
        budget = f["wall"] / TARGET
        print(
            f"\n{size_name}: convs2s {f['wall'] / c['wall']:.2f}x fconv. {TARGET}x needs an update of "
            f"{budget * 1e3:.0f} ms; convs2s's products take {c['products'] * 1e3:.0f} ms of it (all its "
            f"arithmetic at the peak: {c['gflop'] / peak * 1e3:.0f} ms), leaving "
            f"{(budget - c['products']) * 1e3:.0f} ms ({(budget - c['gflop'] / peak) * 1e3:.0f} ms) for the other "
            f"operators and the rest, which take {(c['wall'] - c['products']) * 1e3:.0f} ms "
            f"(fconv's: {(f['wall'] - f['products']) * 1e3:.0f} ms)"
        )


if __name__ == "__main__":
    main()
