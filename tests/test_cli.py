"""End-to-end tests through the real fairseq command-line tools, run as subprocesses on a generated toy corpus.

One small ``convs2s_iwslt_de_en`` model (shrunk by flags) is trained once per module on a word-mapping-and-reversal
task (see ``cli_helpers``) and reused by the tests that follow; each tool runs as ``python -m fairseq_cli.<tool>``
with ``--user-dir`` pointing at this repository's plugin.
"""

import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from subprocess import PIPE
from types import SimpleNamespace

import pytest
from cli_helpers import (
    EVAL_FLAGS,
    PLUGIN_DIR,
    bleu_of,
    check_ok,
    epoch_losses,
    generate,
    hypothesis_lines,
    load_checkpoint,
    make_splits,
    max_param_difference,
    preprocess,
    run_cli,
    split_hypothesis,
    tail,
    torch_frames,
    train,
    translate,
    validation_stats,
    wait_until_sleeping,
    write_corpus,
)
from utils import PRESETS

EPOCHS = 20
# BLEU on the 100 test sentences, measured with this corpus and these flags (seed 1, 2 CPU cores): the trained
# model scores 98.5 after 20 epochs (94-99 from epoch 16 on); the same model after 1 update at lr 1e-9 scores 0.0,
# and so does the model after 1 epoch. Models part-way through training score 5-75 (epochs 6-14).
BLEU_THRESHOLD = 80.0
NUM_TEST = 100


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Text files and the binarized ``bin/`` folder of the toy corpus: 3000 training, 100 valid, 100 test pairs."""
    folder = tmp_path_factory.mktemp("cli")
    make_splits(folder, {"train": 3000, "valid": 100, "test": NUM_TEST})
    preprocess(folder, "bin", trainpref="train", validpref="valid", testpref="test")
    return folder


@pytest.fixture(scope="module")
def trained(corpus):
    """The model every other test uses: ``fairseq-train`` for EPOCHS epochs; ``log`` is its full output."""
    proc = train(corpus, "bin", "ckpt", "--max-epoch", str(EPOCHS))
    return SimpleNamespace(folder=corpus, log=proc.stdout + proc.stderr)


@pytest.fixture(scope="module")
def generated_best(trained):
    """``fairseq-generate --path ckpt/checkpoint_best.pt --beam 5 --print-alignment`` on the test set."""
    return generate(trained.folder, "bin", "ckpt/checkpoint_best.pt", "--print-alignment")


@pytest.fixture(scope="module")
def generated_last(trained):
    """The same on ``checkpoint_last.pt`` (the model after the last epoch, whatever validation said)."""
    return generate(trained.folder, "bin", "ckpt/checkpoint_last.pt", "--print-alignment")


@pytest.fixture(scope="module")
def validated_last(trained):
    """``fairseq-validate`` of ``checkpoint_last.pt`` on the valid and test subsets."""
    args = [
        "bin", "--task", "translation",  # fairseq-validate has no default task
        "--user-dir", PLUGIN_DIR,
        "--path", "ckpt/checkpoint_last.pt",
        "--valid-subset", "valid,test",
        "--batch-size", "32",
        "--cpu",
        *EVAL_FLAGS,
    ]  # fmt: skip
    return check_ok(run_cli("validate", args, cwd=trained.folder))


def _interactive(folder: Path, checkpoint: str, lines, *extra: str, data: str = "bin"):
    args = [data, "--user-dir", PLUGIN_DIR, "--path", checkpoint, "--source-lang", "src", "--target-lang", "tgt"]
    return run_cli("interactive", [*args, "--cpu", "--beam", "5", *extra], cwd=folder, stdin="\n".join(lines) + "\n")


# ---- training --------------------------------------------------------------------------------------------------


def test_training_writes_checkpoints_and_loss_decreases(trained):
    """fairseq-train builds the plugin's model from --arch plus flags, trains it, and saves best/last checkpoints;
    the per-epoch training loss falls steadily and far (label-smoothed loss ~4.9 at epoch 1)."""
    ckpt = trained.folder / "ckpt"
    assert (ckpt / "checkpoint_best.pt").is_file() and (ckpt / "checkpoint_last.pt").is_file(), sorted(
        p.name for p in ckpt.iterdir()
    )
    assert "ConvS2SModel" in trained.log and "model: ConvS2SModel" in trained.log, trained.log[-3000:]

    losses = epoch_losses(trained.log, "train")
    assert len(losses) == EPOCHS, f"expected {EPOCHS} epoch summaries, got {losses}"
    assert all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < 0.5 * losses[0], f"training loss did not fall enough: {losses}"
    # mostly downhill: the later half of training is below the earlier half, epoch by epoch on average
    half = EPOCHS // 2
    assert sum(losses[half:]) / (EPOCHS - half) < sum(losses[:half]) / half, losses


def test_validation_during_training_sees_the_current_weights(trained, validated_last, generated_best):
    """The valid loss fairseq-train logs after the last epoch is the loss fairseq-validate computes for
    checkpoint_last.pt; so it falls with training, and checkpoint_best.pt (picked by it) is a trained model.

    Regression test: the weight-norm layers once cached their folded weights across optimizer steps (fairseq's
    optimizers write through p.data, which bumps no version counter), so validation during training kept the
    first epoch's weights, the logged valid loss rose while training improved, and checkpoint_best.pt was epoch 1.
    """
    valid = epoch_losses(trained.log, "valid")
    standalone = validation_stats(validated_last.stderr + validated_last.stdout)["valid"]["loss"]
    assert valid[-1] == pytest.approx(standalone, abs=0.01), (
        f"fairseq-train logged valid loss {valid[-1]} after the last epoch; fairseq-validate of the same "
        f"checkpoint says {standalone}; all logged valid losses: {valid}"
    )
    assert min(valid) < valid[0] - 1.0, f"valid loss never fell during training: {valid}"
    assert bleu_of(generated_best.stdout) > BLEU_THRESHOLD


# ---- generation ------------------------------------------------------------------------------------------------


def test_checkpoint_activations_trains_as_without(corpus):
    """``fairseq-train --checkpoint-activations`` (one epoch, dropout 0.2): the flag reaches the model and its
    checkpoint, and the run logs the losses of the same run without it and ends at the same weights."""
    runs = {}
    for name, extra in (("kept", []), ("checkpointed", ["--checkpoint-activations"])):
        proc = train(corpus, "bin", f"ckpt_{name}", "--max-epoch", "1", "--dropout", "0.2", *extra)
        log = proc.stdout + proc.stderr
        runs[name] = (epoch_losses(log, "train"), epoch_losses(log, "valid"))
    kept = load_checkpoint(corpus / "ckpt_kept" / "checkpoint_last.pt")
    checkpointed = load_checkpoint(corpus / "ckpt_checkpointed" / "checkpoint_last.pt")
    assert checkpointed["cfg"]["model"].checkpoint_activations is True
    assert kept["cfg"]["model"].checkpoint_activations is False
    assert runs["kept"] == runs["checkpointed"] and len(runs["kept"][0]) == 1, runs
    assert max_param_difference(kept, checkpointed) == 0.0


def _alignment_pairs(a_line: str):
    return [tuple(int(x) for x in pair.split("-")) for pair in a_line.split()]


def test_generate_prints_hypotheses_scores_and_alignments(corpus, generated_best):
    """fairseq-generate on checkpoint_best.pt answers every test sentence with an H- line (finite score), a P- line
    (one score per token plus EOS) and an A- line whose source/target indices lie inside the sentences."""
    lines = hypothesis_lines(generated_best.stdout)
    expected = set(range(NUM_TEST))
    for kind in "STHDPA":
        assert set(lines[kind]) == expected, f"{kind}- lines missing for ids {sorted(expected - set(lines[kind]))}"

    sources = (corpus / "test.src").read_text().splitlines()
    for i in expected:
        assert lines["S"][i] == sources[i], (i, lines["S"][i], sources[i])
        _, hyp = split_hypothesis(lines["H"][i])
        scores = [float(x) for x in lines["P"][i].split()]
        assert len(scores) == len(hyp) + 1 and all(math.isfinite(s) and s <= 0 for s in scores), lines["P"][i]
        pairs = _alignment_pairs(lines["A"][i])
        src_len = len(sources[i].split())
        assert pairs, f"empty alignment for sentence {i}"
        for s, t in pairs:
            assert 0 <= s < src_len and 0 <= t < len(hyp), f"alignment {s}-{t} out of range in sentence {i}: {pairs}"
        assert sorted(t for _, t in pairs) == list(range(len(hyp))), f"not one alignment per target word: {pairs}"


def test_generate_bleu_shows_the_model_learned(trained, generated_last):
    """The trained model translates the held-out test set almost perfectly (BLEU above BLEU_THRESHOLD), while the
    same model after a single update at lr 1e-9 (untrained) scores far below, so the threshold measures learning;
    the attention also learned the task: hard alignments mostly point at the mirrored source word."""
    bleu = bleu_of(generated_last.stdout)
    assert bleu > BLEU_THRESHOLD, f"trained model BLEU {bleu} <= {BLEU_THRESHOLD}" + tail(generated_last)

    train(trained.folder, "bin", "untrained", "--max-update", "1", "--lr", "1e-9")
    untrained = bleu_of(generate(trained.folder, "bin", "untrained/checkpoint_last.pt").stdout)
    assert untrained < 20.0, f"an untrained model reached BLEU {untrained}: the task or the metric is too easy"
    assert bleu - untrained > 60.0, (bleu, untrained)

    lines = hypothesis_lines(generated_last.stdout)
    mirrored = total = 0
    for i, a_line in lines["A"].items():
        src_len = len(lines["S"][i].split())
        for s, t in _alignment_pairs(a_line):
            total += 1
            mirrored += s == src_len - 1 - t
    assert total and mirrored / total > 0.8, f"only {mirrored}/{total} alignments point at the mirrored source word"


def test_generate_decodes_an_ensemble_of_checkpoints(trained, generated_last):
    """``--path a.pt:b.pt`` loads both convs2s checkpoints and decodes with their ensemble: a checkpoint ensembled
    with itself gives its own hypotheses, alignments and scores (its log-probabilities averaged with themselves).
    That two different models combine as fconv's do is ``test_convert_fconv``'s."""
    path = "ckpt/checkpoint_last.pt:ckpt/checkpoint_last.pt"
    ensemble = generate(trained.folder, "bin", path, "--print-alignment")
    assert "loading model(s) from ckpt/checkpoint_last.pt:ckpt/checkpoint_last.pt" in ensemble.stderr, tail(ensemble)
    alone, both = hypothesis_lines(generated_last.stdout), hypothesis_lines(ensemble.stdout)
    assert sorted(both["H"]) == list(range(NUM_TEST)), tail(ensemble)
    for i in range(NUM_TEST):
        (score, hyp), (alone_score, alone_hyp) = split_hypothesis(both["H"][i]), split_hypothesis(alone["H"][i])
        assert hyp == alone_hyp and both["A"][i] == alone["A"][i], (i, both["H"][i], alone["H"][i])
        assert score == pytest.approx(alone_score, abs=2e-4)


def test_generate_diverse_beam_groups_over_several_batches(trained):
    """``--diverse-beam-groups``: fairseq-fixed 0.12.3.1 alone fails at the second step of any batch holding a sentence
    id past the batch's size (here all but the first of 7 batches of 16); with the plugin loaded each sentence
    gets the hypotheses it gets with the 100 sentences in one batch of ids 0 to 99, where fairseq's code works."""
    flags = ["--beam", "4", "--nbest", "4", "--diverse-beam-groups", "2", "--diverse-beam-strength", "2"]
    batches = generate(trained.folder, "bin", "ckpt/checkpoint_last.pt", *flags)  # --batch-size 16
    one_batch = generate(trained.folder, "bin", "ckpt/checkpoint_last.pt", *flags, "--batch-size", str(NUM_TEST))

    def hypotheses(stdout):  # every H- line (--nbest 4), by sentence id: (score, tokens)
        found: dict = {}
        for line in stdout.splitlines():
            if line.startswith("H-"):
                key, payload = line.split("\t", 1)
                found.setdefault(int(key[2:]), []).append(split_hypothesis(payload))
        return found

    got, expected = hypotheses(batches.stdout), hypotheses(one_batch.stdout)
    assert sorted(got) == list(range(NUM_TEST)) and {len(h) for h in got.values()} == {4}, tail(batches)
    assert {i: [text for _, text in h] for i, h in got.items()} == {i: [t for _, t in h] for i, h in expected.items()}
    for i, beam in got.items():
        assert [score for score, _ in beam] == pytest.approx([score for score, _ in expected[i]], abs=1e-4)


def test_bf16_generation_and_interactive_translate_as_fp32_does(trained, generated_last):
    """``--bf16`` decodes a convs2s model in bfloat16 on the CPU (stock fairseq-generate would ignore it and decode
    in fp32): the fp32 translations for nearly every test sentence and a BLEU above the threshold, with scores
    that show bf16's rounding (not equal, yet close); fairseq-interactive --bf16 translates as well."""
    bf16 = generate(trained.folder, "bin", "ckpt/checkpoint_last.pt", "--print-alignment", "--bf16")
    fp32_lines, bf16_lines = hypothesis_lines(generated_last.stdout), hypothesis_lines(bf16.stdout)
    assert sorted(bf16_lines["H"]) == list(range(NUM_TEST)), tail(bf16)
    fp32_hyps = {i: split_hypothesis(h) for i, h in fp32_lines["H"].items()}
    bf16_hyps = {i: split_hypothesis(h) for i, h in bf16_lines["H"].items()}
    same = [i for i in range(NUM_TEST) if bf16_hyps[i][1] == fp32_hyps[i][1]]
    assert len(same) >= 0.95 * NUM_TEST, f"only {len(same)} of {NUM_TEST} hypotheses as in fp32"
    assert bleu_of(bf16.stdout) > BLEU_THRESHOLD
    gaps = [abs(bf16_hyps[i][0] - fp32_hyps[i][0]) for i in same]
    assert 0 < max(gaps) < 0.1, max(gaps)

    inputs = ["s1 s2 s3", "s4 s5 s6 s7 s8"]
    proc = check_ok(_interactive(trained.folder, "ckpt/checkpoint_last.pt", inputs, "--bf16"))
    hyps = {i: split_hypothesis(h)[1] for i, h in hypothesis_lines(proc.stdout)["H"].items()}
    assert hyps == {i: translate(line.split()) for i, line in enumerate(inputs)}, tail(proc)


def test_bf16_benchmark_reads_fairseq_generates_speed_bleu_and_hypotheses(trained, generated_last, tmp_path):
    """``benchmarks.bf16_generation --data --path`` runs fairseq-generate in both precisions and reads from its
    output what fairseq printed: the fp32 BLEU is the one of the fixture's run (the same flags), and every
    sentence's hypothesis is compared."""
    from benchmarks import bf16_generation

    data, path = str(trained.folder / "bin"), str(trained.folder / "ckpt/checkpoint_last.pt")
    args = ["--data", data, "--path", path, "--batches", "16", "--repeats", "1", "--out", str(tmp_path)]
    bf16_generation.main([*args, "--generate-args=--print-alignment"])
    (row,) = json.loads((tmp_path / "bf16_generation_trained_cpu.json").read_text())["rows"]
    assert row["fp32_bleu"] == bleu_of(generated_last.stdout) and row["bf16_bleu"] > BLEU_THRESHOLD, row
    assert row["sentences"] == NUM_TEST and 0 <= row["changed_by_bf16"] <= 0.05 * NUM_TEST, row
    assert row["fp32_sentences_per_s"] > 0 and row["bf16_sentences_per_s"] > 0


def test_validate_reports_loss(validated_last):
    """fairseq-validate loads the checkpoint and reports a finite, low loss on every sentence of both subsets."""
    stats = validation_stats(validated_last.stderr + validated_last.stdout)
    assert set(stats) == {"valid", "test"}, tail(validated_last)
    for subset, fields in stats.items():
        assert math.isfinite(fields["loss"]) and math.isfinite(fields["nll_loss"]), fields
        assert fields["nll_loss"] < 1.5, f"{subset}: the trained model's nll_loss is high: {fields}"
        assert fields["bsz"] == 100, f"{subset}: not every sentence was evaluated: {fields}"


# ---- interactive -----------------------------------------------------------------------------------------------


def test_interactive_answers_every_line(trained):
    """fairseq-interactive reads source lines from stdin and prints an H- line per line, in order, including an
    empty line, a whitespace-only line (both become an EOS-only source; fairseq still decodes them) and a line of
    unknown words (all <unk>); known sentences come out correctly translated, and a batch of all five lines
    (padded together) gives the same hypotheses as one line at a time."""
    inputs = ["s1 s2 s3", "", "   ", "foo bar baz", "s4 s5 s6 s7 s8"]
    one_by_one = _interactive(trained.folder, "ckpt/checkpoint_last.pt", inputs)
    check_ok(one_by_one)
    lines = hypothesis_lines(one_by_one.stdout)
    assert sorted(lines["S"]) == sorted(lines["H"]) == list(range(len(inputs))), tail(one_by_one)
    assert [lines["S"][i] for i in range(len(inputs))] == ["s1 s2 s3", "", "", "<unk> <unk> <unk>", inputs[4]]
    hyps = {i: split_hypothesis(h)[1] for i, h in lines["H"].items()}
    assert hyps[0] == translate(inputs[0].split()) and hyps[4] == translate(inputs[4].split()), hyps
    assert all(w.startswith("t") for hyp in hyps.values() for w in hyp), hyps

    batched = _interactive(trained.folder, "ckpt/checkpoint_last.pt", inputs, "--buffer-size", "8", "--batch-size", "8")
    check_ok(batched)
    batched_hyps = {i: split_hypothesis(h)[1] for i, h in hypothesis_lines(batched.stdout)["H"].items()}
    assert batched_hyps == hyps


def test_options_the_tools_cannot_print_are_refused_before_decoding(trained):
    """fairseq-generate --print-step (a beam search records no steps) and fairseq-interactive --print-alignment
    soft (it prints hard alignments only) decoded a batch and then failed, with KeyError: 'steps' and 'too many
    values to unpack', for any model: now one line naming the flag, before anything is printed."""
    refused = [
        (generate(trained.folder, "bin", "ckpt/checkpoint_last.pt", "--print-step", check=False), "--print-step"),
        (
            _interactive(trained.folder, "ckpt/checkpoint_last.pt", ["s1 s2"], "--print-alignment", "soft"),
            "fairseq-interactive prints hard alignments only",
        ),
    ]
    for proc, message in refused:
        tool = proc.args[2].replace("fairseq_cli.", "fairseq-")
        assert proc.returncode == 1 and f"\n{tool}: error: {message}" in proc.stderr, tail(proc)
        assert "Traceback" not in proc.stderr, tail(proc)
        assert not re.search(r"^[SHDP]-\d", proc.stdout, re.MULTILINE), tail(proc)
    hard = _interactive(trained.folder, "ckpt/checkpoint_last.pt", ["s1 s2"], "--print-alignment", "hard")
    assert re.search(r"^A-0\t\d+-\d+", check_ok(hard).stdout, re.MULTILINE), tail(hard)


def test_interactive_ends_in_one_line_on_ctrl_c_and_quietly_when_its_reader_goes(trained, tmp_path):
    """Ctrl-C at fairseq-interactive's prompt: one line and status 130; a reader that goes away (``| head``): no
    output, status 141, as SIGPIPE would. Both were tracebacks (KeyboardInterrupt, BrokenPipeError)."""
    args = ["bin", "--user-dir", PLUGIN_DIR, "--path", "ckpt/checkpoint_last.pt", "--source-lang", "src"]
    cmd = [sys.executable, "-m", "fairseq_cli.interactive", *map(str, args), "--target-lang", "tgt", "--cpu"]
    for end in ("interrupt", "reader gone"):
        with open(tmp_path / f"{end}.err", "w+") as err:
            popen = dict(cwd=trained.folder, stdin=PIPE, stdout=PIPE, stderr=err, text=True)
            with subprocess.Popen(cmd, **popen) as proc:
                proc.stdin.write("s1 s2 s3\n")
                proc.stdin.flush()
                assert any(line.startswith("P-0") for line in proc.stdout)  # (its answer: the P- line is last)
                if end == "interrupt":
                    wait_until_sleeping(proc.pid)  # (at the prompt again)
                    proc.send_signal(signal.SIGINT)
                    assert proc.wait(timeout=120) == 130
                else:
                    proc.stdout.close()
                    proc.stdin.write("s4 s5\n")  # (its S- line meets the closed pipe)
                    proc.stdin.close()
                    assert proc.wait(timeout=120) == 141
            err.seek(0)
            log = err.read()
        assert "Traceback" not in log and "KeyboardInterrupt" not in log and "BrokenPipe" not in log, log[-3000:]
        if end == "interrupt":
            assert log.endswith("fairseq-interactive: interrupted\n"), log[-3000:]


def test_generate_ends_quietly_when_its_reader_goes(monkeypatch):
    """Loaded by fairseq-generate, the plugin replaces its main; a closed pipe then ends it with status 141 and
    nothing on stderr, Ctrl-C with one line and 130."""
    from fairseq_cli import generate as tool

    from fairseq_convs2s.compat import quiet_exits
    from fairseq_convs2s_autoload import is_replaced

    monkeypatch.setattr(tool, "main", tool.main)  # (put back afterwards)
    quiet_exits.end_tools_quietly()
    assert is_replaced(tool.main, "quiet_exits")
    for raised, status in [(BrokenPipeError(32, "Broken pipe"), 141), (KeyboardInterrupt(), 130)]:

        def main(cfg, raised=raised):
            raise raised

        with pytest.raises(SystemExit) as ended:
            quiet_exits._ending_quietly(main, "fairseq-generate", decoding=True)(None)
        assert ended.value.code == status


# ---- bad input -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag, spec", [("--encoder-layers", "[(32,3)"), ("--decoder-attention", "[True")])
def test_malformed_layer_spec_is_a_usage_error(corpus, flag, spec):
    """A malformed --encoder-layers or --decoder-attention fails at argument parsing: exit code 2, argparse's message
    naming the flag and the parse problem, no traceback, and no training started."""
    proc = run_cli(
        "train",
        ["bin", "--user-dir", PLUGIN_DIR, "--arch", "convs2s_iwslt_de_en", flag, spec]
        + ["--cpu", "--max-tokens", "1000", "--save-dir", "bad_spec"],
        cwd=corpus,
    )
    assert proc.returncode == 2, tail(proc)
    assert f"error: argument {flag}" in proc.stderr and "never closed" in proc.stderr, tail(proc)
    assert "Traceback" not in proc.stderr, tail(proc)
    assert not (corpus / "bad_spec").exists()


def test_unknown_arch_is_an_invalid_choice(corpus):
    """An unknown --arch is rejected by fairseq's argparse with "invalid choice", exit code 2; the list of choices
    it prints includes the plugin's presets (so the plugin was loaded when the error was raised)."""
    proc = run_cli(
        "train",
        ["bin", "--user-dir", PLUGIN_DIR, "--arch", "convs2s_nope", "--cpu", "--max-tokens", "1000"]
        + ["--save-dir", "bad_arch"],
        cwd=corpus,
    )
    assert proc.returncode == 2, tail(proc)
    assert "invalid choice: 'convs2s_nope'" in proc.stderr and "'convs2s_iwslt_de_en'" in proc.stderr, tail(proc)
    assert "Traceback" not in proc.stderr, tail(proc)


def test_mismatched_embed_dims_fail_with_the_plugins_message(corpus):
    """--encoder-embed-dim != --decoder-embed-dim cannot work (attention dots the two); building the model fails
    with one line naming both flags, before torch is reached (fairseq alone: the message ends a traceback)."""
    proc = run_cli(
        "train",
        ["bin", "--user-dir", PLUGIN_DIR, "--arch", "convs2s_iwslt_de_en", "--encoder-embed-dim", "32"]
        + ["--cpu", "--max-tokens", "1000", "--save-dir", "bad_dims"],
        cwd=corpus,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, tail(proc)
    line = "fairseq-train: error: --encoder-embed-dim (32) and --decoder-embed-dim (256) must be equal"
    assert f"\n{line}" in proc.stderr, tail(proc)
    alone = run_cli("train", proc.args[3:], cwd=corpus, env={"FAIRSEQ_CONVS2S_COMPAT_OFF": "quiet_exits"})
    assert "Traceback" in alone.stderr and line not in alone.stderr, tail(alone)
    assert "InputError: --encoder-embed-dim (32) and --decoder-embed-dim (256) must be equal" in alone.stderr


# fairseq-train as its console script runs it, in a process that sees two GPUs, so that fairseq spawns two ranks
# (--cpu: they train on the CPU, over gloo)
PRETEND_TWO_GPUS = """
import sys

if __name__ == "__main__":  # (the spawned ranks import this file again)
    import torch

    torch.cuda.device_count = lambda: 2
    from fairseq_cli.train import cli_main

    sys.argv = ["fairseq-train", *sys.argv[1:]]
    cli_main()
"""


def test_a_refusal_in_the_ranks_fairseq_train_spawns_ends_in_one_line(corpus, tmp_path):
    """fairseq-train spawns one rank per GPU; a rank's refusal reached the command as torch's ProcessRaisedException,
    a traceback around the rank's own."""
    script = tmp_path / "fairseq_train_on_two_gpus.py"
    script.write_text(PRETEND_TWO_GPUS)
    flags = ["bin", "--user-dir", PLUGIN_DIR, "--arch", "convs2s_iwslt_de_en", "--encoder-embed-dim", "32", "--cpu"]
    flags += ["--max-tokens", "1000", "--save-dir", tmp_path / "ckpt", "--distributed-world-size", "2"]
    flags += ["--distributed-backend", "gloo", "--distributed-init-method"]
    line = "fairseq-train: error: --encoder-embed-dim (32) and --decoder-embed-dim (256) must be equal"
    for compat_off, rendezvous in (("", "ranks"), ("quiet_exits", "ranks_alone")):
        cmd = [sys.executable, script, *flags, (tmp_path / rendezvous).as_uri()]
        env = {**os.environ, "FAIRSEQ_CONVS2S_COMPAT_OFF": compat_off}
        proc = subprocess.run(list(map(str, cmd)), cwd=corpus, capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 1, tail(proc)
        if compat_off:  # fairseq alone: the rank's traceback inside the launcher's
            assert "ProcessRaisedException" in proc.stderr and line not in proc.stderr, tail(proc)
        else:
            assert "Traceback" not in proc.stderr and f"\n{line}" in proc.stderr, tail(proc)
            assert proc.stderr.count("fairseq-train: error:") == 1, tail(proc)


# ---- sources longer than the model's positions -----------------------------------------------------------------

SHORT_LONG = [5, 25, 7, 18, 4]  # source lengths of the "long" test set; 25 and 18 do not fit 16 positions


@pytest.fixture(scope="module")
def short_model(trained):
    """A model with 16 source/target positions (1 epoch on the corpus, every training sentence fits) and a
    test set ``bin_long`` of sentences of SHORT_LONG words, binarized with the corpus' dictionaries."""
    folder = trained.folder
    train(folder, "bin", "ckpt16", "--max-epoch", "1", "--max-source-positions", "16", "--max-target-positions", "16")
    sentences = [[f"s{(3 * i + j) % 24}" for j in range(n)] for i, n in enumerate(SHORT_LONG)]
    write_corpus(folder, "long", sentences)
    preprocess(folder, "bin_long", "--srcdict", "bin/dict.src.txt", "--tgtdict", "bin/dict.tgt.txt", testpref="long")
    return SimpleNamespace(folder=folder, checkpoint="ckpt16/checkpoint_last.pt", sentences=sentences)


def test_generate_rejects_too_long_sources_unless_told_to_skip(short_model):
    """fairseq-generate refuses a test set with sources longer than the model's 16 positions before decoding
    anything (exit 1, fairseq's message naming max_positions and --skip-invalid-size-inputs-valid-test; no torch
    frames); with --skip-invalid-size-inputs-valid-test it warns, skips the long ones and translates the rest."""
    folder, ckpt = short_model.folder, short_model.checkpoint
    proc = generate(folder, "bin_long", ckpt, check=False)
    assert proc.returncode != 0, tail(proc)
    assert "max_positions=(16, 16)" in proc.stderr, tail(proc)
    assert "--skip-invalid-size-inputs-valid-test" in proc.stderr, tail(proc)
    assert not torch_frames(proc.stderr), tail(proc)
    assert "H-" not in proc.stdout

    proc = generate(folder, "bin_long", ckpt, "--skip-invalid-size-inputs-valid-test")
    fits = {i for i, n in enumerate(SHORT_LONG) if n + 1 <= 16}  # + EOS
    assert set(hypothesis_lines(proc.stdout)["H"]) == fits, tail(proc)
    assert "2 samples have invalid sizes and will be skipped, max_positions=(16, 16)" in proc.stderr, tail(proc)


def test_interactive_too_long_source(short_model):
    """fairseq-interactive answers the lines before a too-long one, then stops with fairseq's max_positions error
    (exit 1, no torch frames); with --skip-invalid-size-inputs-valid-test it answers that line with an empty
    hypothesis and a W- line saying why (the plugin; fairseq alone prints nothing for it) and translates the others
    (tests/test_every_sentence.py has the details)."""
    folder, ckpt = short_model.folder, short_model.checkpoint
    inputs = [" ".join(s) for s in short_model.sentences[:3]]  # 5, 25, 7 words

    proc = _interactive(folder, ckpt, inputs)
    assert proc.returncode != 0, tail(proc)
    assert "max_positions=(16, 16)" in proc.stderr and "--skip-invalid-size-inputs-valid-test" in proc.stderr
    assert not torch_frames(proc.stderr), tail(proc)
    assert set(hypothesis_lines(proc.stdout)["H"]) == {0}, tail(proc)

    proc = check_ok(_interactive(folder, ckpt, inputs, "--skip-invalid-size-inputs-valid-test"))
    lines = hypothesis_lines(proc.stdout)
    assert set(lines["H"]) == set(lines["S"]) == {0, 1, 2}, tail(proc)
    assert lines["H"][1] == "-inf\t" and "W-1\tskipped: 26 source tokens" in proc.stdout, tail(proc)


# ---- loading the plugin ----------------------------------------------------------------------------------------

_IMPORT_BOTH_WAYS = """
import argparse, sys
{first}
{second}
from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
import fairseq_convs2s
assert sys.modules["fairseq_convs2s"] is fairseq_convs2s
assert MODEL_REGISTRY["convs2s"] is fairseq_convs2s.ConvS2SModel
presets = sorted(a for a in ARCH_MODEL_REGISTRY if a.startswith("convs2s"))
assert all(ARCH_MODEL_REGISTRY[a] is fairseq_convs2s.ConvS2SModel for a in presets)
print("PRESETS", " ".join(presets))
"""


def test_every_preset_is_in_the_readmes_table():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Presets", 1)[1].split("\n## ", 1)[0]
    assert [arch for arch in PRESETS if f"| `{arch}` |" not in table] == []


@pytest.mark.parametrize("order", ["import_then_user_dir", "user_dir_then_import"])
def test_plugin_loads_by_import_and_by_user_dir_in_one_process(tmp_path, order):
    """The installed package and fairseq's --user-dir loader (utils.import_user_module, twice) resolve to one
    module in either order: no "Cannot register duplicate" error, the model and all presets registered once."""
    by_import = "import fairseq_convs2s"
    by_user_dir = (
        "from fairseq import utils\n"
        f"utils.import_user_module(argparse.Namespace(user_dir={str(PLUGIN_DIR)!r}))\n"
        f"utils.import_user_module(argparse.Namespace(user_dir={str(PLUGIN_DIR)!r}))"
    )
    first, second = (by_import, by_user_dir) if order == "import_then_user_dir" else (by_user_dir, by_import)
    code = _IMPORT_BOTH_WAYS.format(first=first, second=second)
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )  # cwd outside the repository: the import must come from the installed package
    assert proc.returncode == 0, tail(proc)
    assert "Cannot register duplicate" not in proc.stderr
    presets = proc.stdout.split("PRESETS", 1)[1].split()
    assert presets == PRESETS and len(presets) >= 6, presets  # (those this process registered by its import)
