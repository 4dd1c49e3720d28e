"""Multi-process training through fairseq's own trainer: two CPU processes over gloo equal one process with
``--update-freq 2``.

fairseq gives rank r of N the batches r, r + N, r + 2N, ... of each epoch, and groups ``--update-freq`` consecutive
batches into one update; so with N = 2 against update-freq 2, update i sees batches 2i and 2i + 1 either way, and
the summed gradients, the optimizer and the parameters should agree up to float rounding (the gloo all-reduce adds
in another order than the single process's gradient accumulation).
"""

import pytest
from cli_helpers import (
    check_ok,
    checkpoint_updates,
    load_checkpoint,
    make_splits,
    max_param_difference,
    preprocess,
    run_launcher,
    update_records,
)

UPDATES = 10  # 300 sentences at --max-tokens 200 make 14 batches an epoch: 7 updates, so the run crosses an epoch
# measured with these flags: the two runs' parameters differ by at most 6.0e-8 after 10 updates (3.0e-8 after 4;
# 2.4e-7 with another corpus of 400 sentences); checkpoint_1_4.pt is 0.23 away from checkpoint_last.pt, so the
# tolerance below separates "same" from "different" by four orders of magnitude either way
TOLERANCE = 1e-5
LOGGED_UNIT = 1.001e-3  # one unit of the 3rd decimal fairseq logs the loss with (and float slack)
FLAGS = ["--max-tokens", "200", "--max-update", str(UPDATES), "--save-interval-updates", "4"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same training twice: 2 processes (the launcher's gloo spawn) and 1 process with --update-freq 2."""
    folder = tmp_path_factory.mktemp("distributed")
    make_splits(folder, {"train": 300})
    preprocess(folder, "bin", trainpref="train")
    two = check_ok(run_launcher(folder, "bin", "two", *FLAGS, "--distributed-world-size", "2"))
    one = check_ok(run_launcher(folder, "bin", "one", *FLAGS, "--update-freq", "2"))
    return folder, two.stdout + two.stderr, one.stdout + one.stderr


def test_two_processes_train_over_gloo(runs):
    """The launcher started two ranks over gloo with legacy_ddp on a local TCP port (what fairseq needs on CPUs),
    and both took part: fairseq logs the init of rank 0 and of rank 1."""
    _, two, _ = runs
    assert "distributed init (rank 0): tcp://127.0.0.1:" in two and "distributed init (rank 1): tcp://127.0.0.1:" in two
    assert "'distributed_backend': 'gloo'" in two and "'ddp_backend': 'legacy_ddp'" in two


def test_the_sentences_fairseq_leaves_out_are_named_once_not_by_every_rank(runs):
    """The plugin's warning that fairseq's batches leave sentences out of training: as often in the two ranks' run
    as in the one process's (it was printed by each rank)."""
    _, two, one = runs
    warning = "fairseq left the last 4 of 300 sentences out of the batches"
    assert two.count(warning) == one.count(warning) >= 1, (two.count(warning), one.count(warning))


def test_batches_are_made_in_each_trainer_on_a_cpu(runs):
    """No data-loading worker forks a CPU trainer (``--num-workers 0`` unless given), in either kind of run."""
    _, two, one = runs
    assert "'num_workers': 0" in two and "'num_workers': 0" in one


def test_two_processes_equal_update_freq_two(runs):
    """Same loss at every update (as logged: to 3 decimals, at most one unit of the last apart) and same
    parameters after UPDATES updates, within TOLERANCE; the intermediate checkpoint of the other run is far outside
    it (the comparison can fail)."""
    folder, two, one = runs
    two_records, one_records = update_records(two), update_records(one)
    assert [r["num_updates"] for r in two_records] == list(range(1, UPDATES + 1)), two[-3000:]
    assert [r["num_updates"] for r in one_records] == list(range(1, UPDATES + 1)), one[-3000:]
    for a, b in zip(two_records, one_records):
        # fairseq logs the loss to 3 decimals: two losses 1e-7 apart (another order of adding) can round to values
        # one unit apart, so equal means within that unit
        assert a["loss"] == pytest.approx(b["loss"], abs=LOGGED_UNIT), (a, b)
        assert a["bsz"] == b["bsz"] and a["wpb"] == b["wpb"], (a, b)

    two_last, one_last = (
        load_checkpoint(folder / "two/checkpoint_last.pt"),
        load_checkpoint(folder / "one/checkpoint_last.pt"),
    )
    assert checkpoint_updates(two_last) == checkpoint_updates(one_last) == UPDATES
    difference = max_param_difference(two_last, one_last)
    print(f"[figure] 2 gloo ranks vs --update-freq 2, {UPDATES} updates: max |param difference| {difference:.1e}")
    assert difference < TOLERANCE

    two_mid, one_mid = (
        load_checkpoint(folder / "two/checkpoint_1_4.pt"),
        load_checkpoint(folder / "one/checkpoint_1_4.pt"),
    )
    assert max_param_difference(two_mid, one_mid) < TOLERANCE
    assert max_param_difference(two_last, one_mid) > 100 * TOLERANCE
