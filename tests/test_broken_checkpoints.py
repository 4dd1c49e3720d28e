"""A checkpoint that cannot be loaded is named in one line: which file, its size, and what is wrong with it
(``fairseq_convs2s.compat.broken_checkpoints``), wherever the plugin is loaded: fairseq-generate,
fairseq-interactive, fairseq-validate, fairseq-train --restore-file and its automatic resume (which also says
which other checkpoints in the folder load), and the fconv converter. Nothing is deleted or overwritten.

fairseq alone (``inspect.unwrap`` of its loader) fails deep in torch or in its own upgrade code: ``OSError: [Errno
22] Invalid argument``, ``PytorchStreamReader failed reading zip archive``, ``EOFError``, ``KeyError: 101``,
``KeyError: 'best_loss'``.
"""

import inspect
import shutil
from types import SimpleNamespace

import pytest
import torch
from cli_helpers import (
    PLUGIN_DIR,
    check_ok,
    make_splits,
    preprocess,
    run_cli,
    tail,
    train_args,
)
from fairseq import checkpoint_utils

from fairseq_convs2s.compat.broken_checkpoints import BrokenCheckpoint
from fairseq_convs2s.convert_fconv import convert_file
from fairseq_convs2s.models.fconv_checkpoint import ConversionError

TRAIN = ["--max-tokens", "200", "--max-update", "4", "--save-interval-updates", "2", "--disable-validation"]


def _size(n: int) -> str:
    return f"{n:,} bytes" if n < 10**6 else f"{n:,} bytes, {n / 2**20:.1f} MiB"


TRUNCATED = "is truncated: the zip archive torch saves has no end (a copy cut short, a full disk?); it cannot be loaded"


def make_broken(folder, good):
    """Broken copies of the checkpoint ``good`` in ``folder``, with what the plugin says of each."""
    data = good.read_bytes()
    files = {
        "half.pt": (data[: len(data) // 2], TRUNCATED),
        "cut.pt": (data[:-10], TRUNCATED),
        "empty.pt": (b"", "is empty (0 bytes): not a checkpoint (a save or a copy that wrote nothing?)"),
        "text.pt": (
            b"model weights go here\nand more\n",
            "is not a torch checkpoint: it begins with 'model weights go here'",
        ),
    }
    expected = {}
    for name, (content, what) in files.items():
        (folder / name).write_bytes(content)
        size = "" if not content else f" ({_size(len(content))})"
        expected[name] = f"{folder / name}{size} {what}" if content else f"{folder / name} {what}"
    torch.save({"weights": torch.ones(3)}, folder / "dict.pt")
    expected["dict.pt"] = (
        f"{folder / 'dict.pt'} ({_size((folder / 'dict.pt').stat().st_size)}) is a torch file but not a fairseq "
        "checkpoint: it holds a dict of 'weights' and no 'model'"
    )
    torch.save(torch.ones(3), folder / "tensor.pt")
    expected["tensor.pt"] = (
        f"{folder / 'tensor.pt'} ({_size((folder / 'tensor.pt').stat().st_size)}) is a torch file but not a fairseq "
        "checkpoint: it holds a Tensor, not a dict with a 'model'"
    )
    return expected


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """4 updates of the small model, saved every 2 (checkpoint_1_2.pt, checkpoint_1_4.pt, checkpoint_last.pt), and
    broken files beside a copy of it in ``broken/``."""
    folder = tmp_path_factory.mktemp("broken_checkpoints")
    make_splits(folder, {"train": 100, "valid": 10})
    preprocess(folder, "bin", trainpref="train", validpref="valid")
    check_ok(run_cli("train", train_args("bin", "ckpt", *TRAIN), cwd=folder, timeout=600))
    (folder / "broken").mkdir()
    expected = make_broken(folder / "broken", folder / "ckpt/checkpoint_last.pt")
    return SimpleNamespace(folder=folder, expected=expected)


def _listing(folder):
    """Every file under ``folder`` with its bytes: what must not change."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_each_kind_of_broken_checkpoint_is_named_in_one_line(trained):
    """fairseq's loader, as every fairseq command calls it: a one-line error for each broken file (where fairseq
    alone gives torch's or its own words, naming neither file nor problem), the files left as they were."""
    folder = trained.folder / "broken"
    before = _listing(folder)
    stock = inspect.unwrap(checkpoint_utils.load_checkpoint_to_cpu)
    for name, message in trained.expected.items():
        with pytest.raises(BrokenCheckpoint) as raised:
            checkpoint_utils.load_checkpoint_to_cpu(str(folder / name))
        assert str(raised.value) == message and "\n" not in message
        with pytest.raises(Exception) as alone:  # noqa: B017  (torch's and fairseq's errors vary by file)
            stock(str(folder / name))
        assert str(folder / name) not in str(alone.value), (name, alone.value)
    assert _listing(folder) == before
    # a whole checkpoint loads as before
    state = checkpoint_utils.load_checkpoint_to_cpu(str(trained.folder / "ckpt/checkpoint_last.pt"))
    assert state["optimizer_history"][-1]["num_updates"] == 4


def _error_line(proc) -> str:
    """The plugin's error of a failed fairseq command (``python -m fairseq_cli.TOOL``): one line, ``fairseq-TOOL:
    error: MESSAGE``, exit 1, and no traceback (fairseq alone: a traceback ending in ``BrokenCheckpoint:`` or
    ``ValueError:`` and the message); returns the message."""
    prefix = f"fairseq-{proc.args[2].split('.')[-1]}: error: "
    lines = [line for line in proc.stderr.splitlines() if line.startswith(prefix)]
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr, tail(proc)
    return lines[0][len(prefix) :]


@pytest.mark.parametrize(
    "tool, name",
    [("generate", "half.pt"), ("interactive", "empty.pt"), ("validate", "text.pt"), ("generate", "dict.pt")],
)
def test_decoding_tools_name_the_broken_file(trained, tool, name):
    """fairseq-generate, fairseq-interactive and fairseq-validate given a broken --path: exit 1 with the one-line
    error, nothing translated."""
    path = trained.folder / "broken" / name
    args = ["bin", "--user-dir", PLUGIN_DIR, "--path", path, "--cpu"]
    args += {
        "generate": ["--gen-subset", "valid"],
        "interactive": [],
        "validate": ["--task", "translation", "--batch-size", "16"],
    }[tool]
    proc = run_cli(tool, args, cwd=trained.folder, stdin="s1 s2\n")
    assert proc.returncode != 0, tail(proc)
    assert _error_line(proc) == trained.expected[name]
    assert "H-" not in proc.stdout


def test_a_broken_restore_file_is_named(trained):
    """fairseq-train --restore-file of a truncated file: the one-line error, and the checkpoints beside it that
    load (none here: its folder holds only broken files), before any update."""
    args = train_args("bin", "restored", *TRAIN, "--restore-file", str(trained.folder / "broken/cut.pt"))
    proc = run_cli("train", args, cwd=trained.folder)
    assert proc.returncode != 0, tail(proc)
    line = _error_line(proc)
    assert line == trained.expected["cut.pt"] + f"; no other checkpoint in {trained.folder / 'broken'} loads"
    assert "num_updates" not in proc.stdout + proc.stderr


def test_training_on_from_a_checkpoint_of_other_dictionaries_is_refused(trained):
    """--restore-file of a checkpoint trained on other dictionaries: one of the same size in another order trained
    on silently, the embeddings meaning other words; one of another size ended in fairseq's "please ensure that the
    architectures match", the plugin's words in mid-traceback (so too for a checkpoint that records no
    dictionary, as those written before the record)."""
    folder = trained.folder
    checkpoint = str(folder / "ckpt/checkpoint_last.pt")
    state = torch.load(checkpoint, weights_only=False)
    del state["cfg"]["model"].source_dictionary_fingerprint, state["cfg"]["model"].target_dictionary_fingerprint
    torch.save(state, folder / "unrecorded.pt")
    size = len((folder / "bin/dict.src.txt").read_text().splitlines()) + 4  # (and fairseq's 4 special symbols)
    cases = [
        ("reordered", reversed, checkpoint, f"has the {size} entries of the checkpoint's source dictionary but not"),
        ("bigger", lambda lines: [*lines, *(f"extra{i} 1" for i in range(9))], checkpoint, f"has {size + 9}: use"),
        ("bigger", None, str(folder / "unrecorded.pt"), f"has {size + 9}: use"),
    ]
    for data, change, restored, message in cases:
        if change is not None:
            shutil.copytree(folder / "bin", folder / data)
            words = (folder / data / "dict.src.txt").read_text().splitlines()
            (folder / data / "dict.src.txt").write_text("".join(line + "\n" for line in change(words)))
        args = train_args(data, f"run_{data}", *TRAIN, "--restore-file", restored)
        proc = run_cli("train", args, cwd=folder)
        assert proc.returncode != 0, tail(proc)
        line = _error_line(proc)
        assert line.startswith(f"{restored}: dictionary mismatch: ") and message in line, line
        assert "num_updates" not in proc.stdout + proc.stderr


def test_a_restore_file_that_is_not_there_is_named_not_trained_over(trained):
    """fairseq-train --restore-file of a misspelt path logged 'No existing checkpoint found', trained anew and
    overwrote the checkpoints in --save-dir (checkpoint_best.pt of a longer run among them)."""
    folder = trained.folder
    shutil.copytree(folder / "ckpt", folder / "kept")
    before = _listing(folder / "kept")
    args = train_args("bin", "kept", *TRAIN, "--restore-file", str(folder / "kept/checkpoint_lats.pt"))
    proc = run_cli("train", args, cwd=folder)
    assert proc.returncode != 0, tail(proc)
    assert _error_line(proc) == (
        f"--restore-file {folder / 'kept/checkpoint_lats.pt'}: no such file (training would start anew and "
        "overwrite the checkpoints in kept); leave the flag out to train anew"
    )
    assert "num_updates" not in proc.stdout + proc.stderr and _listing(folder / "kept") == before


def test_a_checkpoint_of_another_criterion_asks_for_reset_optimizer(trained, tmp_path):
    """fairseq-train --restore-file of a checkpoint trained with another --criterion (fairseq's label smoothing,
    then the plugin's fused one; a sequence-risk fine-tuning the same): fairseq's AssertionError, now one line saying
    which flag trains on; with it, training goes on from the weights."""
    restored = str(trained.folder / "ckpt/checkpoint_last.pt")
    fused = ["--criterion", "fused_label_smoothed_cross_entropy"]
    args = train_args("bin", str(tmp_path / "run"), *TRAIN, "--restore-file", restored, *fused)
    proc = run_cli("train", args, cwd=trained.folder)
    assert _error_line(proc) == (
        f"{restored} holds the optimizer state of criterion LabelSmoothedCrossEntropyCriterion, and this command "
        "trains with FusedLabelSmoothedCrossEntropyCriterion: add --reset-optimizer to train on from its weights "
        "alone (the update count and the learning rate start again)"
    )
    check_ok(run_cli("train", [*args, "--reset-optimizer", "--max-update", "1"], cwd=trained.folder))


def test_a_broken_checkpoint_last_on_resume_names_those_that_load(trained):
    """fairseq-train restarted on a folder whose checkpoint_last.pt was cut short (a copy interrupted): the error
    names it and says which checkpoints there load, the most updates first, and the --restore-file to resume from;
    nothing in the folder is changed; resuming from the one named works."""
    folder = trained.folder
    shutil.copytree(folder / "ckpt", folder / "resume")
    last = folder / "resume/checkpoint_last.pt"
    last.write_bytes(last.read_bytes()[:1000])
    before = _listing(folder / "resume")
    proc = run_cli("train", train_args("bin", "resume", *TRAIN, "--max-update", "6"), cwd=folder)
    assert proc.returncode != 0, tail(proc)
    most = folder / "resume/checkpoint_1_4.pt"
    assert _error_line(proc) == (
        f"resume/checkpoint_last.pt ({_size(1000)}) {TRUNCATED}; other checkpoints in {folder / 'resume'} that "
        f"load, most updates first: checkpoint_1_4.pt, checkpoint_1_2.pt (resume with --restore-file {most})"
    )
    assert _listing(folder / "resume") == before

    args = train_args("bin", "resume", *TRAIN, "--max-update", "6", "--restore-file", str(most))
    resumed = check_ok(run_cli("train", args, cwd=folder))
    assert "(epoch 1 @ 4 updates)" in resumed.stdout + resumed.stderr, tail(resumed)


def test_a_flag_given_alike_is_not_named_as_differing():
    """--decoder-attention True over three decoder layers means something else than over two, but the message
    listed "--decoder-attention True there, True here" beside the layers that differ."""
    from argparse import Namespace

    from fairseq_convs2s.models.presets import convs2s_iwslt_de_en
    from fairseq_convs2s.models.structure import difference, structure_of

    theirs, ours = Namespace(arch="convs2s_iwslt_de_en"), Namespace(decoder_layers="[(256, 3)] * 4")
    for args in (theirs, ours):
        convs2s_iwslt_de_en(args)
    found = difference(structure_of(ours), {"model": {}, "cfg": {"model": theirs}})
    assert "(--decoder-layers [(256, 3)] * 3 there, [(256, 3)] * 4 here)" in found


def test_training_on_from_another_model_names_the_flags(trained, tmp_path):
    """fairseq-train --restore-file (or --finetune-from-model, or its resume) of a checkpoint of another model than
    the command builds: one line naming each flag that differs with both values, before any update. Where the
    shapes differed fairseq listed missing keys and asked to "ensure that the architectures match"; where they
    agree (another residual lookback, --attention-scaling) it trained on silently; an fconv checkpoint gave
    unexpected keys. The same model spelled otherwise, with another dropout, trains on."""
    folder, checkpoint = trained.folder, str(trained.folder / "ckpt/checkpoint_last.pt")
    fconv = train_args("bin", str(tmp_path / "fconv"), *TRAIN, "--max-update", "1", "--arch", "fconv_iwslt_de_en")
    check_ok(run_cli("train", fconv, cwd=folder))
    listed = "; ".join
    cases = [
        (["--encoder-layers", "[(64, 3)] * 3"], checkpoint, "--encoder-layers [(64, 3)] * 2 there, [(64, 3)] * 3 here"),
        (["--decoder-layers", "[(64, 3, 0)] * 2", "--attention-scaling", "paper"], checkpoint, listed([
            "--decoder-layers [(64, 3)] * 2 there, [(64, 3, 0)] * 2 here", "--attention-scaling fconv there, paper here"
        ])),
    ]  # fmt: skip
    for flags, restored, differing in cases:
        args = train_args("bin", str(tmp_path / "run"), *TRAIN, "--max-update", "6", "--restore-file", restored)
        proc = run_cli("train", [*args, *flags], cwd=folder)
        assert proc.returncode != 0, tail(proc)
        assert _error_line(proc) == (
            f"{restored}: its model is not the one this command builds ({differing}): give the checkpoint's values, "
            "or train anew in another --save-dir"
        )
        assert "num_updates" not in proc.stdout + proc.stderr
    args = train_args(
        "bin", str(tmp_path / "run"), *TRAIN, "--finetune-from-model", str(tmp_path / "fconv/checkpoint_last.pt")
    )
    proc = run_cli("train", args, cwd=folder)
    assert proc.returncode != 0 and _error_line(proc) == (
        f"{tmp_path / 'fconv/checkpoint_last.pt'}: an fconv checkpoint (--arch fconv_iwslt_de_en): convert it "
        "first, python -m fairseq_convs2s.convert_fconv CHECKPOINT OUT.pt, and train from OUT.pt"
    )
    flags = ["--restore-file", checkpoint, "--encoder-layers", "[(64,3)]*2", "--dropout", "0.1"]
    resumed = check_ok(
        run_cli("train", train_args("bin", str(tmp_path / "run"), *TRAIN, "--max-update", "6", *flags), cwd=folder)
    )
    assert "(epoch 1 @ 4 updates)" in resumed.stdout + resumed.stderr, tail(resumed)


def test_the_converter_names_a_broken_input(trained, tmp_path):
    """``python -m fairseq_convs2s.convert_fconv`` (``convert_file``): the same one-line description, as its
    error, and no output file."""
    out = tmp_path / "out.pt"
    for name in ("half.pt", "empty.pt", "text.pt", "tensor.pt"):
        with pytest.raises(ConversionError) as raised:
            convert_file(str(trained.folder / "broken" / name), str(out))
        assert str(raised.value) == trained.expected[name]
        assert not out.exists()
