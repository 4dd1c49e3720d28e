"""What each of the training update's choices buys: convs2s against itself with one of them changed at a time.

``python -m benchmarks.train_forms [--sizes iwslt,wmt_en_de] [--repeats R] [--device cuda] [--dtype bf16]`` times
the harness's training update (64 x 26 target tokens, label smoothing, backward, clip, NAG) of convs2s unchanged
and with, in turn:
- ``mkl-linears``: the linears by MKL: the weight-normalized ones and the tied output by ``F.linear``, and the
  fused criterion's vocabulary projection by its plain ``addmm`` / ``mm``, instead of the products whose forward
  and input gradient run through oneDNN (``modules/training_products.py``, ``criterions/label_smoothed_loss.py``);
- ``conv-tbc``: the convolutions by ``conv_tbc`` (an MKL product per kernel tap, what fconv runs), instead of
  one oneDNN product over the k shifted inputs side by side (``Im2colConvTBC``);
- ``fairseq-loss``: fairseq's ``label_smoothed_cross_entropy`` loss through the log-softmax, instead of the
  plugin's ``fused_label_smoothed_cross_entropy`` (the unchanged update uses the fused criterion);
- ``logits-loss``: the fused criterion's loss from the N x V logits the projection writes (in one pass), instead
  of projection and loss a chunk of rows at a time, without the logits (``projected_label_smoothed_loss``);
- ``torch-dropout``: ``F.dropout`` (a float Bernoulli mask, what fconv runs) instead of the model's CPU
  dropout (a mask from 32 random bits an element, kept as bools; ``fairseq_convs2s.modules.dropout``);
- ``torch-compile``: the model's forward (and so its backward) compiled by ``torch.compile`` (inductor; the
  compilation falls in the warm-up), instead of run eagerly; the loss and optimizer step stay eager.
Medians of the repeats, each variant timed alternately with the unchanged model; ratio = variant time /
unchanged time, so above 1 means the model's choice pays.
"""

import argparse
import contextlib
import time

import torch
import torch.nn.functional as F
from fairseq.modules import FairseqDropout

from fairseq_convs2s.criterions import fused_label_smoothed, label_smoothed_loss
from fairseq_convs2s.modules import dropout, embedding, weight_norm

from . import measure
from .arguments import device_name, names_of, positive_int, size_names


@contextlib.contextmanager
def _patched(cls, name, fn):
    original = getattr(cls, name)
    setattr(cls, name, fn)
    try:
        yield
    finally:
        setattr(cls, name, original)


@contextlib.contextmanager
def mkl_linears(step):
    with contextlib.ExitStack() as patches:
        for module in (weight_norm, embedding):
            patches.enter_context(_patched(module, "training_linear", F.linear))
        patches.enter_context(_patched(label_smoothed_loss, "onednn_pays", lambda *args, **kwargs: False))
        yield


@contextlib.contextmanager
def conv_tbc(step):
    with _patched(weight_norm, "im2col_pays", lambda x, weight: False):
        yield


@contextlib.contextmanager
def fairseq_loss(step):
    with _patched(step, "fused_loss", False):  # through the model's get_normalized_probs and fairseq's loss
        yield


@contextlib.contextmanager
def logits_loss(step):
    with _patched(fused_label_smoothed, "projects_in_chunks", lambda x: False):
        yield


@contextlib.contextmanager
def torch_dropout(step):
    with _patched(dropout.Dropout, "forward", FairseqDropout.forward):
        yield


@contextlib.contextmanager
def torch_compile(step):
    if "compiled_model" not in vars(step):  # one wrapper, compiled at its first call (the warm-up)
        step.compiled_model = torch.compile(step.model)
    with _patched(step, "model", step.compiled_model):
        yield


VARIANTS = {
    "mkl-linears": mkl_linears,
    "conv-tbc": conv_tbc,
    "fairseq-loss": fairseq_loss,
    "logits-loss": logits_loss,
    "torch-dropout": torch_dropout,
    "torch-compile": torch_compile,
}

GPU_VARIANTS = ["fairseq-loss", "torch-compile"]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=size_names, default="iwslt,wmt_en_de")
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument(
        "--variants",
        type=names_of(VARIANTS),
        default=",".join(VARIANTS),
        help=f"comma-separated, of {', '.join(VARIANTS)}",
    )
    p.add_argument(
        "--device",
        type=device_name,
        default="cpu",
        choices=["cpu", "cuda"],
        help=f"cuda: {', '.join(GPU_VARIANTS)} only",
    )
    p.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    args = p.parse_args(argv)
    variants = args.variants.split(",")
    if args.device == "cuda" and not set(variants) <= set(GPU_VARIANTS):
        p.error(f"on a GPU only {', '.join(GPU_VARIANTS)} apply (the others move CPU products about)")
    measure.use_threads(args.threads, need_onednn=args.device == "cpu")
    started = time.time()
    device = torch.device(args.device)
    machine = measure.describe_machine(device)
    where = machine.get("gpu", f"{machine['cpu']}, {machine['torch_threads']} torch threads")
    print(f"{where}, torch {machine['torch']}, {args.dtype}; ratio = variant time / unchanged time (median)")
    for size_name in args.sizes.split(","):
        _, model, sample, pad = measure.training_pair(size_name, device)
        step = measure.TrainStep(model.to(device), sample, pad, DTYPES[args.dtype], fused_loss=True)
        for name in variants:
            variant = VARIANTS[name]

            def changed(variant=variant, step=step):
                with variant(step):
                    step()

            times = measure.alternate({"unchanged": step, name: changed}, args.repeats, warmup=1, device=device)
            base, other = measure.median(times["unchanged"]), measure.median(times[name])
            print(f"{size_name} update: {name} {other:.3f}s vs unchanged {base:.3f}s = {other / base:.2f}x", flush=True)
    print(f"whole run: {(time.time() - started) / 60:.1f} min")


if __name__ == "__main__":
    main()
