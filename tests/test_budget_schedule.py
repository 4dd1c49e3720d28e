"""``--lr-scheduler budget``: the rate held, then annealed linearly to 0 at the end of fairseq's own stopping point
(``--stop-time-hours``, ``--max-update``), across a resume; a warning when ``--max-epoch`` can end training first;
and through fairseq-train."""

import logging

import pytest
import torch
from cli_helpers import make_splits, preprocess, train, update_records
from fairseq.optim.nag import FairseqNAG
from omegaconf import OmegaConf

from fairseq_convs2s.budget_schedule import BudgetSchedule, budget_lr

LR = 0.25
MAX_EPOCH_WARNING = "budget schedule: --max-epoch {} can end training before the budget, unannealed"


class FakeClock:
    """Seconds that move only when the test says so."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def schedule(anneal=0.5, seconds=0.0, updates=0, clock=None, epochs=0) -> BudgetSchedule:
    cfg = OmegaConf.create(
        {
            "anneal_fraction": anneal,
            "stop_time_hours": seconds / 3600,
            "max_update": updates,
            "max_epoch": epochs,
            "lr": [LR],
        }
    )
    optimizer = FairseqNAG(
        OmegaConf.create({"lr": [LR], "momentum": 0.99, "weight_decay": 0.0}), [torch.nn.Parameter(torch.zeros(2))]
    )
    scheduler = BudgetSchedule(cfg, optimizer)
    if clock is not None:
        scheduler.clock = clock
        scheduler.load_state_dict({"best": None, "elapsed_seconds": 0.0})  # starts the budget's clock now
    return scheduler


def test_budget_lr_holds_then_falls_linearly_to_zero():
    assert [budget_lr(LR, p, 0.5) for p in (0.0, 0.25, 0.5, 0.75, 0.9, 1.0, 1.3)] == pytest.approx(
        [LR, LR, LR, LR / 2, LR / 5, 0.0, 0.0]
    )
    assert [budget_lr(LR, p, 1.0) for p in (0.0, 0.5, 1.0)] == pytest.approx([LR, LR / 2, 0.0])


def test_a_time_budget_anneals_on_the_clock():
    clock = FakeClock()
    scheduler = schedule(seconds=600, clock=clock)
    seen = []
    for elapsed, update in ((0, 1), (299, 50), (450, 80), (570, 95), (600, 100), (640, 101)):
        clock.now = 1000.0 + elapsed
        seen.append(scheduler.step_update(update))
        assert scheduler.optimizer.get_lr() == seen[-1]  # the optimizer steps with the rate returned
    assert seen == pytest.approx([LR, LR, LR / 2, LR / 10, 0.0, 0.0])


def test_an_update_budget_and_whichever_budget_ends_first():
    by_updates = schedule(anneal=1.0, updates=200)
    assert [by_updates.step_update(n) for n in (0, 50, 150, 200)] == pytest.approx([LR, 0.75 * LR, 0.25 * LR, 0])

    clock = FakeClock()
    both = schedule(seconds=100, updates=1000, clock=clock)
    clock.now += 80  # 80% of the time, 10% of the updates: the time decides
    assert both.step_update(100) == pytest.approx(LR * 0.2 / 0.5)
    assert both.step_update(900) == pytest.approx(LR * 0.1 / 0.5)  # now the updates are further along
    assert both.step(epoch=3, val_loss=4.0) == both.optimizer.get_lr() and both.best == 4.0
    assert both.step_begin_epoch(4) == pytest.approx(LR * 0.1 / 0.5)


def test_a_resumed_run_goes_on_from_the_time_it_had_trained():
    clock = FakeClock()
    first = schedule(seconds=1000, clock=clock)
    clock.now += 700
    first.step_update(70)
    state = first.state_dict()
    assert state["elapsed_seconds"] == pytest.approx(700)

    clock.now += 5000  # the time between the kill and the resume does not count
    resumed = schedule(seconds=1000)
    resumed.clock = clock
    resumed.load_state_dict(state)
    clock.now += 50
    assert resumed.step_update(71) == pytest.approx(LR * 0.25 / 0.5)  # 750 of 1000 s


def test_a_run_of_another_schedule_goes_on_under_a_budget():
    """A checkpoint of fairseq's default schedule ("fixed", whose state keeps no best loss) failed to load into the
    budget's with a bare KeyError: 'best'; one that keeps a best loss passes it on."""
    clock = FakeClock()
    for state, best in (({"lr": 0.1}, None), ({"best": 3.5}, 3.5)):
        scheduler = schedule(seconds=100, clock=clock)
        scheduler.load_state_dict(state)
        assert scheduler.best == best and scheduler.step_update(1) == LR  # (the budget's clock starts at 0)


def test_what_it_refuses():
    with pytest.raises(ValueError, match="--stop-time-hours or --max-update"):
        schedule()
    with pytest.raises(ValueError, match="--anneal-fraction must be in"):
        schedule(anneal=0.0, updates=10)


def test_an_epoch_limit_that_can_end_training_unannealed_is_warned_of(caplog):
    """fairseq stops at --max-epoch too, which the rate does not know: a run ended there never annealed, and before
    nothing said so. Now a warning at the start, and none when --max-epoch is 0 (no epoch limit)."""
    with caplog.at_level(logging.WARNING, logger="fairseq_convs2s.budget_schedule"):
        schedule(updates=1000, epochs=2)
    assert MAX_EPOCH_WARNING.format(2) in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fairseq_convs2s.budget_schedule"):
        schedule(updates=1000, epochs=0)
    assert "--max-epoch" not in caplog.text


def test_fairseq_train_warns_when_max_epoch_ends_training_before_the_budget(tmp_path):
    """Through fairseq-train: --max-epoch 1 with a budget of 1000 updates stops after the first epoch at the full
    rate. Before, the log said only "lr 0.25 for the first 50% of 1000 updates"; now it warns at the start."""
    make_splits(tmp_path, {"train": 120, "valid": 8})
    preprocess(tmp_path, "bin", trainpref="train", validpref="valid")
    proc = train(
        tmp_path, "bin", "ckpt", "--lr-scheduler", "budget", "--max-update", "1000", "--max-epoch", "1",
        "--log-format", "json", "--log-interval", "1", "--max-tokens", "500",
    )  # fmt: skip
    log = proc.stdout + proc.stderr
    assert MAX_EPOCH_WARNING.format(1) in log, log[-3000:]
    assert log.index(MAX_EPOCH_WARNING.format(1)) < log.index("| train_inner |")  # at the start
    assert update_records(log)[-1]["lr"] == pytest.approx(LR)  # what it warns of: stopped unannealed


def train_on_a_budget(folder, *limits: str):
    """fairseq-train (with --user-dir) of the small model in ``folder``/bin on the budget ``limits``, with no epoch
    limit, logging each update: the log and its per-update records."""
    proc = train(
        folder, "bin", "ckpt", "--lr-scheduler", "budget", *limits, "--lr", str(LR), "--max-epoch", "0",
        "--log-format", "json", "--log-interval", "1", "--max-tokens", "100",
    )  # fmt: skip
    log = proc.stdout + proc.stderr
    return log, update_records(log)


def test_fairseq_train_anneals_to_zero_at_max_update(tmp_path):
    """Through fairseq-train with --user-dir: the rate logged after each update, 0 after the last, where fairseq
    stops."""
    make_splits(tmp_path, {"train": 120, "valid": 8})
    preprocess(tmp_path, "bin", trainpref="train", validpref="valid")
    log, records = train_on_a_budget(tmp_path, "--max-update", "6")
    assert [int(r["num_updates"]) for r in records] == [1, 2, 3, 4, 5, 6], log[-3000:]
    # the rate logged at update k is the one set after it: 0.25 until half the budget, then (1 - k/6) / 0.5 of it
    expected = [budget_lr(LR, k / 6, 0.5) for k in range(1, 7)]
    assert [r["lr"] for r in records] == pytest.approx(expected, abs=1e-3)
    assert "Stopping training due to num_updates: 6 >= max_update: 6" in log
    assert "can end training before the budget" not in log  # --max-epoch 0: no warning


def test_a_run_switched_to_the_budget_anneals_by_the_time_fairseq_stops_at(tmp_path):
    """fairseq's --stop-time-hours counts the whole run (the checkpoint's previous_training_time, whatever schedule
    wrote it); the budget's rate counted only its own seconds, so a run trained under the default schedule and then
    continued under a budget was stopped at the full rate. Here the checkpoint says 6 s of the hour are left: every
    update of the continued run is at the rate's last thousandth (before: 0.25 until fairseq stopped it)."""
    make_splits(tmp_path, {"train": 120, "valid": 8})
    preprocess(tmp_path, "bin", trainpref="train", validpref="valid")
    train(tmp_path, "bin", "ckpt", "--max-update", "2", "--max-tokens", "100")  # fairseq's default: fixed
    path = tmp_path / "ckpt" / "checkpoint_last.pt"
    state = torch.load(path, map_location="cpu", weights_only=False)
    state["extra_state"]["previous_training_time"] = 3600.0 - 6.0
    torch.save(state, path)

    log, records = train_on_a_budget(tmp_path, "--stop-time-hours", "1")
    assert records and records[0]["num_updates"] == 3, log[-3000:]
    assert max(r["lr"] for r in records) < LR / 100, log[-3000:]
    assert "Stopping training due to cumulative_training_time" in log
