"""What each speed-up buys: convs2s with one optimization turned off at a time, against itself.

``python -m benchmarks.ablations [--threads N] [--size iwslt] [--batches 1,16] [--variants ...]`` times beam-5
generation (16 sentences, or one batch where larger) and a training update (unless ``--no-training``) of the
convs2s_iwslt_de_en size (or ``--size``) with, in turn:
- ``no-fold-cache``: weight norm re-derived on every call at inference and multiplied as ``W`` by MKL, as fconv
  does;
- ``mkl-linear``: inference products by MKL on the cached ``W^T`` instead of oneDNN on the packed ``W``;
- ``module-steps``: decoding steps through the modules (each product looking its weights up per call) instead
  of the decoder's folded products, looked up once per pass;
- ``per-step-attention``: the folded steps' attention projecting every hypothesis through W_d and W_c at every
  step instead of once per source (``FoldedAttention``);
- ``every-row-first-step``: the first decoding step on all beam x sentences rows, as fconv computes it, instead of
  one row per sentence (``first_step_once_per_source``);
- ``unfused-weight-norm``: training weight norm as a norm, a division and two products instead of torch's kernel.
Each variant is timed alternately with the unchanged model (medians); the ratio is what the optimization buys.

``--compiled-steps`` instead times beam-5 generation (batch 1) of the model prepared as fairseq-generate prepares
it, its decoder's forward, every decoding step, through ``torch.compile`` (inductor), against the same prepared
model run eagerly: the first compiled run (which compiles) apart, then alternated, hypotheses compared.
"""

import argparse
import contextlib
import time
from unittest import mock

import torch
import torch.nn.functional as F

from fairseq_convs2s.models.decoder import ConvS2SDecoder
from fairseq_convs2s.modules import weight_norm

from . import measure
from .pair import SIZES, build_pair, make_dictionary


@contextlib.contextmanager
def no_fold_cache():
    original = weight_norm._WeightNorm._derived, weight_norm.inference_linear
    weight_norm._WeightNorm._derived = lambda self, name, compute: compute()
    # re-deriving W^T or a packed W as well would charge a copy fconv never pays
    weight_norm.inference_linear = lambda layer, x, bias: F.linear(x, layer._product_weight(), bias)
    try:
        with module_steps():  # the folded products would keep their weights for the pass
            yield
    finally:
        weight_norm._WeightNorm._derived, weight_norm.inference_linear = original


def module_steps():
    return mock.patch.object(ConvS2SDecoder, "use_folded_products", False)


def per_step_attention():
    return mock.patch.object(ConvS2SDecoder, "folded_attention_budget_mib", 0)


def every_row_first_step():
    return mock.patch.object(ConvS2SDecoder, "first_step_once_per_source", False)


def mkl_linear():
    return mock.patch.object(weight_norm, "ONEDNN_MIN_MACS", float("inf"))


def unfused_weight_norm():
    return mock.patch.object(
        weight_norm._WeightNorm, "_fold", lambda self: self.weight_v * (self.weight_g / self._norm(self.weight_v))
    )


GENERATION_VARIANTS = ("no-fold-cache", "mkl-linear", "module-steps", "per-step-attention", "every-row-first-step")
VARIANTS = {
    "no-fold-cache": no_fold_cache,
    "mkl-linear": mkl_linear,
    "module-steps": module_steps,
    "per-step-attention": per_step_attention,
    "every-row-first-step": every_row_first_step,
    "unfused-weight-norm": unfused_weight_norm,
}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--compiled-steps", action="store_true", help="only the compiled decoding steps against eager")
    p.add_argument("--size", choices=sorted(SIZES), default="iwslt")
    p.add_argument(
        "--batches", default="1,16", help="generation batch sizes, comma-separated (16 sentences, or the batch)"
    )
    p.add_argument("--variants", default=",".join(GENERATION_VARIANTS), help="generation variants, comma-separated")
    p.add_argument("--no-training", action="store_true", help="leave out the training update's variant")
    args = p.parse_args(argv)
    measure.use_threads(args.threads)
    cpu = torch.device("cpu")
    size = SIZES[args.size]
    dictionary = make_dictionary(size.vocab)
    _, model = build_pair(size, dictionary, dropout=0.2)
    if args.compiled_steps:
        samples = measure.source_batches(dictionary, 16, 25, 1, cpu)
        first, times, same = compiled_steps(model, dictionary, samples, 25, args.repeats)
        print(
            f"torch threads {torch.get_num_threads()}; generate beam 5 batch 1, prepared as fairseq-generate "
            f"prepares: compiled steps {times['compiled']:.3f}s vs eager {times['eager']:.3f}s = "
            f"{times['compiled'] / times['eager']:.2f}x (median of {args.repeats}); the first compiled run, "
            f"compiling, {first:.1f}s; the same hypotheses: {same}"
        )
        return
    sample = measure.train_sample(dictionary, 64, 25, cpu)
    step = measure.TrainStep(model, sample, dictionary.pad())
    print(f"torch threads {torch.get_num_threads()}; ratio = variant time / unchanged time (median)")
    for batch in (int(b) for b in args.batches.split(",")):
        model.eval()
        samples = measure.source_batches(dictionary, max(16, batch), 25, batch, cpu)
        run, _ = measure.generator_fn(model, dictionary, samples, 5, 25)
        for name in args.variants.split(","):
            _report(f"{args.size} generate beam 5 batch {batch}", name, run, args.repeats)
    if args.no_training:
        return
    model.train()
    _report("train update (64 x 26 tokens)", "unfused-weight-norm", step, args.repeats)


def compiled_steps(model, dictionary, samples, out_len: int, repeats: int, backend: str = "inductor"):
    """Beam-5 generation of ``samples`` by ``model`` prepared as fairseq-generate prepares it, its decoder's
    forward through ``torch.compile``, against the same prepared model eager: (seconds of the first compiled
    run, which compiles; the medians of the alternated runs, {"eager": s, "compiled": s}; whether both give the
    same hypotheses)."""
    eager = measure.prepare_for_generation(model, 5)
    compiled = measure.prepare_for_generation(model, 5)
    # fairseq's beam search calls model.decoder.forward for every step
    compiled.decoder.forward = torch.compile(compiled.decoder.forward, backend=backend)
    run_eager, eager_out = measure.generator_fn(eager, dictionary, samples, 5, out_len)
    run_compiled, compiled_out = measure.generator_fn(compiled, dictionary, samples, 5, out_len)
    start = time.perf_counter()
    run_compiled()
    first = time.perf_counter() - start
    times = measure.alternate(
        {"eager": run_eager, "compiled": run_compiled}, repeats, warmup=1, device=torch.device("cpu")
    )
    medians = {name: measure.median(t) for name, t in times.items()}
    return first, medians, eager_out["hyps"] == compiled_out["hyps"]


def _report(what: str, variant: str, fn, repeats: int) -> None:
    def changed():
        with VARIANTS[variant]():
            fn()

    times = measure.alternate({"unchanged": fn, variant: changed}, repeats, warmup=1, device=torch.device("cpu"))
    base, other = measure.median(times["unchanged"]), measure.median(times[variant])
    print(f"[{time.strftime('%H:%M:%S')}] {what}: {variant} {other:.3f}s vs {base:.3f}s = {other / base:.2f}x")


if __name__ == "__main__":
    main()
