"""What a ``--criterion sequence_risk`` update costs, and what the criterion's two shortcuts buy.

    python -m benchmarks.risk_update DATA_BIN CHECKPOINT [--batches 4] [--repeats 3] [--max-tokens 1000]

On real batches of DATA_BIN's train split (fairseq's batching, ``--max-tokens``) and the model of CHECKPOINT (for
example the Multi30k recipe's), it generates the candidates of each batch once (beam search, timed), computes
their costs (timed), then times the scoring update (the forward over reference and candidates, the loss and the
backward) of the criterion as it is and with, in turn:

- ``repeated-sources``: every source repeated for each of its 1 + n rows, as for a model other than ConvS2S,
  instead of one encoder pass per source;
- ``log-softmax``: the token terms through the model's log-softmax (the stored log-probabilities and their
  gathers), as for a model with its own normalization, instead of from the logits in one fused pass;
- ``all-positions``: every position of the rows projected to the vocabulary, the padding of the shorter
  candidates too, instead of the non-padding positions alone (``output_rows``).

``--variants repeated-sources+log-softmax`` takes both at once: the criterion before any of its shortcuts (without
the fused pass every position is projected anyway).
Each variant alternates with the unchanged criterion over the same batches and candidate sets; medians of the
per-update times; ratio = variant time / unchanged time, so above 1 means the shortcut pays.
"""

import argparse
import contextlib
import logging
import statistics
import time

import torch

from . import measure
from .arguments import checkpoint_file, data_bin, positive_int

VARIANTS = ["repeated-sources", "log-softmax", "all-positions"]


@contextlib.contextmanager
def _variant(name: str):
    """``a+b``: both variants at once (``repeated-sources+log-softmax`` is the criterion before either shortcut)."""
    from fairseq_convs2s.criterions import sequence_risk

    attributes = {
        "repeated-sources": "reads_rows_per_source",
        "log-softmax": "normalizes_by_log_softmax",
        "all-positions": "projects_selected_rows",
    }
    originals = {attributes[part]: getattr(sequence_risk, attributes[part]) for part in name.split("+")}
    for attribute in originals:
        setattr(sequence_risk, attribute, lambda model: False)
    try:
        yield
    finally:
        for attribute, original in originals.items():
            setattr(sequence_risk, attribute, original)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data_bin", type=data_bin)
    p.add_argument("checkpoint", type=checkpoint_file)
    p.add_argument("--batches", type=positive_int, default=4)
    p.add_argument("--repeats", type=positive_int, default=3, help="timed passes over the batches, per variant")
    p.add_argument("--max-tokens", type=int, default=1000)
    p.add_argument("--candidates", type=int, default=8)
    p.add_argument("--post-process", default="sentencepiece")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    args = p.parse_args(argv)
    variants = args.variants.split(",")
    for name in variants:  # before the model is loaded and the candidates generated
        if not set(name.split("+")) <= set(VARIANTS):
            p.error(f"unknown variant {name!r}: choose from {', '.join(VARIANTS)}")
    logging.disable(logging.WARNING)
    measure.use_threads(args.threads)
    from fairseq import checkpoint_utils

    import fairseq_convs2s  # noqa: F401  (registers the model and the criterion)
    from fairseq_convs2s.criterions import SequenceRiskCriterion

    started = time.time()
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [args.checkpoint], arg_overrides={"data": args.data_bin}
    )
    model = models[0].train()
    task.load_dataset("train")
    batches = task.get_batch_iterator(task.dataset("train"), max_tokens=args.max_tokens, seed=1)
    itr = batches.next_epoch_itr(shuffle=True)
    samples = [next(itr) for _ in range(args.batches)]
    criterion = SequenceRiskCriterion(task, False, risk_candidates=args.candidates, risk_post_process=args.post_process)

    generate_s, cost_s, csets = [], [], []
    for sample in samples:
        start = time.perf_counter()
        candidates = criterion.generate_candidates(model, sample)
        generate_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        csets.append(criterion.build_candidate_set(sample, candidates))
        cost_s.append(time.perf_counter() - start)

    def score(index):
        model.zero_grad(set_to_none=True)
        criterion.loss_on_candidates(model, samples[index], csets[index])[0].backward()

    machine = measure.describe_machine(torch.device("cpu"))
    sizes = ", ".join(f"{s['nsentences']} x {c.costs.size(1)} rows" for s, c in zip(samples, csets))
    cpu = f"{machine['cpu']}, {machine['torch_threads']} torch threads"
    print(f"{cpu}, torch {machine['torch']}, commit {machine['git_commit']}")
    print(f"{args.batches} batches of --max-tokens {args.max_tokens} ({sizes}); {args.candidates} beam candidates")
    print(
        f"per update (median): beam search {statistics.median(generate_s):.3f}s, costs {statistics.median(cost_s):.3f}s"
    )

    def unchanged():
        for i in range(len(samples)):
            score(i)

    for name in variants:

        def changed(name=name):
            with _variant(name):
                unchanged()

        times = measure.alternate({"unchanged": unchanged, name: changed}, args.repeats, 1, torch.device("cpu"))
        base = statistics.median(times["unchanged"]) / len(samples)
        other = statistics.median(times[name]) / len(samples)
        print(f"scoring update: {name} {other:.3f}s vs unchanged {base:.3f}s = {other / base:.2f}x", flush=True)
    print(f"whole run: {(time.time() - started) / 60:.1f} min")


if __name__ == "__main__":
    main()
