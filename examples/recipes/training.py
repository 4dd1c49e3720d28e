"""The training flags a recipe adds to fairseq-train: the paper's optimization, under a time budget when one is
given, and the plugin's fastest correct path on the device the recipe runs on. Each choice is printed with its
reason; a flag the user gives in ``--train-args`` wins over the choice.
"""

import argparse
import re
import statistics
from pathlib import Path
from typing import Collection, List, Optional, Sequence, Tuple

from recipes.curve import train_inner_values

# The paper's optimization (section 4.2-4.3): Nesterov momentum 0.99, gradient norm clipped at 0.1, the learning
# rate divided by 10 whenever validation loss stops improving, until it falls below 1e-4; fairseq's recipes add
# label smoothing 0.1. --lr, --dropout and --max-tokens come from each recipe.
OPTIMIZER = ["--optimizer", "nag", "--momentum", "0.99", "--clip-norm", "0.1", "--label-smoothing", "0.1"]
PLATEAU_SCHEDULE = ["--lr-scheduler", "reduce_lr_on_plateau", "--lr-shrink", "0.1", "--stop-min-lr", "1e-4"]

FUSED = "fused_label_smoothed_cross_entropy"
FAIRSEQ_LOSS = "label_smoothed_cross_entropy"
_PRECISION_FLAGS = ("--fp16", "--bf16", "--memory-efficient-fp16", "--memory-efficient-bf16")


def optimization_flags(time_budget: Optional[float] = None, update_budget: Optional[int] = None) -> List[str]:
    """The paper's optimizer; its plateau schedule, or with a budget, ``time_budget`` minutes of training or
    ``update_budget`` updates (whichever ends first when both are given), the plugin's ``--lr-scheduler budget``,
    which holds the rate and then anneals it to 0 exactly where fairseq stops (``--stop-time-hours``,
    ``--max-update``), with no epoch limit (fairseq's ``--max-epoch 0``)."""
    if time_budget is None and update_budget is None:
        return OPTIMIZER + PLATEAU_SCHEDULE
    flags = OPTIMIZER + ["--lr-scheduler", "budget", "--max-epoch", "0"]
    if time_budget is not None:
        flags += ["--stop-time-hours", f"{time_budget / 60:.6g}"]
    if update_budget is not None:
        flags += ["--max-update", str(update_budget)]
    return flags


def later_wins(*parts: Sequence) -> List:
    """The parts of a command in order, each without the flags a later part sets again (the recipe's own flags, then
    the batch and schedule it chose, then ``--train-args`` or ``--generate-args``): fairseq reads a flag's last
    value, and the printed command holds that one only."""
    command: List = []
    for i, part in enumerate(parts):
        later = {str(flag).split("=", 1)[0] for rest in parts[i + 1 :] for flag in rest if str(flag).startswith("--")}
        command += without(part, later)
    return command


def without(flags: Sequence, names: Collection[str]) -> List:
    """``flags`` without the flags called ``names``, each with its value (``--name value`` or ``--name=value``; a
    flag followed by another flag has none)."""
    kept: List = []
    skip = False
    for i, flag in enumerate(flags):
        if skip:
            skip = False
            continue
        name, eq, _ = str(flag).partition("=")
        if name not in names:
            kept.append(flag)
        elif not eq:  # (its value is the next item, unless that is a flag: a switch such as --cpu has none)
            skip = i + 1 < len(flags) and not str(flags[i + 1]).startswith("--")
    return kept


def length_note(time_budget: Optional[float], update_budget: Optional[int], recipe_default: Optional[int]) -> str:
    """One line saying how long training runs: ``update_budget`` is the one in force (None or 0: none)."""
    annealed = "the rate annealed to 0 at the end (--lr-scheduler budget)"
    if time_budget is not None and update_budget:
        return f"length: {time_budget:.3g} minutes or {update_budget} updates, whichever ends first, {annealed}"
    if time_budget is not None:
        return f"length: {time_budget:.3g} minutes, {annealed}"
    if update_budget:
        default = (
            " (the recipe's default; --update-budget 0: the plateau rule)" if update_budget == recipe_default else ""
        )
        return f"length: {update_budget} updates{default}, {annealed}"
    return "length: until validation loss plateaus (the paper's rule: the rate divided by 10 at each, to 1e-4)"


# Under a time budget on a CPU the batch follows what the budget buys, measured by a short trial of the training
# command before training (examples/multi30k/README.md, "The batch a time budget trains"): the recipe's batch,
# halved while the budget would buy fewer than UPDATES_WANTED updates of it. Halving raised the test score of every
# run that made up to about 5,600 updates of the larger batch (by 0.4 to 5.8) and was level for those that made
# 6,000-9,000; a trial catches one moment of a shared machine (a half hour has made 0.77x-1.39x the updates its
# trial expected), so the threshold sits at the top of the level range, where an expectation 1.3x too high still
# halves a batch that would make fewer than 6,000.
UPDATES_WANTED = 10_000
HALF_BATCH_UPDATES = 1.8  # the updates a half batch makes per update of the whole in the same minutes (1.66-1.95)
MOST_HALVINGS = 3  # an eighth of the recipe's batch, the smallest measured
# the trial sees a training's first updates only: a whole half hour ran at 0.87-0.96 of its first few hundred's rate
RUN_TO_TRIAL_RATE = 0.9
TRIAL_UPDATES = 30
TRIAL_LOG_INTERVAL = 10
TRIAL_MIN_BUDGET = 5  # minutes: a shorter budget (a smoke test) trains the recipe's batch, without a trial


def wants_a_trial(recipe_flags: Sequence[str], given: Sequence[str], time_budget: Optional[float], cuda: bool) -> bool:
    """Whether a trial chooses the batch (and with it the dropout, :func:`dropout_flags`): a time budget of
    ``TRIAL_MIN_BUDGET`` minutes or more on a CPU, a recipe with a ``--max-tokens`` and no ``--max-tokens`` in
    ``given`` (``--train-args``). A GPU's budget buys the recipe's batch plenty of updates."""
    has_batch = given_value(recipe_flags, "--max-tokens") is not None
    long_enough = time_budget is not None and time_budget >= TRIAL_MIN_BUDGET
    return long_enough and not cuda and has_batch and given_value(given, "--max-tokens") is None


def trial_flags(save_dir: Path) -> List[str]:
    """The flags that make the training command a trial: ``TRIAL_UPDATES`` updates, logged every
    ``TRIAL_LOG_INTERVAL``, neither validated nor saved."""
    return [
        "--max-update", str(TRIAL_UPDATES), "--stop-time-hours", "0", "--log-interval", str(TRIAL_LOG_INTERVAL),
        "--disable-validation", "--no-save", "--save-dir", str(save_dir),
    ]  # fmt: skip


def updates_per_second(log: str) -> float:
    """The trial's updates a second: the median of the rates fairseq logs (``train_inner ... ups=``) after the
    first interval, which holds the start-up."""
    rates = train_inner_values(log, "ups")
    if len(rates) < 2:
        raise ValueError(f"the trial logged {len(rates)} interval(s) of updates/s, not the two it needs")
    return statistics.median(rates[1:])


def updates_per_epoch(log: str) -> int:
    """The updates an epoch of the trial's batch takes, as fairseq logs it (``train_inner | epoch 001: 10 / 135``)."""
    counts = re.findall(r"\| train_inner \| epoch \d+:\s+\d+ / (\d+)", log)
    if not counts:
        raise ValueError("the trial logged no train_inner line with its epoch's length")
    return int(counts[-1])


def batch_for_the_budget(tokens: int, expected_updates: float, longest: int) -> Tuple[int, float]:
    """The batch (``--max-tokens``) a budget that buys ``expected_updates`` updates of ``tokens`` trains: halved
    while it buys fewer than ``UPDATES_WANTED``, at most ``MOST_HALVINGS`` times and never below ``longest``, the
    tokens of the longest training pair (fairseq refuses a batch that one pair does not fit in); with the updates
    expected of it."""
    chosen, expected = tokens, expected_updates
    for _ in range(MOST_HALVINGS):
        half = max(chosen // 2, longest)
        if expected >= UPDATES_WANTED or half >= chosen:
            break
        chosen, expected = half, expected * HALF_BATCH_UPDATES
    return chosen, expected


def batch_flags(
    recipe_flags: Sequence[str], given: Sequence[str], expected_updates: Optional[float], longest: int
) -> Tuple[List[str], List[str]]:
    """The batch flags and a line saying why: the user's ``--max-tokens`` (``given``, ``--train-args``) if any;
    else, when a trial measured that the budget buys ``expected_updates`` updates of the recipe's batch,
    :func:`batch_for_the_budget`'s; else the recipe's."""
    chosen_by_user = given_value(given, "--max-tokens")
    if chosen_by_user is not None:
        return [], [f"batch: --max-tokens {chosen_by_user} (--train-args)"]
    recipes = given_value(recipe_flags, "--max-tokens")
    if expected_updates is None or recipes is None:
        return [], []
    tokens = int(recipes)
    chosen, expected = batch_for_the_budget(tokens, expected_updates, longest)
    buys = f"the budget buys about {expected_updates:,.0f} updates of the recipe's {tokens} tokens"
    if chosen == tokens:
        return [], [f"batch: --max-tokens {tokens}, the recipe's ({buys}, at least {UPDATES_WANTED:,})"]
    shares = {tokens // 2: "half", tokens // 4: "a quarter", tokens // 8: "an eighth"}
    share = f"{shares[chosen]} of the recipe's {tokens}" if chosen in shares else "the longest training pair"
    why = f"{buys}, fewer than the {UPDATES_WANTED:,} past which a halving is level"
    note = f"batch: --max-tokens {chosen}, {share} ({why}; about {expected:,.0f} of {chosen})"
    return ["--max-tokens", str(chosen)], [note]


# Under a time budget on a CPU the dropout follows how many epochs the budget holds (the trial's updates a second
# against its epoch's length, at the recipe's batch): where it holds few, the model is still learning its training set
# when the budget ends, and half the recipe's dropout learns it sooner (examples/multi30k/README.md, "The dropout a
# time budget trains": 12 epochs on a Zen 2, half the dropout ahead in both models; 24 on a Zen 4, behind from the
# thirteenth epoch).
FEW_EPOCHS = 16


def dropout_flags(
    recipe_flags: Sequence[str], given: Sequence[str], expected_epochs: Optional[float]
) -> Tuple[List[str], List[str]]:
    """The dropout flags and a line saying why: the user's ``--dropout`` (``given``) if any; else, when a trial
    measured that the budget holds ``expected_epochs`` epochs of the recipe's batch, half the recipe's dropout below
    ``FEW_EPOCHS`` and the recipe's from there; else the recipe's."""
    chosen_by_user = given_value(given, "--dropout")
    if chosen_by_user is not None:
        return [], [f"dropout: {chosen_by_user} (--train-args)"]
    recipes = given_value(recipe_flags, "--dropout")
    if expected_epochs is None or recipes is None:
        return [], []
    holds = f"the budget holds about {expected_epochs:.1f} epochs of the recipe's batch"
    if expected_epochs >= FEW_EPOCHS:
        return [], [f"dropout: {recipes}, the recipe's ({holds}, at least {FEW_EPOCHS})"]
    half = f"{float(recipes) / 2:g}"
    return ["--dropout", half], [f"dropout: {half}, half the recipe's {recipes} ({holds}, fewer than {FEW_EPOCHS})"]


SHARE_ALL = "--share-all-embeddings"


def embedding_flags(
    arch: str, given: Sequence[str], recipe_shares: bool, separate: bool
) -> Tuple[List[str], List[str]]:
    """``--share-all-embeddings`` for a convs2s model of a recipe that shares its embeddings (every recipe's
    vocabulary is joint), unless ``separate`` (``--separate-embeddings``); the flags and a line saying why.
    Measured: examples/multi30k/README.md, "One embedding table"."""
    if not recipe_shares:
        return [], []
    if SHARE_ALL in given:
        return [], [f"embeddings: one table ({SHARE_ALL} in --train-args)"]
    if separate:
        return [], ["embeddings: separate source, target and output tables (--separate-embeddings)"]
    if not arch.startswith("convs2s"):
        return [], [f"embeddings: separate tables ({arch} has no {SHARE_ALL})"]
    note = f"embeddings: one table for both languages and the output ({SHARE_ALL}; --separate-embeddings: three)"
    return [SHARE_ALL], [note]


def given_value(flags: Sequence[str], name: str) -> Optional[str]:
    """The last value of ``name`` in a list of command-line flags (``--name value`` or ``--name=value``)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument(name, action="append")
    known, _ = parser.parse_known_args(list(flags))
    values = getattr(known, name.lstrip("-").replace("-", "_"))
    return values[-1] if values else None


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX); elsewhere torch emulates it, slower than
    fp32."""
    import torch

    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, check, lambda: False)() for check in checks)


def fastest_flags(arch: str, given: Sequence[str], precision: str, cuda: bool) -> Tuple[List[str], List[str]]:
    """The flags of the fastest correct training for ``arch`` (the one that trains, after ``--train-args``) on this
    device, given the user's own flags ``given``, and one line per choice saying why.

    ``precision`` is the recipe's ``--precision``: ``auto``, ``fp32`` or ``bf16``. Measurements behind each choice:
    examples/multi30k/README.md, "The fastest training by default".
    """
    flags: List[str] = []
    notes: List[str] = []

    criterion = given_value(given, "--criterion")
    if criterion is not None:
        notes.append(f"criterion: {criterion} (--train-args)")
    elif cuda:
        flags += ["--criterion", FAIRSEQ_LOSS]
        notes.append(f"criterion: {FAIRSEQ_LOSS} (on a GPU the fused criterion is not faster)")
    elif arch.startswith("convs2s"):
        flags += ["--criterion", FUSED]
        notes.append(f"criterion: {FUSED} (fairseq's loss and gradient, without N x V log-probabilities)")
    else:
        flags += ["--criterion", FAIRSEQ_LOSS]
        # the fused criterion would take such a model's loss from the logits it stores for every position: no
        # faster in the training command (examples/multi30k/README.md, "The fastest training by default")
        notes.append(f"criterion: {FAIRSEQ_LOSS} ({arch} projects every position: the fused criterion is no faster)")

    if any(flag in given for flag in _PRECISION_FLAGS):
        notes.append("precision: as --train-args says")
    elif precision == "fp32":
        notes.append("precision: fp32 (--precision fp32)")
    elif cuda:
        if precision == "bf16":
            flags.append("--bf16")
            notes.append("precision: bf16 (--precision bf16)")
        else:
            notes.append("precision: fp32 (on a GPU, bf16 is not faster at these model sizes)")
    elif cpu_has_bf16():
        flags.append("--bf16")
        notes.append("precision: bf16, fp32 master weights (this CPU computes bfloat16 natively)")
    elif precision == "bf16":
        flags.append("--bf16")
        notes.append("precision: bf16 (--precision bf16), emulated on this CPU: slower than fp32")
    else:
        notes.append("precision: fp32 (this CPU has neither AVX512-BF16 nor AMX; bf16 would be emulated, slower)")

    if not cuda:
        import torch

        notes.append(f"threads: {torch.get_num_threads()}, one per physical core (OMP_NUM_THREADS changes it)")
    return flags, notes
