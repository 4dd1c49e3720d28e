"""What each inference speed-up buys: convs2s with one of them turned off at a time, against itself.

``python -m benchmarks.ablations [--threads N] [--size iwslt] [--batches 1,16] [--variants ...] [--repeats 5]``
times beam-5 generation (16 sentences, or one batch where larger) of the convs2s_iwslt_de_en size (or ``--size``)
with, in turn:
- ``no-fold-cache``: weight norm re-derived on every call at inference and multiplied as ``W`` by MKL, as fconv
  does (and the steps through the modules);
- ``mkl-linear``: inference products by MKL on the cached ``W^T`` instead of oneDNN on the packed ``W``;
- ``module-steps``: decoding steps through the modules (each product looking its weights up per call) instead
  of the fast path's products (``models/fast_path.py``), made once per batch;
- ``per-step-attention``: the fast path's attention projecting every hypothesis through W_d and W_c at every
  step instead of once per source (``convs2s_runtime.attention.FoldedAttention``);
- ``every-row-first-step``: the first decoding step on all beam x sentences rows, as fconv computes it, instead of
  one row per sentence (``fast_path.first_step_copies``).
Each variant is timed alternately with the unchanged model (medians); ratio = variant time / unchanged time, so
above 1 means the speed-up pays.
"""

import argparse
import contextlib
import time
from unittest import mock

import torch
import torch.nn.functional as F

from convs2s_runtime import products, step
from fairseq_convs2s.models import decoder, fast_path
from fairseq_convs2s.modules.weight_norm import WeightNorm

from . import measure
from .arguments import positive_int, positive_ints
from .pair import SIZES, build_pair, make_dictionary


@contextlib.contextmanager
def no_fold_cache():
    # every product folds its weight at each call and multiplies W by MKL: re-deriving W^T or a packed W as well
    # would charge a copy fconv never pays
    per_call = mock.patch.object(
        WeightNorm, "product", lambda self: lambda x: F.linear(x, self.product_weight(), self.bias)
    )
    with per_call, module_steps():  # the fast path's products keep their weights for the batch
        yield


def module_steps():
    return mock.patch.object(fast_path, "can_take_fast_path", lambda decoder: False)


def per_step_attention():
    return mock.patch.object(step, "FOLDED_SOURCES_BUDGET", 0)


def every_row_first_step():
    return mock.patch.object(decoder, "first_step_copies", lambda *args: 1)


def mkl_linear():
    return mock.patch.object(products, "ONEDNN_MIN_MACS", float("inf"))


VARIANTS = {
    "no-fold-cache": no_fold_cache,
    "mkl-linear": mkl_linear,
    "module-steps": module_steps,
    "per-step-attention": per_step_attention,
    "every-row-first-step": every_row_first_step,
}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--size", choices=sorted(SIZES), default="iwslt")
    p.add_argument(
        "--batches",
        type=positive_ints,
        default="1,16",
        help="generation batch sizes, comma-separated (16 sentences, or the batch)",
    )
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    args = p.parse_args(argv)
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variants {', '.join(unknown)}: choose from {', '.join(VARIANTS)}")
    measure.use_threads(args.threads)
    cpu = torch.device("cpu")
    size = SIZES[args.size]
    dictionary = make_dictionary(size.vocab)
    _, model = build_pair(size, dictionary, dropout=0.2)
    model.eval()  # (dropout off, as fairseq-generate runs it)
    print(f"torch threads {torch.get_num_threads()}; ratio = variant time / unchanged time (median)")
    for batch in (int(b) for b in args.batches.split(",")):
        samples = measure.source_batches(dictionary, max(16, batch), 25, batch, cpu)
        run, _ = measure.generator_fn(model, dictionary, samples, 5, 25)
        for name in variants:
            _report(f"{args.size} generate beam 5 batch {batch}", name, run, args.repeats)


def _report(what: str, variant: str, fn, repeats: int) -> None:
    def changed():
        with VARIANTS[variant]():
            fn()

    times = measure.alternate({"unchanged": fn, variant: changed}, repeats, warmup=1, device=torch.device("cpu"))
    base, other = measure.median(times["unchanged"]), measure.median(times[variant])
    print(f"[{time.strftime('%H:%M:%S')}] {what}: {variant} {other:.3f}s vs {base:.3f}s = {other / base:.2f}x")


if __name__ == "__main__":
    main()
