"""``--task bidirectional_translation``: each pair in both directions for the epochs that start in the first part of
the budget (switching at the epoch boundary nearest its point), source -> target after; what it refuses; and
through fairseq-train, with a model that then generates under fairseq's own translation task."""

import numpy as np
import pytest
import torch
from cli_helpers import EVAL_FLAGS, PLUGIN_DIR, hypothesis_lines, make_splits, preprocess, run_cli, train, train_args
from fairseq.data import LanguagePairDataset
from utils import make_dictionary

from fairseq_convs2s.bidirectional import BidirectionalTranslationConfig, BidirectionalTranslationTask, both_directions
from fairseq_convs2s.errors import InputError


class FakeClock:
    """Seconds that move only when the test says so."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def task(fraction=0.5, seconds=0.0, updates=0, src_dict=None, tgt_dict=None) -> BidirectionalTranslationTask:
    cfg = BidirectionalTranslationConfig(
        source_lang="src", target_lang="tgt", train_subset="train", required_seq_len_multiple=1,
        bidirectional_fraction=fraction, stop_time_hours=seconds / 3600, max_update=updates,
    )  # fmt: skip
    dictionary = make_dictionary()
    return BidirectionalTranslationTask(cfg, src_dict or dictionary, tgt_dict or dictionary)


def test_both_directions_holds_every_pair_then_every_pair_reversed():
    d = make_dictionary()
    src = [torch.tensor([4, 5, 6, 2]), torch.tensor([7, 2])]
    tgt = [torch.tensor([8, 9, 2]), torch.tensor([10, 11, 12, 13, 2])]
    pairs = LanguagePairDataset(src, np.array([4, 2]), d, tgt, np.array([3, 5]), d, shuffle=False)
    both = both_directions(pairs)
    assert len(both) == 4
    assert both.src_sizes.tolist() == [4, 2, 3, 5] and both.tgt_sizes.tolist() == [3, 5, 4, 2]
    for i in range(2):
        assert torch.equal(both[i]["source"], src[i]) and torch.equal(both[i]["target"], tgt[i])
        assert torch.equal(both[2 + i]["source"], tgt[i]) and torch.equal(both[2 + i]["target"], src[i])
    batch = both.collater([both[k] for k in range(4)])  # padded as fairseq pads a translation batch
    assert batch["net_input"]["src_tokens"].shape == (4, 5)
    assert batch["net_input"]["prev_output_tokens"][:, 0].tolist() == [d.eos()] * 4


def test_epochs_that_start_in_the_first_part_of_a_time_budget_train_both_directions():
    t = task(fraction=0.5, seconds=100)
    clock = FakeClock()
    t.clock, t._started = clock, clock()
    decided = []
    for epoch, elapsed in enumerate([0, 15, 30, 45, 60, 75], start=1):
        clock.now = 1000.0 + elapsed
        decided.append(t.trains_both_directions(epoch))
    # epochs of 15 s: the one starting at 45 s would end at 60 s, so the boundary nearest 50 s is at 45 s
    assert decided == [True, True, True, False, False, False]


def test_the_switch_comes_at_the_boundary_nearest_the_point_and_stays():
    t = task(fraction=0.5, updates=100)
    updates = iter([0, 40, 80, 90])
    t.follow_training_clock(lambda: 0.0, lambda: next(updates))
    # the epoch from 40 would end near 80: the boundary nearest 50 is the one at 40, so the switch comes there
    assert [t.trains_both_directions(e) for e in (1, 2)] == [True, False]
    assert t.trains_both_directions(3) is False and t.trains_both_directions(4) is False


def test_a_fraction_of_zero_or_one():
    none, every = task(fraction=0.0, updates=10), task(fraction=1.0, updates=10)
    none.follow_training_clock(lambda: 0.0, lambda: 0)
    every.follow_training_clock(lambda: 0.0, lambda: 4)
    assert none.trains_both_directions(1) is False
    assert every.trains_both_directions(1) is True


def test_what_it_refuses():
    with pytest.raises(InputError, match="--stop-time-hours or --max-update"):
        task()
    with pytest.raises(InputError, match=r"--bidirectional-fraction must be in \[0, 1\]"):
        task(fraction=1.5, updates=10)
    other = make_dictionary(num_symbols=21)
    with pytest.raises(InputError, match="--joined-dictionary makes one"):
        task(updates=10, tgt_dict=other)


def test_fairseq_train_switches_to_one_direction_and_the_model_generates(tmp_path):
    """Through fairseq-train under an update budget (updates alone decide, so the epochs are known): the first
    epoch holds the 120 pairs both ways and takes more than a third of the budget, so the boundary after it is the
    one nearest the switch point; the second epoch and every later one hold the 120 alone. The model then
    translates the test set under fairseq's --task translation."""
    make_splits(tmp_path, {"train": 120, "valid": 8, "test": 16})
    preprocess(tmp_path, "bin", "--joined-dictionary", trainpref="train", validpref="valid", testpref="test")
    both = "--task", "bidirectional_translation", "--lr-scheduler", "budget", "--max-epoch", "0"
    proc = train(tmp_path, "bin", "ckpt", *both, "--max-tokens", "100", "--max-update", "40")
    log = proc.stdout + proc.stderr
    assert "epoch 1: both directions, 240 pairs (src -> tgt and reversed)" in log, log[-3000:]
    assert "epoch 2 on: src -> tgt alone, 120 pairs" in log, log[-3000:]
    assert "both directions" not in log.partition("epoch 2 on")[2], log[-3000:]
    assert "num_updates: 40 >= max_update: 40" in log, log[-3000:]
    args = ["bin", "--user-dir", PLUGIN_DIR, "--path", "ckpt/checkpoint_last.pt", "--cpu", "--beam", "2", *EVAL_FLAGS]
    generated = run_cli("generate", args, cwd=tmp_path)
    assert generated.returncode == 0, generated.stderr[-3000:]
    assert len(hypothesis_lines(generated.stdout)["H"]) == 16, generated.stdout[-3000:]


def test_fairseq_train_refuses_two_dictionaries_in_one_line(tmp_path):
    make_splits(tmp_path, {"train": 16, "valid": 4})
    preprocess(tmp_path, "bin", trainpref="train", validpref="valid")  # a dictionary for each side
    args = train_args("bin", "ckpt", "--task", "bidirectional_translation", "--max-update", "2")
    proc = run_cli("train", args, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "--joined-dictionary makes one" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
