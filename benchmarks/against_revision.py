"""A change's own speed-up: the harness's training update with some of the model's code as it is now and as it
was at a git revision, alternated in one process.

``python -m benchmarks.against_revision REV MODULE:NAME[,NAME...] [--sizes iwslt] [--repeats 21]
[--keep-freed-memory]`` loads ``MODULE`` (a dotted name under ``fairseq_convs2s``) as it was at ``REV`` beside the
current one, and times convs2s's update (64 x 26 target tokens through the fused criterion, backward, clip, NAG;
``measure.TrainStep``) with the named attributes taken from either, in turn, on one model. Attributes are classes'
methods (``_ProjectedLabelSmoothed.forward``) or module functions. The order flips every round, medians; ratio =
old time / new time, so above 1 means the change pays. A change of a few percent is below the run-to-run spread of
the harness's ratios against fconv (about 0.1), not of this alternation (two copies of the same code: within 3%).
"""

import argparse
import importlib
import subprocess
import types
from pathlib import Path

import torch

from fairseq_convs2s.train import keep_freed_memory

from . import measure
from .arguments import git_revision, positive_int, size_names
from .pair import SIZES

ROOT = Path(__file__).resolve().parent.parent


def module_at(revision: str, name: str) -> types.ModuleType:
    """Module ``name`` (``fairseq_convs2s.x.y``) as its file was at ``revision``, loaded in the same package so
    its relative imports resolve to today's modules."""
    path = name.replace(".", "/") + ".py"
    source = subprocess.run(
        ["git", "show", f"{revision}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    package = name.rpartition(".")[0]
    old = types.ModuleType(f"{name}_at_{revision}")
    old.__package__ = package
    old.__file__ = str(ROOT / path)
    # fairseq registries refuse a second registration of the same name: the old module's are no-ops
    source = source.replace("@register_criterion(", "@(lambda *a, **k: lambda c: c)(")
    exec(compile(source, f"{revision}:{path}", "exec"), old.__dict__)
    return old


def _resolve(module: types.ModuleType, dotted: str):
    """(owner, attribute name, value) of ``Class.method`` or ``function`` in ``module``."""
    owner_name, _, attr = dotted.rpartition(".")
    owner = getattr(module, owner_name) if owner_name else module
    return owner, attr, owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("revision", type=git_revision, help="a git revision: HEAD~1, a commit")
    p.add_argument("what", help="MODULE:NAME[,NAME...], e.g. criterions.fused_label_smoothed:_X.forward")
    p.add_argument("--sizes", type=size_names, default="iwslt", help=f"comma-separated, of {sorted(SIZES)}")
    p.add_argument("--repeats", type=positive_int, default=21)
    measure.add_malloc_flag(p)
    args = p.parse_args(argv)
    module_name, _, names = args.what.partition(":")
    module_name = module_name if module_name.startswith("fairseq_convs2s.") else f"fairseq_convs2s.{module_name}"
    if not names:
        p.error("name the attributes to swap: MODULE:NAME[,NAME...]")
    try:
        new_module = importlib.import_module(module_name)
    except ModuleNotFoundError:
        p.error(f"argument what: no module {module_name}")
    try:
        old_module = module_at(args.revision, module_name)
    except subprocess.CalledProcessError:
        p.error(f"argument what: {module_name} is not in {args.revision}")
    swaps = []  # (owner in today's module, attribute, today's value, the revision's value)
    for dotted in names.split(","):
        try:
            owner, attr, new = _resolve(new_module, dotted)
            swaps.append((owner, attr, new, _resolve(old_module, dotted)[2]))
        except (AttributeError, KeyError):
            p.error(f"argument what: {module_name} has no {dotted}, now or at {args.revision}")
    kept = args.keep_freed_memory and keep_freed_memory()

    def use(which: int) -> None:
        for owner, attr, *values in swaps:
            setattr(owner, attr, values[which])

    print(
        f"{measure.machine_line(kept)}; {args.what} at {args.revision} against the working tree; ratio = old / new "
        f"(median of {args.repeats})",
        flush=True,
    )
    for size_name in args.sizes.split(","):
        _, model, sample, pad = measure.training_pair(size_name, torch.device("cpu"))
        step = measure.TrainStep(model, sample, pad, fused_loss=True)

        def timed(which: int, step=step):
            def run():
                use(which)
                step()

            return run

        try:
            times = measure.alternate(
                {"new": timed(0), "old": timed(1)}, args.repeats, warmup=1, device=torch.device("cpu")
            )
        finally:
            use(0)
        old, new = measure.median(times["old"]), measure.median(times["new"])
        print(f"{size_name} update: {args.revision} {old:.3f}s, now {new:.3f}s = {old / new:.3f}x", flush=True)


if __name__ == "__main__":
    main()
