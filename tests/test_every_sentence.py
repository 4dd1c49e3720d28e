"""Every sentence answered under fairseq's default flags (issue 34), through the real command-line tools.

fairseq 0.12 leaves a split's last batch out when its size is not a multiple of --required-batch-size-multiple (8 by
default): a 61-sentence set at --batch-size 16 (batches of 16, 16, 16, 8 and 5) lost 5 sentences in fairseq-generate,
fairseq-validate and the validation of fairseq-train (its loss and --eval-bleu). With the plugin, those paths keep
every sentence, and the training batches (and so the random stream and the weights) stay exactly fairseq's.
``FAIRSEQ_CONVS2S_COMPAT_OFF=dropped_sentences`` runs the same command without the fix, to show what fairseq does
alone. fairseq-interactive answers every line too, also one that --skip-invalid-size-inputs-valid-test skips for
its length.
"""

import json
import math
import random
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from cli_helpers import (
    PLUGIN_DIR,
    check_ok,
    hypothesis_lines,
    max_param_difference,
    preprocess,
    random_sentence,
    run_cli,
    tail,
    train_args,
    write_corpus,
)

COUNT = 61  # valid and test sentences
TRAIN = 203  # training sentences
UNKNOWN = 30  # the test sentence of unknown words only
POSITIONS = 16
STOCK = {"FAIRSEQ_CONVS2S_COMPAT_OFF": "dropped_sentences"}
BATCHES = ["--batch-size", "16", "--max-tokens", "100000"]  # batches of 16 sentences, whatever their length
EVAL_BLEU = ["--eval-bleu", "--eval-bleu-args", '{"beam": 2, "max_len_b": 12}']


def fairseq_batches(count: int):
    """The sizes of the batches fairseq 0.12 makes of ``count`` sentences at --batch-size 16 and its default
    --required-batch-size-multiple 8, the last one that is not a multiple of 8 left out: for 61, 16, 16, 16 and 8
    (5 left out); for 203, 12 of 16 and one of 8 (3 left out)."""
    from fairseq.data import data_utils

    batch_by_size = getattr(data_utils.batch_by_size, "__wrapped__", data_utils.batch_by_size)  # fairseq's own
    return [len(b) for b in batch_by_size(np.arange(count), None, np.ones(count, dtype=np.int64), 100000, 16, 8)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A corpus of TRAIN training pairs and COUNT valid and test pairs (test sentence UNKNOWN of words the
    dictionary lacks), and one epoch of fairseq-train with --eval-bleu validation, with the plugin's fix (``ours``)
    and without it (``stock``); a model of POSITIONS positions."""
    folder = tmp_path_factory.mktemp("every_sentence")
    rng = random.Random(1)
    write_corpus(folder, "train", [random_sentence(rng) for _ in range(TRAIN)])
    write_corpus(folder, "valid", [random_sentence(rng) for _ in range(COUNT)])
    test = [random_sentence(rng) for _ in range(COUNT)]
    test[UNKNOWN] = ["zz", "yy", "xx", "ww"]
    write_corpus(folder, "test", test)
    preprocess(folder, "bin", trainpref="train", validpref="valid", testpref="test")
    flags = [*BATCHES, "--max-epoch", "1", "--log-format", "json", "--log-interval", "1", *EVAL_BLEU]
    flags += ["--max-source-positions", str(POSITIONS), "--max-target-positions", str(POSITIONS)]
    logs, saved = {}, {}
    for name, env in [("ours", None), ("stock", STOCK)]:
        proc = check_ok(run_cli("train", train_args("bin", name, *flags), cwd=folder, timeout=600, env=env))
        logs[name] = proc.stdout + proc.stderr
        saved[name] = torch.load(folder / name / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    # (an --eval-bleu run's checkpoint holds its BLEU meters as numpy arrays: the plugin lets torch load them)
    return SimpleNamespace(folder=folder, logs=logs, saved=saved, test=test, checkpoint="ours/checkpoint_last.pt")


def tail_of(runs, name: str) -> str:
    return runs.logs[name][-3000:]


def _records(log: str, kind: str):
    """The JSON records fairseq-train logs for ``train_inner`` (one per update) or ``valid``."""
    return [json.loads(m.group(1)) for m in re.finditer(rf"\| {kind} \| (\{{.*\}})\s*$", log, re.MULTILINE)]


def test_training_batches_stay_fairseqs(runs):
    """With the fix, fairseq-train makes the same 13 updates on the same batches as without it (the 3 sentences
    fairseq leaves out of training stay out, with a warning): the same losses, update by update, and the same
    weights, bit for bit."""
    batches = fairseq_batches(TRAIN)
    ours, stock = (_records(runs.logs[name], "train_inner") for name in ("ours", "stock"))
    assert [r["num_updates"] for r in ours] == [str(n) for n in range(1, len(batches) + 1)], tail_of(runs, "ours")
    drop = {"wps", "ups", "wall", "train_wall", "gb_free"}  # timings
    assert [{k: v for k, v in r.items() if k not in drop} for r in ours] == [
        {k: v for k, v in r.items() if k not in drop} for r in stock
    ]
    warning = f"fairseq left the last {TRAIN - sum(batches)} of {TRAIN} sentences out of the batches"
    assert warning in runs.logs["ours"], tail_of(runs, "ours")
    assert max_param_difference(runs.saved["ours"], runs.saved["stock"]) == 0.0


def test_validation_during_training_scores_every_sentence(runs):
    """The validation after the epoch (loss and --eval-bleu) runs over all 61 valid sentences in 5 batches (16, 16,
    16, 8 and 5: 12.2 sentences a batch); without the fix over 56 in 4 (14 a batch)."""
    batches = fairseq_batches(COUNT)
    (ours,), (stock,) = (_records(runs.logs[name], "valid") for name in ("ours", "stock"))
    assert float(ours["valid_bsz"]) == round(COUNT / (len(batches) + 1), 1), ours
    assert float(stock["valid_bsz"]) == round(sum(batches) / len(batches), 1), stock
    assert "valid_bleu" in ours and "valid_bleu" in stock  # --eval-bleu ran on those batches


def _generate(runs, *extra, env=None):
    args = ["bin", "--user-dir", PLUGIN_DIR, "--path", runs.checkpoint, "--cpu", "--beam", "5", "--batch-size", "16"]
    return check_ok(run_cli("generate", [*args, *extra], cwd=runs.folder, env=env))


def test_generate_translates_every_sentence_under_default_flags(runs):
    """fairseq-generate --batch-size 16 on the 61 test sentences, no --required-batch-size-multiple: an H- line for
    each, the sentence of unknown words included, and BLEU over all 61; fairseq alone: 56, without a word."""
    proc = _generate(runs)
    lines = hypothesis_lines(proc.stdout)
    assert sorted(lines["H"]) == sorted(lines["S"]) == list(range(COUNT)), tail(proc)
    assert lines["S"][UNKNOWN] == "<unk> <unk> <unk> <unk>"
    assert f"Translated {COUNT} sentences" in proc.stdout + proc.stderr, tail(proc)
    assert "left the last" not in proc.stdout + proc.stderr

    stock = _generate(runs, env=STOCK)
    kept = sum(fairseq_batches(COUNT))
    assert len(hypothesis_lines(stock.stdout)["H"]) == kept == 56, tail(stock)
    assert f"Translated {kept} sentences" in stock.stdout + stock.stderr, tail(stock)


def test_validate_scores_every_sentence_under_default_flags(runs):
    """fairseq-validate --batch-size 16 of the valid and test splits: it sums the batches' sizes (``bsz``) over
    each split, 61 sentences each; fairseq alone: 56."""
    args = ["bin", "--task", "translation", "--user-dir", PLUGIN_DIR, "--path", runs.checkpoint, "--cpu"]
    args += ["--valid-subset", "valid,test", "--batch-size", "16"]
    for env, expected in [(None, COUNT), (STOCK, sum(fairseq_batches(COUNT)))]:
        proc = check_ok(run_cli("validate", args, cwd=runs.folder, env=env))
        for subset in ("valid", "test"):
            m = re.search(rf"valid on '{subset}' subset \|.*\| bsz ([0-9.]+)", proc.stdout + proc.stderr)
            assert m and float(m.group(1)) == expected, tail(proc)


def _interactive(runs, lines, *extra):
    args = ["bin", "--user-dir", PLUGIN_DIR, "--path", runs.checkpoint, "--source-lang", "src", "--target-lang"]
    args += ["tgt", "--cpu", "--beam", "2", *extra]
    return check_ok(run_cli("interactive", args, cwd=runs.folder, stdin="".join(line + "\n" for line in lines)))


def test_interactive_translates_every_line_in_batches(runs):
    """fairseq-interactive, 61 lines in batches of 16: an S- and an H- line for each, in input order, the line of
    unknown words included (fairseq-interactive batches with no --required-batch-size-multiple: fairseq alone
    loses none here either)."""
    lines = [" ".join(sentence) for sentence in runs.test]
    proc = _interactive(runs, lines, "--buffer-size", "64", "--batch-size", "16")
    out = hypothesis_lines(proc.stdout)
    assert sorted(out["H"]) == sorted(out["S"]) == list(range(COUNT)), tail(proc)
    assert [int(i) for i in re.findall(r"^H-(\d+)\t", proc.stdout, re.MULTILINE)] == list(range(COUNT))
    assert out["S"][UNKNOWN] == "<unk> <unk> <unk> <unk>"


LONG = " ".join(f"s{i % 24}" for i in range(25))  # 26 tokens with EOS: more than POSITIONS


@pytest.mark.parametrize("buffer", [1, 4])
def test_interactive_answers_a_line_skipped_for_its_length(runs, buffer):
    """With --skip-invalid-size-inputs-valid-test a line longer than the position table is answered: its source,
    a W- line naming the reason and an empty hypothesis (score -inf), under its own id; the other lines are
    translated. One line at a time (the default) every line's output comes in input order."""
    lines = ["s1 s2 s3", LONG, "s4 s5", LONG, "s6"]
    extra = ["--buffer-size", str(buffer), "--batch-size", str(buffer)]
    proc = _interactive(runs, lines, "--skip-invalid-size-inputs-valid-test", *extra)
    out = hypothesis_lines(proc.stdout)
    assert sorted(out["S"]) == sorted(out["H"]) == sorted(out["D"]) == list(range(len(lines))), tail(proc)
    for i in (1, 3):
        assert out["S"][i] == LONG and out["H"][i] == "-inf\t" and out["D"][i] == "-inf\t" and out["P"][i] == ""
        reason = f"W-{i}\tskipped: 26 source tokens (with EOS) do not fit the model's max_positions=(16, 16)"
        assert reason in proc.stdout, tail(proc)
    for i in (0, 2, 4):  # decoded: a finite score, and fairseq's own W- line (the time it took)
        assert math.isfinite(float(out["H"][i].split("\t")[0])), tail(proc)
        assert re.search(rf"^W-{i}\t[0-9.]+\tseconds$", proc.stdout, re.MULTILINE), tail(proc)
    if buffer == 1:
        ids = [int(m.group(1)) for m in re.finditer(r"^[SWHDP]-(\d+)\t", proc.stdout, re.MULTILINE)]
        assert ids == sorted(ids), ids


def test_a_sentence_longer_than_max_tokens_is_skipped_or_named(runs):
    """A test sentence longer than --max-tokens cannot be batched: with --skip-invalid-size-inputs-valid-test it is
    skipped with fairseq's warning and the others translated (as fairseq-train does with its training batches),
    without it one error names --max-tokens; interactive answers such a line with a W- line naming it. fairseq
    alone stops in its batcher, flag or not (AssertionError: Sentences lengths should not exceed max_tokens)."""
    max_tokens = 8  # (a sentence's tokens: its longer side, with EOS)
    too_long = [i for i, words in enumerate(runs.test) if len(words) + 1 > max_tokens]
    assert 0 < len(too_long) < COUNT
    flags = ["--max-tokens", str(max_tokens)]
    proc = _generate(runs, *flags, "--skip-invalid-size-inputs-valid-test")
    assert sorted(hypothesis_lines(proc.stdout)["H"]) == [i for i in range(COUNT) if i not in too_long], tail(proc)
    assert f"{len(too_long)} samples have invalid sizes and will be skipped, max_positions=(8, 8)" in proc.stderr
    args = ["bin", "--user-dir", PLUGIN_DIR, "--path", runs.checkpoint, "--cpu", "--beam", "5", *flags]
    for env, message in [(None, "capped by --max-tokens 8: a batch must hold the whole sentence, so raise"),
                         (STOCK, "AssertionError: Sentences lengths should not exceed max_tokens=8")]:  # fmt: skip
        proc = run_cli("generate", args, cwd=runs.folder, env=env)
        assert proc.returncode != 0 and message in proc.stderr, tail(proc)
    lines = ["s1 s2", " ".join(f"s{i}" for i in range(max_tokens)), "s3"]
    proc = _interactive(runs, lines, *flags, "--skip-invalid-size-inputs-valid-test")
    assert "W-1\tskipped: 9 source tokens (with EOS) do not fit --max-tokens 8" in proc.stdout, tail(proc)
    assert sorted(hypothesis_lines(proc.stdout)["H"]) == [0, 1, 2], tail(proc)
