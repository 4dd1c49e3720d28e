"""Average the parameters of several fairseq checkpoints into one (fairseq's scripts/average_checkpoints.py is not in
its pip package).

    python examples/recipes/average_checkpoints.py --inputs ckpt/checkpoint8.pt ckpt/checkpoint9.pt \\
        ckpt/checkpoint10.pt --output ckpt/checkpoint_avg.pt
    python examples/recipes/average_checkpoints.py --last 5 --checkpoint-dir ckpt --output ckpt/checkpoint_avg.pt

The result is the newest input with its model weights replaced by the element-wise mean, so it loads anywhere the
inputs load (``fairseq-generate --path``, ``--restore-file``). ConvS2S keeps weight norm's g and v as its
parameters; like fairseq's script this averages g and v, not the effective weights.
"""

import argparse
import pickle
import re
import sys
import warnings
from pathlib import Path
from typing import List, Sequence

import torch

_EPOCH_CHECKPOINT = re.compile(r"checkpoint(\d+)\.pt$")


def epoch_checkpoints(folder: Path) -> List[Path]:
    """The ``checkpoint<epoch>.pt`` files in ``folder``, oldest epoch first."""
    found = []
    for path in folder.glob("checkpoint*.pt"):
        m = _EPOCH_CHECKPOINT.match(path.name)
        if m:
            found.append((int(m.group(1)), path))
    return [path for _, path in sorted(found)]


def last_epoch_checkpoints(folder: Path, n: int) -> List[Path]:
    """The ``n`` newest ``checkpoint<epoch>.pt`` files in ``folder``, oldest first (fewer if fewer exist)."""
    return epoch_checkpoints(folder)[-n:]


def load_checkpoint(path: Path) -> dict:
    """A fairseq checkpoint's state on the CPU; ValueError naming the file when it is missing or not one."""
    # fairseq pickles an argparse.Namespace into its checkpoints; allow-listing it (what importing the plugin
    # does, without the seconds that importing fairseq takes) lets the safe loader of torch >= 2.6 read them
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is not None:
        add_safe_globals([argparse.Namespace])
    try:
        with warnings.catch_warnings():  # (a pickle of another protocol than torch's: a warning before the refusal)
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            state = torch.load(path, map_location="cpu")
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except pickle.UnpicklingError as e:  # a pickle of other objects: torch's text says to load it unsafely
        found = re.search(r"WeightsUnpickler error: (.+?)\n\n", str(e), re.S)
        detail = found.group(1).strip() if found else type(e).__name__
        raise ValueError(f"{path}: cannot be read as a torch checkpoint (torch's safe loader: {detail})") from None
    except Exception as e:  # truncated, or not a torch file
        raise ValueError(f"{path}: cannot be read as a torch checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise ValueError(f"{path}: not a fairseq checkpoint (no 'model' state dict in it)")
    return state


def average_checkpoints(inputs: Sequence[Path]) -> dict:
    """The newest (last) of ``inputs`` with ``state["model"]`` the mean of all their models.

    Floating-point tensors are summed in float64 and cast back to their dtype (fp16 checkpoints keep their
    precision); integer buffers are taken from the newest checkpoint.
    """
    if not inputs:
        raise ValueError("no checkpoints to average")
    sums = None
    state = None
    for path in inputs:
        state = load_checkpoint(path)
        model = state["model"]
        if sums is None:
            sums = {k: v.double() if v.is_floating_point() else v for k, v in model.items()}
            continue
        if model.keys() != sums.keys():
            raise ValueError(f"{path} holds different parameters than {inputs[0]}: not the same model")
        for key, value in model.items():
            if value.shape != sums[key].shape:
                raise ValueError(
                    f"{path} and {inputs[0]} hold {key} in different shapes ({tuple(value.shape)} and "
                    f"{tuple(sums[key].shape)}): not the same model"
                )
            if value.is_floating_point():
                sums[key] += value.double()
    averaged = {}
    for key, value in state["model"].items():
        averaged[key] = (sums[key] / len(inputs)).to(value.dtype) if value.is_floating_point() else value
    state["model"] = averaged
    return state


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=Path, nargs="+", help="checkpoint files to average")
    parser.add_argument("--last", type=int, help="average the last N checkpoint<epoch>.pt of --checkpoint-dir")
    parser.add_argument("--checkpoint-dir", type=Path)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.last is not None and args.last < 1:
        parser.error(f"argument --last: must be at least 1, got {args.last}")
    if args.output.is_dir() or not args.output.resolve().parent.is_dir():
        parser.error(f"argument --output: {args.output} is a folder, or in a folder that does not exist")
    if args.inputs:
        inputs = args.inputs
    elif args.last and args.checkpoint_dir:
        inputs = last_epoch_checkpoints(args.checkpoint_dir, args.last)
    else:
        parser.error("give --inputs, or --last N with --checkpoint-dir")
    if not inputs:
        sys.exit(f"average_checkpoints: error: no checkpoint<epoch>.pt files in {args.checkpoint_dir}")
    if any(args.output.resolve() == p.resolve() for p in inputs):
        parser.error(f"argument --output: {args.output} is one of the inputs; give the average a file of its own")
    print(f"averaging {len(inputs)} checkpoints: {', '.join(p.name for p in inputs)}")
    # written under another name and renamed when complete: an interrupted or failed save leaves no half a file
    # under the output's name (nor destroys the file that was there)
    partial = args.output.with_name(args.output.name + ".partial")
    try:
        torch.save(average_checkpoints(inputs), partial)
        partial.replace(args.output)
    except (ValueError, OSError) as e:  # an unreadable or mismatched input; a full disk
        sys.exit(f"average_checkpoints: error: {e}")
    finally:
        partial.unlink(missing_ok=True)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
