"""examples/sequence_risk: summarize.py's table of several fine-tuning seeds and its paired statistic; finetune.py's
usage errors and the model flags it reads from a checkpoint."""

import argparse
import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import REPO_ROOT

from fairseq_convs2s.models.config import ConvS2SConfig

SCRIPT = REPO_ROOT / "examples" / "sequence_risk" / "summarize.py"
FINETUNE = REPO_ROOT / "examples" / "sequence_risk" / "finetune.py"
CONFIG_FIELDS = {f.name for f in dataclasses.fields(ConvS2SConfig) if not f.name.startswith("_")}


def _results(folder, start, risk, token):
    folder.mkdir()
    bleu = {"start": start, "risk": risk, "token": token}
    results = {
        run: {"bleu": f"BLEU = {score:.2f} 60.0/40.0/30.0/20.0 (BP = 1.000 ratio = 1.000)"}
        for run, score in bleu.items()
    }
    (folder / "results.json").write_text(json.dumps(results))


def test_summary_gives_per_seed_scores_means_and_the_paired_t(tmp_path):
    _results(tmp_path / "s1", 30.0, 31.0, 30.5)
    _results(tmp_path / "s2", 30.0, 30.2, 30.4)
    _results(tmp_path / "s3", 30.0, 30.9, 30.3)
    (tmp_path / "s4").mkdir()  # a run that did not finish
    folders = [str(tmp_path / f"s{i}") for i in range(1, 5)]
    out = subprocess.run([sys.executable, str(SCRIPT), *folders], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[0] == "| run | s1 | s2 | s3 | mean |"
    assert "| risk | 31.00 | 30.20 | 30.90 | 30.70 |" in lines
    assert "| token | 30.50 | 30.40 | 30.30 | 30.40 |" in lines
    differences = [0.5, -0.2, 0.6]  # by hand: mean 0.3, sd sqrt(0.19), t = 0.3 / (sd / sqrt 3)
    t = 0.3 / (math.sqrt(sum((d - 0.3) ** 2 for d in differences) / 2) / math.sqrt(3))
    assert f"mean +0.30 BLEU, t = {t:.2f} (2 degrees of freedom); risk ahead with 2 of 3" in out
    assert lines[-1] == f"no results (not finished): {tmp_path / 's4'}"


def _finetune():
    """examples/sequence_risk/finetune.py as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("risk_finetune", FINETUNE)
    finetune = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(finetune)
    return finetune


def test_finetunes_missing_or_unreadable_inputs_are_usage_errors(tmp_path):
    """A missing checkpoint ended in torch.load's FileNotFoundError, a file as --out in a FileExistsError, a file
    that is no checkpoint in the plugin's BrokenCheckpoint traceback, a folder of no binarized data in a bare
    SystemExit message."""
    data, binarized, a_file = tmp_path / "data-bin", tmp_path / "binarized", tmp_path / "a_file"
    data.mkdir()
    binarized.mkdir()
    (binarized / "train.de-en.de.bin").write_bytes(b"")
    a_file.write_text("not a checkpoint")
    out = ["--out", str(tmp_path / "out")]
    for args, message in [
        ([str(data), str(tmp_path / "missing.pt"), *out], "argument checkpoint: no such file"),
        ([str(data), str(a_file), "--out", str(a_file)], "argument --out: .*a_file is a file, not a folder"),
        ([str(data), str(a_file), *out], "argument data: .*data-bin: no binarized split found"),
        ([str(binarized), str(a_file), *out], "argument checkpoint: .*a_file .* is not a torch checkpoint"),
    ]:
        result = subprocess.run([sys.executable, str(FINETUNE), *args], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and re.search(message, result.stderr), result.stderr
        assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


def test_every_flag_that_shapes_the_model_is_compared():
    """The trainer compares structure.py's flags before training on from a checkpoint: each field of the model's
    config must be among them, or be one that changes no weight's meaning (the embedding files,
    --checkpoint-activations, dropout), or a checkpoint trained with it would be trained on as another model."""
    from fairseq_convs2s.models.structure import STRUCTURE_FLAGS

    unshaping = {"encoder_embed_path", "decoder_embed_path", "checkpoint_activations", "dropout"}
    assert "share_all_embeddings" in CONFIG_FIELDS and CONFIG_FIELDS - unshaping <= set(STRUCTURE_FLAGS)


def test_finetune_rebuilds_a_checkpoint_with_every_model_flag_it_was_trained_with(tmp_path):
    """finetune.py rebuilds a checkpoint's model from the flags saved in it: every model flag not at its default
    (the embedding files aside, whose vectors the weights replace), so that a flag added to the config is carried
    without a list to add it to."""
    defaults = {f.name: f.default for f in dataclasses.fields(ConvS2SConfig)}
    given = {
        "dropout": 0.3, "encoder_embed_dim": 64, "decoder_embed_dim": 64, "decoder_out_embed_dim": 64,
        "encoder_layers": "[(64, 3)] * 2", "decoder_layers": "[(64, 5)] * 2", "decoder_attention": "[False, True]",
        "share_input_output_embed": True, "share_all_embeddings": True, "attention_scaling": "paper",
        "checkpoint_activations": True, "encoder_embed_path": "gone.txt", "decoder_embed_path": "gone.txt",
        "max_source_positions": 300, "max_target_positions": 200,
    }  # fmt: skip
    assert CONFIG_FIELDS <= set(given) and all(given[name] != defaults[name] for name in CONFIG_FIELDS)
    args = argparse.Namespace(arch="convs2s_iwslt_de_en", _name="convs2s_iwslt_de_en", **given)
    state = {"cfg": {"model": args, "task": {"_name": "translation"}}, "model": {}, "extra_state": {}}
    state["optimizer_history"] = [{"criterion_name": "x", "lr_scheduler_state": {"best": 5.0}, "num_updates": 1}]
    torch.save(state, tmp_path / "checkpoint.pt")
    flags, _ = _finetune().checkpoint_settings(tmp_path / "checkpoint.pt")
    expected = ["--arch", "convs2s_iwslt_de_en"]
    for name, value in given.items():
        if not name.endswith("_embed_path"):
            expected += [f"--{name.replace('_', '-')}"] + ([] if value is True else [str(value)])
    assert sorted(flags) == sorted(expected)


def test_finetune_ends_a_failed_or_interrupted_command_in_one_line(tmp_path, monkeypatch, capsys):
    """A command that fails: its output's tail, then one line naming it and its log (exit 1); an interrupt: one line
    saying how to go on (exit 130). Both were tracebacks, or a 3,000-character SystemExit."""
    finetune = _finetune()
    monkeypatch.setattr(finetune, "language_pair", lambda data: ("de", "en"))
    monkeypatch.setattr(finetune, "checkpoint_settings", lambda checkpoint: (["--arch", "convs2s_iwslt_de_en"], None))
    (tmp_path / "model.pt").write_text("")
    argv = [str(tmp_path), str(tmp_path / "model.pt"), "--out", str(tmp_path / "out"), "--post-process", "none"]

    def fails(cmd, stdout, **kwargs):
        stdout.write("RuntimeError: what went wrong\n")
        return subprocess.CompletedProcess(cmd, 1)

    def interrupted(cmd, **kwargs):
        raise KeyboardInterrupt  # (subprocess.run ends its command on the way out)

    for fake, status, message in [
        (interrupted, 130, "finetune.py: interrupted; run the same command again to go on from here"),
        (fails, 1, f"finetune.py: error: fairseq-generate exited with status 1 (its output is also in {tmp_path}"),
    ]:
        monkeypatch.setattr(finetune.subprocess, "run", fake)
        with pytest.raises(SystemExit) as ended:
            finetune.main(argv)
        code = ended.value.code
        err = capsys.readouterr().err + (code if isinstance(code, str) else "")
        assert (1 if isinstance(code, str) else code) == status and message in err, err
    assert "RuntimeError: what went wrong" in err  # (the output's tail, above the line)
    assert "RuntimeError: what went wrong" in (tmp_path / "out" / "gen_start.log").read_text()


def test_finetune_never_reports_a_run_another_command_trained(tmp_path, monkeypatch, capsys):
    """A second call into the same --out with another --risk-alpha printed the first call's risk run (its
    checkpoint, score and timing) under the second's settings; now it stops before anything runs, naming the flag
    and both values. The same command reuses the finished runs."""
    finetune = _finetune()
    monkeypatch.setattr(finetune, "language_pair", lambda data: ("de", "en"))
    monkeypatch.setattr(finetune, "checkpoint_settings", lambda checkpoint: (["--arch", "convs2s_iwslt_de_en"], None))
    monkeypatch.setattr(finetune, "previous_training_time", lambda checkpoint: 36.0)
    monkeypatch.setattr(finetune, "bleu", lambda *args: "BLEU = 30.00 60.0/40.0/30.0/20.0")
    trained = []

    def run(cmd, log):
        save_dir = Path(cmd[cmd.index("--save-dir") + 1])
        save_dir.mkdir(parents=True)
        (save_dir / "checkpoint_last.pt").write_text("")
        trained.append(save_dir.name)
        return "num_updates=100"

    monkeypatch.setattr(finetune, "run", run)
    (tmp_path / "model.pt").write_text("")
    argv = [str(tmp_path), str(tmp_path / "model.pt"), "--out", str(tmp_path / "out"), "--post-process", "none"]
    finetune.main(argv)
    assert trained == ["risk", "token", "token-time"]
    finetune.main(argv)
    assert trained == ["risk", "token", "token-time"]  # (all reused)
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        finetune.main(argv + ["--risk-alpha", "0.5"])
    message = f"finetune.py: error: {tmp_path / 'out' / 'risk'} was trained by another command (--risk-alpha 0.3, "
    assert str(ended.value.code).startswith(message + "this command 0.5): give this command its own --out")
    assert trained == ["risk", "token", "token-time"] and "$ " not in capsys.readouterr().out


def test_finetune_trains_and_scores_the_direction_the_checkpoint_was_trained_in(tmp_path, monkeypatch):
    """A checkpoint trained en -> de on a data-bin binarized de-en (fairseq-train --source-lang en --target-lang de
    reads it either way) was fine-tuned and scored de -> en, the direction of the data's file names: silently with
    a joined dictionary. The checkpoint's recorded languages now win, in every command."""
    finetune = _finetune()
    data = tmp_path / "data-bin"
    data.mkdir()
    for lang in ("de", "en"):
        (data / f"dict.{lang}.txt").write_text("hallo 1\nhello 1\n")
        (data / f"train.de-en.{lang}.bin").write_bytes(b"")
    args = argparse.Namespace(arch="convs2s_iwslt_de_en", _name="convs2s_iwslt_de_en")
    task = {"_name": "translation", "source_lang": "en", "target_lang": "de"}
    state = {"cfg": {"model": args, "task": task}, "model": {}, "extra_state": {}}
    state["optimizer_history"] = [{"criterion_name": "x", "lr_scheduler_state": {"best": 5.0}, "num_updates": 1}]
    torch.save(state, tmp_path / "checkpoint.pt")
    monkeypatch.setattr(finetune, "previous_training_time", lambda checkpoint: 36.0)
    commands = []

    def run(cmd, log):
        commands.append(cmd)
        if "--save-dir" in cmd:
            save_dir = Path(cmd[cmd.index("--save-dir") + 1])
            save_dir.mkdir(parents=True)
            (save_dir / "checkpoint_last.pt").write_text("")
            return "num_updates=100"
        return "BLEU = 30.00 60.0/40.0/30.0/20.0 (BP = 1.000 ratio = 1.000)"

    monkeypatch.setattr(finetune, "run", run)
    finetune.main([str(data), str(tmp_path / "checkpoint.pt"), "--out", str(tmp_path / "out"), "--no-time-matched"])
    assert len(commands) == 5  # the start scored, then each of two runs trained and scored
    for cmd in commands:
        assert (cmd.count("--source-lang"), cmd.count("--target-lang")) == (1, 1), cmd
        assert cmd[cmd.index("--source-lang") + 1] == "en" and cmd[cmd.index("--target-lang") + 1] == "de", cmd


def test_finetunes_counts_must_be_at_least_one(tmp_path, capsys):
    """--max-update 0 trained until stopped (fairseq reads 0 as no limit); --max-tokens or --risk-candidates 0 failed
    in fairseq, after the start had been scored. Each is a usage error now, before anything runs."""
    finetune = _finetune()
    for flag in ("--max-update", "--max-tokens", "--risk-candidates"):
        with pytest.raises(SystemExit) as ended:
            finetune.main([str(tmp_path), str(FINETUNE), "--out", str(tmp_path / "out"), flag, "0"])
        assert ended.value.code == 2
        assert f"error: argument {flag}: must be at least 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _recorded(folder, seed, **flags):
    """A results.json as finetune.py writes it: risk and token runs with their commands."""
    folder.mkdir()
    base = {"data": "/d/data-bin", "--finetune-from-model": "/d/checkpoint_best.pt", "--lr": "0.05", **flags}
    shared = " ".join(f"{k} {v}" for k, v in base.items() if k != "data")
    results = {"scored": {"gen_subset": "test", "max_len_a": 1.2, "max_len_b": 10, "post_process": "none"}}
    results["start"] = {"bleu": "BLEU = 30.00 60.0/40.0/30.0/20.0 (BP = 1.000 ratio = 1.000)"}
    for run, criterion in (("risk", "sequence_risk"), ("token", "label_smoothed_cross_entropy")):
        command = f"fairseq_cli.train {base['data']} {shared} --seed {seed} --criterion {criterion}"
        results[run] = {"bleu": results["start"]["bleu"], "command": f"{command} --save-dir {folder / run}"}
    (folder / "results.json").write_text(json.dumps(results))


def test_summary_refuses_runs_that_differ_in_more_than_the_seed(tmp_path):
    """Folders of another checkpoint, data or learning rate were put side by side as seeds of one experiment, their
    paired difference tested, without a word; now the summary stops, naming each flag that differs (the seed, the
    runs' folders and the time-matched run's length may)."""
    _recorded(tmp_path / "s1", 1)
    _recorded(tmp_path / "s2", 2)
    _recorded(tmp_path / "other", 3, data="/e/data-bin", **{"--lr": "0.1", "--stop-time-hours": "0.01"})
    ok = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "s1"), str(tmp_path / "s2")],
                        capture_output=True, text=True)  # fmt: skip
    assert ok.returncode == 0 and ok.stdout.startswith("| run | s1 | s2 | mean |"), ok.stderr
    folders = [str(tmp_path / name) for name in ("s1", "s2", "other")]
    refused = subprocess.run([sys.executable, str(SCRIPT), *folders], capture_output=True, text=True)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr == (
        f"summarize.py: error: {folders[0]} and {folders[2]} differ in more than --seed (the data folder /d/data-bin "
        "vs /e/data-bin; --lr 0.05 vs 0.1): give the folders of one experiment, its seeds\n"
    )


def test_finetune_records_the_subset_it_scores_and_the_summary_compares_it(tmp_path, monkeypatch):
    """results.json did not record --gen-subset: seeds scored on valid and on test were averaged into one table."""
    finetune = _finetune()
    monkeypatch.setattr(finetune, "language_pair", lambda data: ("de", "en"))
    monkeypatch.setattr(finetune, "checkpoint_settings", lambda checkpoint: (["--arch", "convs2s_iwslt_de_en"], None))
    monkeypatch.setattr(finetune, "previous_training_time", lambda checkpoint: 36.0)
    monkeypatch.setattr(finetune, "bleu", lambda *args: "BLEU = 30.00 60.0/40.0/30.0/20.0")

    def run(cmd, log):
        save_dir = Path(cmd[cmd.index("--save-dir") + 1])
        save_dir.mkdir(parents=True)
        (save_dir / "checkpoint_last.pt").write_text("")
        return "num_updates=100"

    monkeypatch.setattr(finetune, "run", run)
    (tmp_path / "model.pt").write_text("")
    for seed, subset in (("1", "test"), ("2", "valid")):
        out = ["--out", str(tmp_path / f"s{seed}"), "--seed", seed, "--gen-subset", subset, "--post-process", "none"]
        finetune.main([str(tmp_path), str(tmp_path / "model.pt"), *out])
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "s1"), str(tmp_path / "s2")],
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith(
        f"summarize.py: error: {tmp_path / 's1'} and {tmp_path / 's2'} differ in more than --seed (--gen-subset test "
        "vs valid): "
    ), result.stderr
