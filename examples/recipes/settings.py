"""The settings each stage's output was made with, kept in ``OUT/settings.json``, so that a run never reports
another run's results as its own.

A stage is skipped when its output exists; without this record, a second command into the same ``--out`` with
another ``--vocab-size``, ``--source-lang``, ``--raw-dir`` or ``--arch`` skipped the stages those settings decide
and printed the first command's model and score under the second's name (with another direction it tested the
first direction's model on the other's data). Now stages 1-4 stop with one line naming the setting, both values
and what to delete; stages 5-7 (the average, generation and the score: minutes, nothing trained) run again with a
line saying why. Stages 1-4 record their settings when they start (a rerun after an interrupt reuses what they
had made), 5-7 when they finish; an output that was deleted, or a folder left empty, is made anew with this
command's settings, and a folder from before this record is taken as it is.
"""

import json
from pathlib import Path
from typing import Dict, List, Optional

# the command-line names of the settings, for the messages
FLAGS = {
    "raw_dir": "--raw-dir",
    "max_train_lines": "--max-train-lines",
    "vocab_size": "--vocab-size",
    "pair": "--source-lang/--target-lang",
    "arch": "--arch",
    "train_args": "--train-args",
    "time_budget": "--time-budget",
    "update_budget": "--update-budget",
    "precision": "--precision",
    "separate_embeddings": "--separate-embeddings",
    "average_last": "--average-last",
    "generate_args": "--generate-args",
    "max_epoch": "--max-epoch",
}


class SettingsChanged(Exception):
    """A stage's output was made with other settings than this command's; the message says which and what to do."""


class RunSettings:
    """``OUT/settings.json``: {stage: {setting: value}} for the stages whose output this folder holds."""

    def __init__(self, out: Path):
        self.path = out / "settings.json"
        self.recorded: Dict[str, Dict] = {}
        if self.path.exists():
            try:
                self.recorded = json.loads(self.path.read_text(encoding="utf-8"))
            except (ValueError, OSError) as error:
                raise SettingsChanged(
                    f"{self.path} cannot be read ({error}): give this command its own --out, or delete that file to "
                    "go on without comparing settings"
                ) from None

    def difference(self, stage: str, now: Dict) -> Optional[str]:
        """How ``now`` differs from what ``stage`` recorded (``--vocab-size 8000, this command 4000``); None when
        it does not, or nothing was recorded."""
        before = self.recorded.get(stage)
        if before is None:
            return None
        changed = [key for key in now if key in before and before[key] != now[key]]
        if not changed:
            return None
        return "; ".join(
            f"{FLAGS.get(key, key)} {_shown(before[key])}, this command {_shown(now[key])}" for key in changed
        )

    def refuse_changed(self, stage: str, now: Dict, made: Path, remedy: str) -> None:
        """SettingsChanged if ``made`` (the stage's output) is there and ``now`` differs from what ``stage``
        recorded; ``remedy`` says what else to do than give this command its own ``--out``. (An output that is gone,
        or an empty folder of a stage that stopped before writing anything, holds nothing to protect: the stage runs
        and records anew.)"""
        kept = made.exists() and not (made.is_dir() and not any(made.iterdir()))
        difference = self.difference(stage, now) if kept else None
        if difference is not None:
            raise SettingsChanged(
                f"{made} was made by another command ({difference}): give this command its own --out, or {remedy}"
            )

    def record(self, stage: str, now: Dict) -> None:
        self.recorded[stage] = now
        self._write()

    def forget(self, *stages: str) -> None:
        """Drop the records of stages whose outputs are gone (they run again and record anew)."""
        for stage in stages:
            self.recorded.pop(stage, None)
        self._write()

    def _write(self) -> None:
        partial = self.path.with_name(self.path.name + ".partial")
        partial.parent.mkdir(parents=True, exist_ok=True)  # (the first record comes before any stage's output)
        partial.write_text(json.dumps(self.recorded, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        partial.rename(self.path)  # (whole or not at all)


def _shown(value) -> str:
    if value is None:
        return "not given"
    if isinstance(value, str):
        return json.dumps(value)  # (quoted: an empty --train-args shows as "")
    return str(value)


def folders(out: Path, *paths: Path) -> str:
    """``raw/, spm/ and data-bin/ in OUT``: the folders to delete, named for a message."""
    names = [f"{path.name}/" for path in paths]
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return f"{listed} in {out}"


def outputs(out: Path, name: str = "*") -> List[Path]:
    """The generation outputs and scores in ``out`` of the test set ``name`` (default: every set), every model: what
    a change of the settings they were made with makes stale."""
    return [*out.glob(f"generate-{name}.*.txt"), *out.glob(f"{name}.*.hyp"), *out.glob(f"score-{name}.*.txt")]


def remove(*paths: Path) -> None:
    for path in paths:
        path.unlink(missing_ok=True)
