"""The model a recipe tests: an average of checkpoints from the end of training, or the best checkpoint, whichever
has the lower validation loss, so that averaging cannot make the result worse.

Averaging the last N epochs helps a converged run, whose last epochs are all near the optimum; under a time budget
the last N epochs can reach back to under-trained weights. So only checkpoints from the final part of training
(by update count) are averaged, and the average is kept only if ``fairseq-validate`` scores it below the best
single checkpoint, both in fp32 with the checkpoint's own criterion.
"""

import re
from pathlib import Path
from typing import Callable, List, NamedTuple, Optional

from recipes.average_checkpoints import epoch_checkpoints, load_checkpoint

_VALID_LOSS = re.compile(r"valid on '[^']*' subset \| loss ([0-9.]+) \| nll_loss ([0-9.]+)")


class Saved(NamedTuple):
    """A checkpoint file and the number of updates it was saved after."""

    path: Path
    num_updates: int


def num_updates_of(path: Path) -> int:
    """The number of updates a fairseq checkpoint was saved after."""
    return int(load_checkpoint(path)["optimizer_history"][-1]["num_updates"])


def averaging_candidates(folder: Path, last: int, tail: float) -> List[Saved]:
    """Up to ``last`` checkpoints, oldest first, saved in the final ``tail`` of training by update count: the
    epoch checkpoints and ``checkpoint_last.pt`` when it is newer than all of them (training stopped at a time
    budget, mid-epoch)."""
    saved = [Saved(path, num_updates_of(path)) for path in epoch_checkpoints(folder)]
    last_path = folder / "checkpoint_last.pt"
    if last_path.exists():
        final = num_updates_of(last_path)
        if not saved or final > saved[-1].num_updates:
            saved.append(Saved(last_path, final))
    if not saved:
        return []
    end = saved[-1].num_updates
    return [s for s in saved if s.num_updates >= (1.0 - tail) * end][-last:]


def validation_loss(output: str) -> float:
    """The loss of ``fairseq-validate``'s output."""
    match = _VALID_LOSS.search(output)
    if match is None:
        raise ValueError(f"no validation loss in fairseq-validate's output:\n{output[-2000:]}")
    return float(match.group(1))


class Choice(NamedTuple):
    """The model to test, and the line that says why."""

    path: Path
    reason: str


def choose(averaged: Optional[Path], best: Path, validate: Callable[[Path], float], inputs: List[Saved]) -> Choice:
    """``averaged`` (the average of ``inputs``) or ``best``, whichever ``validate`` gives the lower loss; the best
    alone when there is no average (one candidate only); without a best (training that never validated, as with
    ``--disable-validation``), the average, or the one candidate."""
    if not best.exists():
        model = averaged if averaged is not None else inputs[-1].path
        return Choice(model, f"{model.name} (no {best.name}: training saved none, as without validation)")
    if averaged is None:
        return Choice(best, f"{best.name} (one checkpoint in the final part of training: nothing to average)")
    names = ", ".join(s.path.name for s in inputs)
    avg_loss, best_loss = validate(averaged), validate(best)
    losses = f"validation loss {avg_loss:.4f} for the average of {names}; {best_loss:.4f} for {best.name}"
    if avg_loss < best_loss:
        return Choice(averaged, f"{averaged.name} ({losses})")
    return Choice(best, f"{best.name} ({losses})")
