"""The recipes' training choices, in-process: the flags for a time or update budget, the fastest path per device and
model (with its reasons), and the choice between the average and the best checkpoint."""

import argparse
import json
import shlex
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "examples"))

from recipes import final_model, pipeline, training  # noqa: E402
from recipes.final_model import Saved  # noqa: E402

FUSED, FAIRSEQ_LOSS = training.FUSED, training.FAIRSEQ_LOSS


def parse(flags):
    """fairseq-train's view of a flag list: the last value of each flag wins."""
    parser = argparse.ArgumentParser(allow_abbrev=False)
    for name in ("--lr-scheduler", "--stop-time-hours", "--max-update", "--max-epoch", "--criterion"):
        parser.add_argument(name)
    parser.add_argument("--bf16", action="store_true")
    known, _ = parser.parse_known_args([str(f) for f in flags])
    return known


def test_budgets_become_the_budget_schedule_and_fairseqs_stopping_flags():
    plateau = parse(training.optimization_flags())
    assert plateau.lr_scheduler == "reduce_lr_on_plateau" and plateau.stop_time_hours is None
    timed = parse(training.optimization_flags(time_budget=30))
    assert (timed.lr_scheduler, float(timed.stop_time_hours), timed.max_epoch) == ("budget", 0.5, "0")
    assert timed.max_update is None
    both = parse(training.optimization_flags(time_budget=12, update_budget=5000))
    assert (float(both.stop_time_hours), both.max_update) == (0.2, "5000")
    assert "--lr-shrink" not in training.optimization_flags(update_budget=10)  # budget takes no plateau flags


def test_under_a_budget_the_recipes_epoch_limit_gives_way_to_no_limit():
    """Multi30k's --max-epoch 40 (for the plateau rule) stood in the budget's command before its --max-epoch 0."""
    flags = ["--lr", "0.25", "--max-epoch", "40", "--dropout", "0.2", "--max-epoch=30"]
    budget, plateau = training.optimization_flags(time_budget=30), training.optimization_flags()
    assert training.later_wins(flags, budget) == ["--lr", "0.25", "--dropout", "0.2", *budget]
    assert training.later_wins(flags, plateau) == flags + plateau
    chosen = training.later_wins(["--max-tokens", "4000", "--lr", "1", "--max-tokens=4000"], ["--max-tokens", "1000"])
    assert chosen == ["--lr", "1", "--max-tokens", "1000"]  # (a batch chosen for the device replaces the recipe's)


def test_a_flag_in_train_args_leaves_the_command_once():
    """``--train-args`` come last and fairseq reads the last value; the recipe's own value of the flag goes."""
    recipes = ["data", "--arch", "convs2s_x", "--lr", "0.25", "--cpu", "--max-epoch=40", "--seed", Path("1")]
    given = shlex.split("--arch fconv_x --lr=0.5 --cpu --max-epoch 3 --no-save")
    assert training.later_wins(recipes, given) == ["data", "--seed", Path("1"), *given]
    assert training.later_wins(recipes, []) == recipes
    assert training.without(["--cpu", "--bf16", "--lr", "1"], {"--cpu"}) == ["--bf16", "--lr", "1"]  # a switch alone


@pytest.mark.parametrize("text", ["0", "-5", "nan", "inf"])
def test_a_budget_must_be_positive(text):
    with pytest.raises(argparse.ArgumentTypeError):
        pipeline.minutes(text)


def test_given_value_reads_the_last_flag_in_either_spelling():
    assert training.given_value(shlex.split("--arch a --lr 1 --arch=b"), "--arch") == "b"
    assert training.given_value(["--lr", "1"], "--arch") is None


@pytest.mark.parametrize(
    "arch, train_args, precision, cuda, has_bf16, criterion, bf16",
    [
        ("convs2s_iwslt_de_en", "", "auto", False, True, FUSED, True),
        ("convs2s_iwslt_de_en", "", "auto", False, False, FUSED, False),  # emulated bf16 is slower: fp32
        ("convs2s_iwslt_de_en", "", "fp32", False, True, FUSED, False),
        ("fconv_iwslt_de_en", "", "auto", False, True, FAIRSEQ_LOSS, True),
        ("convs2s_iwslt_de_en", "--criterion sequence_risk --bf16", "auto", False, True, None, False),
        ("convs2s_iwslt_de_en", "", "auto", True, True, FAIRSEQ_LOSS, False),  # a GPU: fp32, fairseq's loss
        ("convs2s_iwslt_de_en", "", "bf16", True, False, FAIRSEQ_LOSS, True),
    ],
)
def test_the_fastest_flags_and_why(monkeypatch, arch, train_args, precision, cuda, has_bf16, criterion, bf16):
    monkeypatch.setattr(training, "cpu_has_bf16", lambda: has_bf16)
    flags, notes = training.fastest_flags(arch, shlex.split(train_args), precision, cuda)
    assert training.given_value(flags, "--criterion") == criterion  # None: the user's own --criterion stands
    assert ("--bf16" in flags) == bf16
    assert notes[0].startswith("criterion: ") and notes[1].startswith("precision: ")
    assert any(n.startswith("threads: ") for n in notes) != cuda
    if not has_bf16 and not cuda and precision == "auto":
        assert "neither AVX512-BF16 nor AMX" in notes[1]
    if arch.startswith("fconv"):  # why not the fused criterion: it would not be faster
        assert notes[0].endswith(f"({arch} projects every position: the fused criterion is no faster)")


@pytest.mark.parametrize(
    "expected_updates, train_args, flags, note",
    [
        (12000, "", [], "batch: --max-tokens 4000, the recipe's (the budget buys about 12,000 updates of the"),
        (6000, "", ["--max-tokens", "2000"], "batch: --max-tokens 2000, half of the recipe's 4000 (the budget buys"),
        # 3,500 updates of 4,000 tokens: 6,300 of 2,000, then 11,340 of 1,000
        (3500, "", ["--max-tokens", "1000"], "batch: --max-tokens 1000, a quarter of the recipe's 4000"),
        # a CPU without bf16 (about 1,300 updates of 4,000 tokens in half an hour): 2,340, 4,212, then 7,582 of 500
        (1300, "", ["--max-tokens", "500"], "batch: --max-tokens 500, an eighth of the recipe's 4000"),
        (100, "", ["--max-tokens", "500"], "batch: --max-tokens 500, an eighth"),  # (never below an eighth)
        (None, "", [], None),  # no trial (a GPU, or no time budget): the recipe's batch
        (3000, "--max-tokens 3000", [], "batch: --max-tokens 3000 (--train-args)"),
    ],
)
def test_the_batch_halves_while_the_budget_buys_too_few_updates(expected_updates, train_args, flags, note):
    recipe = ["--lr", "0.25", "--max-tokens", "4000"]
    chosen, notes = training.batch_flags(recipe, shlex.split(train_args), expected_updates, longest=251)
    assert chosen == flags
    assert (notes == []) if note is None else (len(notes) == 1 and notes[0].startswith(note))
    assert training.batch_flags(["--lr", "0.25"], [], 3000, 251) == ([], [])  # a recipe without --max-tokens


def test_the_smaller_batch_still_holds_the_longest_training_pair():
    # fairseq refuses a batch that a training pair does not fit in: 1,600 tokens halved three times is 200, under
    # the 251 of a recipe keeping pairs of up to 250 pieces
    assert training.batch_for_the_budget(1600, 100, longest=251) == (
        251,
        pytest.approx(100 * training.HALF_BATCH_UPDATES**3),
    )
    chosen, (note,) = training.batch_flags(["--max-tokens", "1600"], [], 100, longest=251)
    assert chosen == ["--max-tokens", "251"] and note.startswith("batch: --max-tokens 251, the longest training pair")
    assert training.batch_flags(["--max-tokens", "300"], [], 100, longest=300)[0] == []  # nothing smaller


@pytest.mark.parametrize(
    "expected_epochs, train_args, flags, note",
    [
        (10.4, "", ["--dropout", "0.1"], "dropout: 0.1, half the recipe's 0.2 (the budget holds about 10.4 epochs"),
        (15.9, "", ["--dropout", "0.1"], "dropout: 0.1, half the recipe's 0.2"),
        (16, "", [], "dropout: 0.2, the recipe's (the budget holds about 16.0 epochs of the recipe's batch, at least"),
        (None, "", [], None),  # no trial (a GPU, or no time budget): the recipe's dropout, without a line
        (4, "--dropout=0.3", [], "dropout: 0.3 (--train-args)"),
    ],
)
def test_the_dropout_halves_where_the_budget_holds_few_epochs(expected_epochs, train_args, flags, note):
    recipe = ["--lr", "0.25", "--dropout", "0.2", "--max-tokens", "4000"]
    chosen, notes = training.dropout_flags(recipe, shlex.split(train_args), expected_epochs)
    assert chosen == flags
    assert (notes == []) if note is None else (len(notes) == 1 and notes[0].startswith(note))
    assert training.dropout_flags(["--lr", "0.25"], [], 4) == ([], [])  # a recipe without --dropout


@pytest.mark.parametrize(
    "recipe_flags, train_args, time_budget, cuda, wanted",
    [
        (["--max-tokens", "4000"], "", 30, False, True),
        (["--max-tokens", "4000"], "", 30, True, False),  # a GPU
        (["--max-tokens", "4000"], "", None, False, False),  # no time budget
        (["--max-tokens", "4000"], "", 2, False, False),  # a smoke test's: the trial would be a fifth of it
        (["--max-tokens", "4000"], "--max-tokens=2000", 30, False, False),  # the user's batch
        (["--lr", "0.25"], "", 30, False, False),  # no batch to halve
    ],
)
def test_a_trial_chooses_the_batch_under_a_time_budget_on_a_cpu(recipe_flags, train_args, time_budget, cuda, wanted):
    assert training.wants_a_trial(recipe_flags, shlex.split(train_args), time_budget, cuda) == wanted


def inner_line(update, ups):
    return (
        f"2026-12-02 08:00:00 | INFO | train_inner | epoch 001:     {update} / 133 loss=9.1, nll_loss=8.9, ppl=480, "
        f"wps=5000, ups={ups}, wpb=3400, bsz=210, num_updates={update}, lr=0.25, gnorm=1.1, clip=100\n"
    )


def test_the_trials_rate_leaves_out_its_first_interval():
    log = "| INFO | fairseq_cli.train | training on 1 devices\n" + "".join(
        inner_line(update, ups) for update, ups in ((10, 0.9), (20, 1.6), (30, 1.5), (40, 1.7))
    )
    assert training.updates_per_second(log) == 1.6  # (the median of 1.6, 1.5 and 1.7; 0.9 held the start-up)
    with pytest.raises(ValueError, match="1 interval"):
        training.updates_per_second(inner_line(10, 0.9))


def test_the_trial_reads_its_epochs_length_from_the_log():
    assert training.updates_per_epoch(inner_line(10, 0.9) + inner_line(20, 1.6)) == 133
    with pytest.raises(ValueError, match="epoch's length"):
        training.updates_per_epoch("| INFO | fairseq_cli.train | training on 1 devices\n")


@pytest.mark.parametrize(
    "arch, train_args, recipe_shares, separate, shared, note",
    [
        ("convs2s_iwslt_de_en", "", True, False, True, "one table for both languages and the output"),
        ("convs2s_iwslt_de_en", "", True, True, False, "separate source, target and output tables"),
        ("fconv_iwslt_de_en", "", True, False, False, "fconv_iwslt_de_en has no --share-all-embeddings"),
        ("convs2s_iwslt_de_en", "--share-all-embeddings", True, False, False, "(--share-all-embeddings in --train"),
        ("convs2s_iwslt_de_en", "", False, False, False, None),  # a recipe that does not share: no word about it
    ],
)
def test_embedding_flags_and_why(arch, train_args, recipe_shares, separate, shared, note):
    flags, notes = training.embedding_flags(arch, shlex.split(train_args), recipe_shares, separate)
    assert flags == (["--share-all-embeddings"] if shared else [])
    assert (notes == []) if note is None else (len(notes) == 1 and note in notes[0])


def test_the_length_note_names_the_budget_in_force():
    assert training.length_note(30, None, 5000) == (
        "length: 30 minutes, the rate annealed to 0 at the end (--lr-scheduler budget)"
    )
    assert "5000 updates (the recipe's default; --update-budget 0: the plateau rule)" in training.length_note(
        None, 5000, 5000
    )
    assert "(the recipe's default" not in training.length_note(None, 300, 5000)
    assert "12.5 minutes or 300 updates, whichever ends first" in training.length_note(12.5, 300, None)
    assert training.length_note(None, None, None).startswith("length: until validation loss plateaus")


def test_the_recipes_update_budget_and_its_switches():
    """Multi30k without a budget trains 5,000 updates; --update-budget 0 asks for the plateau rule; a lone flag
    after --train-args is its value, not an option of the recipe's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("multi30k_run", REPO_ROOT / "examples" / "multi30k" / "run.py")
    multi30k = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(multi30k)
    assert (multi30k.RECIPE.update_budget, multi30k.RECIPE.share_embeddings) == (5000, True)
    parser = pipeline.build_parser(multi30k.RECIPE, "doc")
    args = parser.parse_args(pipeline._flag_values_attached(["--train-args", "--share-all-embeddings", "--out", "o"]))
    assert (args.train_args, args.update_budget, args.separate_embeddings) == ("--share-all-embeddings", None, False)
    assert parser.parse_args(["--update-budget", "0", "--separate-embeddings"]).update_budget == 0
    assert pipeline._flag_values_attached(["--generate-args", "--lenpen 1.2", "--train-args"]) == [
        "--generate-args=--lenpen 1.2",
        "--train-args",  # nothing after it: argparse's own usage error
    ]
    with pytest.raises(argparse.ArgumentTypeError, match="must be 0 .no budget. or more, got -1"):
        pipeline.updates("-1")


def test_cpu_has_bf16_asks_torch():
    expected = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert training.cpu_has_bf16() == expected


def fake_checkpoint(path: Path, num_updates: int, value: float) -> None:
    state = {"model": {"w": torch.full((2,), value)}, "optimizer_history": [{"num_updates": num_updates}]}
    torch.save(state, path)


def test_averaging_takes_checkpoints_from_the_end_of_training_only(tmp_path):
    for epoch in range(1, 9):
        fake_checkpoint(tmp_path / f"checkpoint{epoch}.pt", 100 * epoch, epoch)
    fake_checkpoint(tmp_path / "checkpoint_best.pt", 800, 8)
    # a run stopped by its time budget mid-epoch 9: checkpoint_last.pt is newer than every epoch checkpoint
    fake_checkpoint(tmp_path / "checkpoint_last.pt", 850, 9)
    found = final_model.averaging_candidates(tmp_path, last=5, tail=0.25)
    assert [(s.path.name, s.num_updates) for s in found] == [
        ("checkpoint7.pt", 700),
        ("checkpoint8.pt", 800),
        ("checkpoint_last.pt", 850),
    ]  # 637.5 updates and later; epochs 1-6 are from before
    assert [s.path.name for s in final_model.averaging_candidates(tmp_path, last=2, tail=1.0)] == [
        "checkpoint8.pt",
        "checkpoint_last.pt",
    ]
    # an end-of-epoch stop: checkpoint_last.pt is a copy of the last epoch's, not another candidate
    fake_checkpoint(tmp_path / "checkpoint_last.pt", 800, 8)
    assert [s.path.name for s in final_model.averaging_candidates(tmp_path, last=5, tail=0.25)] == [
        "checkpoint6.pt",
        "checkpoint7.pt",
        "checkpoint8.pt",
    ]  # 600 updates and later
    assert final_model.averaging_candidates(tmp_path / "missing", last=5, tail=0.25) == []


def test_the_lower_validation_loss_wins_and_the_reason_says_so(tmp_path):
    averaged, best = tmp_path / "checkpoint_avg.pt", tmp_path / "checkpoint_best.pt"
    inputs = [Saved(tmp_path / "checkpoint7.pt", 700), Saved(tmp_path / "checkpoint8.pt", 800)]
    best.touch()
    losses = {averaged: 3.5, best: 3.6}
    choice = final_model.choose(averaged, best, losses.__getitem__, inputs)
    assert choice.path == averaged
    assert choice.reason == (
        "checkpoint_avg.pt (validation loss 3.5000 for the average of checkpoint7.pt, checkpoint8.pt; "
        "3.6000 for checkpoint_best.pt)"
    )
    losses[averaged] = 3.7  # an average that would hurt is not taken
    assert final_model.choose(averaged, best, losses.__getitem__, inputs).path == best

    def never(path):
        raise AssertionError("nothing to validate with one candidate")

    alone = final_model.choose(None, best, never, inputs[:1])
    assert alone.path == best and "nothing to average" in alone.reason

    # training without validation (--disable-validation) saves no best: fairseq-validate failed on the missing file
    best.unlink()
    unvalidated = final_model.choose(averaged, best, never, inputs)
    assert unvalidated.path == averaged and "no checkpoint_best.pt" in unvalidated.reason
    assert final_model.choose(None, best, never, inputs[:1]).path == inputs[0].path


def test_validation_loss_is_read_from_fairseq_validates_output():
    output = "2026-11-26 | INFO | valid | valid on 'valid' subset | loss 4.35 | nll_loss 2.88 | ppl 7.36 | wps 1\n"
    assert final_model.validation_loss(output) == 4.35
    with pytest.raises(ValueError, match="no validation loss"):
        final_model.validation_loss("Traceback ...")


def multi30k_half_hour(tmp_path, train_args, monkeypatch, has_bf16, trial_ups):
    """Multi30k's ``--time-budget 30`` training stage on a CPU with its commands stubbed: the commands it ran, the
    trial's log (updates/s ``trial_ups``) written as fairseq would."""
    import importlib.util

    from recipes import model_stages

    spec = importlib.util.spec_from_file_location("multi30k_run", REPO_ROOT / "examples" / "multi30k" / "run.py")
    multi30k = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(multi30k)
    args = pipeline.build_parser(multi30k.RECIPE, "doc").parse_args(
        ["--out", str(tmp_path), "--time-budget", "30", f"--train-args={train_args}"]
    )
    monkeypatch.setattr(training, "cpu_has_bf16", lambda: has_bf16)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    commands = []

    def run(cmd, log=None, **kwargs):
        commands.append([str(c) for c in cmd])
        if "--disable-validation" in commands[-1]:
            log.write_text("".join(inner_line(update, trial_ups) for update in (10, 20, 30)))

    monkeypatch.setattr(model_stages, "run", run)
    model_stages.train_stage(pipeline.RecipeCommand(multi30k.RECIPE, args, "en", "de"))
    return commands


def each_flag_once(command):
    names = [flag.split("=", 1)[0] for flag in command if flag.startswith("--")]
    return sorted(names) == sorted(set(names))


@pytest.mark.parametrize(
    "has_bf16, trial_ups, train_args, max_tokens, dropout",
    [
        (True, 6.5, "", "4000", "0.2"),  # a bf16 CPU faster than any measured: about 10,500 updates of 4,000 tokens
        (True, 4.0, "", "2000", "0.2"),  # about 6,500
        (True, 3.23, "", "1000", "0.2"),  # the Zen 5's trial of 2026-12-02: about 5,200, 39 epochs of 133 updates
        (False, 0.82, "", "500", "0.1"),  # fp32: about 1,330, 10 epochs
        (False, 0.82, "--dropout 0.3", "500", "0.3"),  # the user's dropout
        (False, None, "--arch fconv_iwslt_de_en --max-tokens=2000 --lr 0.5", "2000", "0.2"),  # the user's: no trial
    ],
)
def test_multi30ks_half_hour_command_on_a_cpu_trains_the_batch_its_trial_chooses(
    has_bf16, trial_ups, train_args, max_tokens, dropout, monkeypatch, tmp_path
):
    """The commands Multi30k's ``--time-budget 30`` runs on a CPU: a trial of the recipe's batch, then training with
    the batch and the dropout it chose and the rest of the budget; the user's batch or dropout when ``--train-args``
    sets it; each flag once."""
    commands = multi30k_half_hour(tmp_path, train_args, monkeypatch, has_bf16, trial_ups)
    *trials, command = commands
    assert training.given_value(command, "--max-tokens") == max_tokens and each_flag_once(command)
    assert training.given_value(command, "--dropout") == dropout
    assert ("--bf16" in command) == has_bf16
    training_hours = float(training.given_value(command, "--stop-time-hours"))
    if trial_ups is None:
        assert trials == [] and training_hours == 0.5
        return
    (trial,) = trials
    assert each_flag_once(trial) and ("--bf16" in trial) == has_bf16 and "--no-save" in trial
    assert training.given_value(trial, "--max-tokens") == "4000" and training.given_value(trial, "--max-update") == "30"
    assert training.given_value(trial, "--stop-time-hours") == "0"
    assert training.given_value(trial, "--save-dir") == str(tmp_path / "checkpoints" / "trial")
    saved = json.loads((tmp_path / "checkpoints" / "trial.json").read_text())
    assert saved["updates_per_second"] == trial_ups and saved["updates_per_epoch"] == 133
    assert training_hours == pytest.approx(0.5 - saved["minutes"] / 60, abs=1e-6)  # (--stop-time-hours: 6 digits)


@pytest.mark.parametrize(
    "saved, max_tokens, dropout",
    [
        ({"updates_per_second": 4.0, "minutes": 0.6, "updates_per_epoch": 133}, "2000", "0.2"),
        ({"updates_per_second": 0.82, "minutes": 0.6, "updates_per_epoch": 133}, "500", "0.1"),
        ({"updates_per_second": 0.82, "minutes": 0.6}, "500", "0.2"),  # saved before the dropout rule: as it began
    ],
)
def test_a_resumed_half_hour_keeps_the_batch_dropout_and_length_its_trial_chose(
    saved, max_tokens, dropout, monkeypatch, tmp_path
):
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    (ckpt / "checkpoint_last.pt").touch()
    (ckpt / "trial.json").write_text(json.dumps(saved))
    (command,) = multi30k_half_hour(tmp_path, "", monkeypatch, has_bf16=True, trial_ups=6.5)  # (no trial ran)
    assert training.given_value(command, "--max-tokens") == max_tokens
    assert training.given_value(command, "--dropout") == dropout
    assert float(training.given_value(command, "--stop-time-hours")) == pytest.approx(29.4 / 60)
