"""Bad input that tests/test_cli.py does not cover: bytes that are not UTF-8, a checkpoint of another model, a
missing ``--user-dir`` (the plugin loads itself and names the flag), a source cut to the position table on
request, and NaN losses under bf16 / fp16.

Each test runs the real command-line tool and asserts on what the user reads. Where the message is fairseq's or
torch's and a plugin cannot change it, the test pins it down so that the README's description stays true.
"""

import math
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
from cli_helpers import (
    PLUGIN_DIR,
    REPO_ROOT,
    check_ok,
    checkpoint_updates,
    generate,
    hypothesis_lines,
    load_checkpoint,
    make_splits,
    preprocess,
    run_cli,
    run_launcher,
    tail,
    update_records,
)

from fairseq_convs2s.compat.training import MAX_CONSECUTIVE_SKIPS
from fairseq_convs2s.convert_fconv import convert_file
from fairseq_convs2s.models.fconv_checkpoint import ConversionError

POSITIONS = 16
LONG_SOURCES = [5, 25, 40]  # words; the last two do not fit POSITIONS
LSTM_FLAGS = [
    "--arch", "lstm",
    "--encoder-embed-dim", "16", "--encoder-hidden-size", "16",
    "--decoder-embed-dim", "16", "--decoder-hidden-size", "16", "--decoder-out-embed-dim", "16",
    "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "200", "--max-update", "1",
    "--cpu", "--no-epoch-checkpoints", "--disable-validation",
]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A corpus, a convs2s checkpoint with POSITIONS source/target positions (2 updates: these tests need a model,
    not a good one) and a stock-fairseq lstm checkpoint (1 update), both trained on it."""
    folder = tmp_path_factory.mktemp("bad_input")
    make_splits(folder, {"train": 200})
    preprocess(folder, "bin", trainpref="train")
    positions = ["--max-source-positions", str(POSITIONS), "--max-target-positions", str(POSITIONS)]
    check_ok(run_launcher(folder, "bin", "convs2s", "--max-tokens", "200", "--max-update", "2", *positions))
    check_ok(run_cli("train", ["bin", *LSTM_FLAGS, "--save-dir", "lstm"], cwd=folder))
    # a test set of sources of LONG_SOURCES words (short targets), as text: --dataset-impl raw reads
    # raw/test.src-tgt.{src,tgt} next to the dictionaries, no binarizing needed
    sources = [[f"s{(i + j) % 24}" for j in range(n)] for i, n in enumerate(LONG_SOURCES)]
    (folder / "raw").mkdir()
    (folder / "raw/test.src-tgt.src").write_text("".join(" ".join(s) + "\n" for s in sources))
    (folder / "raw/test.src-tgt.tgt").write_text("t1 t2\n" * len(sources))
    for side in ("src", "tgt"):
        (folder / "raw" / f"dict.{side}.txt").write_text((folder / "bin" / f"dict.{side}.txt").read_text())
    return SimpleNamespace(
        folder=folder, convs2s="convs2s/checkpoint_last.pt", lstm="lstm/checkpoint_last.pt", sources=sources
    )


# ---- bytes that are not UTF-8 ----------------------------------------------------------------------------------

BAD_LINE = b"s3 \xff\xfe s4"  # Latin-1 / binary bytes inside an otherwise ordinary line


def _interactive_bytes(trained, data: bytes, encoding: str):
    cmd = [sys.executable, "-m", "fairseq_cli.interactive", "bin", "--user-dir", str(PLUGIN_DIR)]
    cmd += ["--path", trained.convs2s, "--source-lang", "src", "--target-lang", "tgt", "--cpu", "--beam", "2"]
    env = {**os.environ, "PYTHONIOENCODING": encoding}
    proc = subprocess.run(cmd, cwd=trained.folder, input=data, capture_output=True, env=env, timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def test_interactive_non_utf8_stdin_depends_on_the_locale(trained):
    """fairseq-interactive decodes stdin with Python's error handler for the locale. Under the C/POSIX locale
    (Python's ``surrogateescape``) the bad bytes become one unknown word: every line is answered, in order, and
    the session goes on. Under a UTF-8 locale (``strict``) it stops with a UnicodeDecodeError naming the byte,
    before answering any line of the buffer it was reading."""
    lines = b"s1 s2\n" + BAD_LINE + b"\ns5 s6\n"
    lenient = check_ok(_interactive_bytes(trained, lines, "utf-8:surrogateescape"))
    out = hypothesis_lines(lenient.stdout)
    assert [out["S"][i] for i in range(3)] == ["s1 s2", "s3 <unk> s4", "s5 s6"], tail(lenient)
    assert sorted(out["H"]) == [0, 1, 2], tail(lenient)

    strict = _interactive_bytes(trained, lines, "utf-8:strict")
    assert strict.returncode != 0, tail(strict)
    assert "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff" in strict.stderr, tail(strict)
    assert "H-" not in strict.stdout


def test_preprocess_refuses_non_utf8_files_and_the_checker_finds_the_line(trained):
    """fairseq-preprocess stops at the first invalid byte (a UnicodeDecodeError, then fairseq's own follow-on
    "negative seek position" error) and writes no dataset; scripts/check_utf8.py names the file and line."""
    folder = trained.folder
    (folder / "latin.src").write_bytes(b"s1 s2\n" + BAD_LINE + b"\ns5\n")
    (folder / "latin.tgt").write_bytes(b"t2 t1\nt4 t3\nt5\n")
    args = ["--source-lang", "src", "--target-lang", "tgt", "--trainpref", "latin", "--destdir", "bin_latin"]
    proc = run_cli("preprocess", [*args, "--workers", "1"], cwd=folder)
    assert proc.returncode != 0, tail(proc)
    assert "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff" in proc.stderr, tail(proc)
    assert not list((folder / "bin_latin").glob("*.bin"))

    check = [sys.executable, str(REPO_ROOT / "scripts/check_utf8.py"), "latin.src", "latin.tgt", "train.src"]
    result = subprocess.run(check, cwd=folder, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result
    assert result.stdout.splitlines() == ["latin.src:2: invalid UTF-8 at byte 3 of the line: s3 \\xff\\xfe s4"]
    # a missing file or a folder among them is named and the others still checked (a traceback stopped it before)
    (folder / "a_folder").mkdir(exist_ok=True)
    check[2:2] = ["gone.src", "a_folder"]
    result = subprocess.run(check, cwd=folder, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result
    assert result.stdout.splitlines() == [
        "gone.src: cannot be read (No such file or directory)",
        "a_folder: cannot be read (Is a directory)",
        "latin.src:2: invalid UTF-8 at byte 3 of the line: s3 \\xff\\xfe s4",
    ]


# ---- sources longer than the position table, truncated on request -----------------------------------------------


def test_truncate_source_cuts_long_sources_to_the_position_table(trained):
    """With --truncate-source --max-source-positions 16 (the model's table), fairseq-generate keeps the first 15
    words of a longer source (plus EOS) and translates every sentence; --truncate-source alone cuts at the task's
    default of 1024 and the set is refused, naming max_positions."""
    args = ["--dataset-impl", "raw", "--truncate-source", "--beam", "2"]
    # fairseq cuts at the *task's* --max-source-positions (default 1024), not at the model's table: alone,
    # --truncate-source leaves these sources as they are and generate refuses them
    alone = generate(trained.folder, "raw", trained.convs2s, *args, check=False)
    assert alone.returncode != 0 and f"max_positions=({POSITIONS}, {POSITIONS})" in alone.stderr, tail(alone)

    proc = generate(trained.folder, "raw", trained.convs2s, *args, "--max-source-positions", str(POSITIONS))
    out = hypothesis_lines(proc.stdout)
    assert sorted(out["H"]) == [0, 1, 2], tail(proc)
    assert [len(out["S"][i].split()) for i in range(3)] == [5, POSITIONS - 1, POSITIONS - 1]
    assert out["S"][1].split() == trained.sources[1][: POSITIONS - 1]


# ---- a checkpoint of another model -----------------------------------------------------------------------------


def test_another_models_checkpoint(trained, tmp_path):
    """A stock fairseq lstm checkpoint: fairseq-generate with --user-dir fairseq_convs2s builds the model the
    checkpoint names (the plugin only adds models) and translates with it; the fconv converter refuses it with
    its arch named and writes no output file."""
    folder = trained.folder
    proc = generate(folder, "raw", trained.lstm, "--dataset-impl", "raw", "--beam", "2", "--max-len-b", "5")
    assert sorted(hypothesis_lines(proc.stdout)["H"]) == [0, 1, 2], tail(proc)
    assert load_checkpoint(folder / trained.lstm)["cfg"]["model"].arch == "lstm"

    out = tmp_path / "converted.pt"
    with pytest.raises(ConversionError, match="not an fconv translation model: its arch is 'lstm'"):
        convert_file(str(folder / trained.lstm), str(out))
    assert not out.exists()  # the command line prints this message after "convert_fconv: error:", exit code 1


# ---- a missing --user-dir --------------------------------------------------------------------------------------


def test_missing_user_dir_loads_the_plugin_and_names_the_flag(trained):
    """fairseq-generate without --user-dir on a convs2s checkpoint: the installed package's start-up hook
    (``fairseq_convs2s_autoload.pth``) sees the convs2s arch in the checkpoint, loads the plugin and warns naming
    the --user-dir to add; the translations are those of a run with --user-dir. With the hook switched off,
    stock fairseq fails inside torch.load on the argparse.Namespace that every fairseq 0.12 checkpoint holds (the
    plugin allow-lists it), a message that does not say what to add. A checkpoint naming pre-trained embedding
    files that are gone decodes as well without --user-dir."""
    folder = trained.folder
    with_flag = generate(folder, "bin", trained.convs2s, "--gen-subset", "train")
    args = ["bin", "--path", trained.convs2s, "--cpu", "--beam", "5", "--batch-size", "16"]
    args += ["--required-batch-size-multiple", "1", "--gen-subset", "train"]
    without = check_ok(run_cli("generate", args, cwd=folder))
    warning = "is a fairseq-convs2s checkpoint (arch convs2s_iwslt_de_en) but the plugin was not loaded"
    assert warning in without.stderr + without.stdout, tail(without)
    assert f"Add --user-dir {PLUGIN_DIR} to the command" in without.stderr + without.stdout, tail(without)
    assert hypothesis_lines(without.stdout)["H"] == hypothesis_lines(with_flag.stdout)["H"]
    assert len(hypothesis_lines(without.stdout)["H"]) == 200

    cmd = [sys.executable, "-m", "fairseq_cli.generate", *args]
    env = {**os.environ, "FAIRSEQ_CONVS2S_NO_AUTOLOAD": "1"}
    off = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=300, env=env)
    assert off.returncode != 0, tail(off)
    assert "Unsupported global: GLOBAL argparse.Namespace" in off.stderr, tail(off)
    assert "H-" not in off.stdout

    # trained from pre-trained embedding files that are gone: the plugin, imported in the middle of fairseq's
    # load, still builds the model without reading them (the checkpoint's weights are the embeddings)
    state = torch.load(folder / trained.convs2s, map_location="cpu", weights_only=False)
    state["cfg"]["model"].encoder_embed_path = state["cfg"]["model"].decoder_embed_path = str(folder / "gone.txt")
    torch.save(state, folder / "embedded.pt")
    args[args.index(trained.convs2s)] = "embedded.pt"
    gone = check_ok(run_cli("generate", args, cwd=folder))
    assert hypothesis_lines(gone.stdout)["H"] == hypothesis_lines(with_flag.stdout)["H"]


# ---- NaN / inf losses under bf16 and fp16 ----------------------------------------------------------------------

# a test-only plugin: label-smoothed cross-entropy whose loss is multiplied by NaN on chosen training calls
NAN_PLUGIN = """
from dataclasses import dataclass, field

import fairseq_convs2s  # noqa: F401  (the convs2s model)
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)


@dataclass
class NanLossConfig(LabelSmoothedCrossEntropyCriterionConfig):
    nan_calls: str = field(default="", metadata={"help": "1-based training calls whose loss is NaN, or 'all'"})


@register_criterion("nan_loss", dataclass=NanLossConfig)
class NanLoss(LabelSmoothedCrossEntropyCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False,
                 nan_calls=""):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        self.nan_calls, self.calls = nan_calls, 0

    def forward(self, model, sample, reduce=True):
        loss, sample_size, logging_output = super().forward(model, sample, reduce)
        if model.training:
            self.calls += 1
            if self.nan_calls == "all" or str(self.calls) in self.nan_calls.split(","):
                loss = loss * float("nan")
        return loss, sample_size, logging_output
"""


@pytest.fixture(scope="module")
def nan_plugin(tmp_path_factory):
    path = tmp_path_factory.mktemp("plugins") / "nan_loss_plugin"
    path.mkdir()
    (path / "__init__.py").write_text(textwrap.dedent(NAN_PLUGIN))
    return path


def _nan_run(trained, nan_plugin, save_dir, precision, calls, updates=4):
    flags = ["--criterion", "nan_loss", "--nan-calls", calls, f"--{precision}", "--max-tokens", "200"]
    flags += ["--max-update", str(updates)]
    return run_launcher(trained.folder, "bin", save_dir, *flags, user_dir=nan_plugin)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_nan_loss_is_skipped_and_logged_not_saved(trained, nan_plugin, precision):
    """A NaN loss on the 2nd batch under --bf16 (and --fp16 on a CPU; stock fairseq cannot train either on a CPU):
    the launcher logs a warning naming the update, skips that batch and goes on; the run makes its 4 updates on
    other batches, the next update's gradient norm is an ordinary one (not scaled by the skipped batch's
    leftovers, which made every later update NaN before the launcher reset them), and the saved parameters are
    finite."""
    proc = check_ok(_nan_run(trained, nan_plugin, f"nan_{precision}", precision, "2"))
    log = proc.stdout + proc.stderr
    warnings = [line for line in log.splitlines() if "non-finite gradients" in line]
    assert len(warnings) == 1 and "at update 2:" in warnings[0] and "skipped this batch" in warnings[0], tail(proc)
    records = update_records(log)
    assert [int(r["num_updates"]) for r in records] == [1, 2, 3, 4], tail(proc)
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["gnorm"]) for r in records), records
    assert 0.2 < records[1]["gnorm"] / records[0]["gnorm"] < 5, records

    state = load_checkpoint(trained.folder / f"nan_{precision}/checkpoint_last.pt")
    assert checkpoint_updates(state) == 4
    assert all(torch.isfinite(t).all() for t in state["model"].values())  # fairseq saves them as float32
    assert f"'{precision}': True" in log and "'tpu': False" in log, tail(proc)  # on the CPU, not a TPU
    assert not (trained.folder / f"nan_{precision}/crash.pt").exists()


def test_nan_loss_on_every_batch_stops_training_without_saving(trained, nan_plugin):
    """A run whose every batch is NaN under --bf16 stops after MAX_CONSECUTIVE_SKIPS skipped updates with a
    FloatingPointError that says so, and no checkpoint it wrote holds an update."""
    proc = _nan_run(trained, nan_plugin, "nan_all", "bf16", "all", updates=100)
    assert proc.returncode != 0, tail(proc)
    assert f"FloatingPointError: {MAX_CONSECUTIVE_SKIPS} updates in a row had non-finite gradients" in proc.stdout + (
        proc.stderr
    ), tail(proc)
    # the epoch (9 batches) ended before the 10th skip: fairseq saved its end-of-epoch checkpoint, with 0 updates
    # and the initial, finite parameters; nothing with NaN was saved
    saved = [load_checkpoint(path) for path in (trained.folder / "nan_all").glob("*.pt")]
    assert all(checkpoint_updates(state) == 0 for state in saved)
    assert all(torch.isfinite(t.float()).all() for state in saved for t in state["model"].values())
