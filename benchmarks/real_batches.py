"""Training updates on a real corpus's batches: fconv with fairseq's criterion against convs2s with the plugin's.

``python -m benchmarks.real_batches DATA_BIN [--batches 8] [--repeats 5] [--max-tokens 4000]`` loads the train
split of a ``fairseq-preprocess``-ed corpus (Multi30k: ``outputs/multi30k/data-bin``, see README), batches it as
``fairseq-train --max-tokens`` does (length-sorted, shuffled batches of epoch 1), and times one pass of fairseq-
style updates over the first ``--batches`` of them (criterion forward, backward, gradients divided by the sample
size, clip 0.1, NAG 0.99) for:

- ``fconv``: fairseq's ``fconv`` with ``--criterion label_smoothed_cross_entropy``, what a stock user trains;
- ``convs2s``: the same weights converted, with the same criterion;
- ``convs2s-fused-all``: with ``fused_label_smoothed_cross_entropy``, every position projected to the vocabulary
  and the loss taken from those stored logits (what the criterion did before ``output_rows``);
- ``convs2s-fused``: with ``fused_label_smoothed_cross_entropy`` as it runs, the target's non-padding positions
  alone projected (``output_rows``), on a CPU in fp32 projected and scored a chunk of rows at a time.

Unlike the harness's 64 equal-length sentences, these batches carry the padding that length-bucketed real data
has (printed). Each variant trains its own copy of the same weights; the passes alternate (the order flipping
every repeat, one warm-up pass whose losses are kept and compared: equal with ``--dropout 0``), medians; words/s
counts target tokens, as fairseq-train's ``wps``. In-process with freed memory kept
(``keep_freed_memory``, what ``python -m fairseq_convs2s.train`` sets on a CPU), for all variants alike, unless
``--default-malloc``. Writes ``benchmarks/results/real_batches.json``. With ``--profile`` it times nothing and
prints the operators of three updates of fconv and of convs2s (the fused criterion) instead.
"""

import argparse
import contextlib
import copy
import json
from pathlib import Path
from unittest import mock

import torch
from fairseq import options, tasks
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.optim.nag import FairseqNAG

from fairseq_convs2s.criterions import fused_label_smoothed
from fairseq_convs2s.criterions.fused_label_smoothed import FusedLabelSmoothedCrossEntropyCriterion
from fairseq_convs2s.train import keep_freed_memory

from . import measure
from .arguments import data_bin, positive_int
from .pair import SIZES, build_pair
from .profile import print_operators

RESULTS = Path(__file__).resolve().parent / "results"


def load_batches(data_bin: str, max_tokens: int, count: int, seed: int = 1):
    """(task, the first ``count`` training samples as fairseq-train's epoch-1 iterator yields them)."""
    parser = options.get_training_parser()
    cfg = convert_namespace_to_omegaconf(
        options.parse_args_and_arch(parser, [data_bin, "--task", "translation", "--arch", "fconv_iwslt_de_en"])
    )
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    iterator = task.get_batch_iterator(
        task.dataset("train"), max_tokens=max_tokens, max_positions=(1024, 1024), seed=seed
    ).next_epoch_itr(shuffle=True)
    return task, [sample for _, sample in zip(range(count), iterator)]


class Update:
    """One fairseq-style update of ``model`` with ``criterion`` on a sample."""

    def __init__(self, model, criterion):
        self.model, self.criterion = model.train(), criterion
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = FairseqNAG(measure._NagCfg(), self.params)

    def __call__(self, sample) -> float:
        for p in self.params:
            p.grad = None
        loss, sample_size, _ = self.criterion(self.model, sample)
        loss.backward()
        for p in self.params:  # fairseq's trainer: optimizer.multiply_grads(1 / sample_size)
            if p.grad is not None:
                p.grad.mul_(1.0 / sample_size)
        torch.nn.utils.clip_grad_norm_(self.params, 0.1)
        self.optimizer.step()
        return loss.item() / sample_size


@contextlib.contextmanager
def _all_positions():
    """The fused criterion without the row selection: every position projected and scored from the stored
    logits, as before ``output_rows`` (and before the decoder scored its rows in chunks)."""
    with mock.patch.object(fused_label_smoothed, "projects_selected_rows", lambda model: False):
        yield


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data_bin", type=data_bin)
    p.add_argument("--size", choices=sorted(SIZES), default="iwslt")
    p.add_argument("--batches", type=positive_int, default=8)
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--max-tokens", type=int, default=4000)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--default-malloc", action="store_true", help="leave glibc's malloc as it is")
    p.add_argument("--out", default=str(RESULTS / "real_batches.json"))
    p.add_argument(
        "--profile", action="store_true", help="instead of timing: fconv's and convs2s's operators over 3 updates each"
    )
    args = p.parse_args(argv)
    if not args.default_malloc:
        keep_freed_memory()
    measure.use_threads(args.threads)
    task, samples = load_batches(args.data_bin, args.max_tokens, args.batches)
    words = sum(s["ntokens"] for s in samples)
    positions = sum(s["target"].numel() for s in samples)
    padding = 1 - words / positions
    print(f"{len(samples)} batches, {words} target tokens in {positions} positions ({padding:.1%} padding)")

    fconv, convs2s = build_pair(
        SIZES[args.size], task.source_dictionary, args.dropout, target_dictionary=task.target_dictionary
    )
    flags = dict(sentence_avg=False, label_smoothing=0.1)
    stock = LabelSmoothedCrossEntropyCriterion(task, **flags)
    fused = FusedLabelSmoothedCrossEntropyCriterion(task, **flags)
    updates = {  # each variant its own copy of the same weights, and its own optimizer
        "fconv": Update(fconv, stock),
        "convs2s": Update(copy.deepcopy(convs2s), stock),
        "convs2s-fused-all": Update(copy.deepcopy(convs2s), fused),
        "convs2s-fused": Update(convs2s, fused),
    }
    contexts = {"convs2s-fused-all": _all_positions}
    if args.profile:
        for name in ("fconv", "convs2s-fused"):
            for sample in samples:  # warm-up: the first pass over the batches
                updates[name](sample)
            with torch.profiler.profile() as prof:
                for sample in samples[:3]:
                    updates[name](sample)
            print_operators(prof, f"{name}, an update on these batches", min(3, len(samples)), 20)
        return
    losses = {}

    def timed_pass(name):
        def run():
            with contexts.get(name, contextlib.nullcontext)():
                losses.setdefault(name, [updates[name](s) for s in samples])  # the first pass's, from equal weights

        return run

    variants = {name: timed_pass(name) for name in updates}
    times = measure.alternate(variants, args.repeats, 1, torch.device("cpu"))
    seconds = {name: measure.median(ts) for name, ts in times.items()}
    rows = []
    print(f"| variant | s per pass ({args.repeats} repeats, median) | words/s | speed over fconv |")
    print("|---|---|---|---|")
    for name, s in seconds.items():
        rows.append({"variant": name, "seconds": s, "words_per_s": words / s, "over_fconv": seconds["fconv"] / s})
        print(f"| `{name}` | {s:.2f} | {words / s:,.0f} | {seconds['fconv'] / s:.2f}x |")
    print(f"convs2s-fused over convs2s-fused-all: {seconds['convs2s-fused-all'] / seconds['convs2s-fused']:.3f}x")
    print(
        "first pass, largest loss difference from fconv's (equal with --dropout 0; dropout draws differ): "
        + ", ".join(f"{n} {max(abs(a - b) for a, b in zip(losses[n], losses['fconv'])):.2g}" for n in losses)
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {
                "machine": measure.describe_machine(torch.device("cpu")),
                "args": vars(args),
                "batches": len(samples),
                "target_tokens": words,
                "target_positions": positions,
                "times_s": times,
                "first_pass_losses": losses,
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
