"""The task recipes (examples/<task>/run.py), every stage run offline on a tiny generated corpus.

Each recipe runs end to end as a user runs it, as a subprocess: its data from local files (``--raw-dir``) or from
fake archives laid out like the real downloads and fetched through ``--mirror file://...``; sentencepiece;
fairseq-preprocess; fairseq-train of a tiny model (the recipe's preset, shrunk by flags) for two epochs; checkpoint
averaging; fairseq-generate with beam 5; scoring. The helpers of examples/recipes are also tested directly.
"""

import gzip
import io
import json
import os
import pickle
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
from cli_helpers import REPO_ROOT, random_sentence, translate

sys.path.insert(0, str(REPO_ROOT / "examples"))

from recipes import commands, model_stages, pipeline, scoring, text  # noqa: E402
from recipes.average_checkpoints import average_checkpoints, last_epoch_checkpoints  # noqa: E402
from recipes.average_checkpoints import main as average_main  # noqa: E402
from recipes.download import extract, sgm_segments, split_train_valid  # noqa: E402
from recipes.settings import RunSettings, SettingsChanged  # noqa: E402

SIZES = {"train": 300, "valid": 20, "test": 20}
TINY = [
    "--encoder-layers", "[(32, 3)] * 2", "--decoder-layers", "[(32, 3)] * 2",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--decoder-out-embed-dim", "32",
    "--max-epoch", "2", "--max-tokens", "2000", "--num-workers", "0", "--log-interval", "1000",
    # keep valid sets of fewer than 8 pairs (WMT's every-100th split of 300 pairs has 3); fairseq drops them else
    "--required-batch-size-multiple", "1",
]  # fmt: skip
# room for DUC's minimum length of 14 pieces, and a cap on an untrained model's output
GENERATE = ["--max-len-a", "1", "--max-len-b", "20", "--num-workers", "0"]
SIGNATURE = re.compile(r"sacrebleu signature: nrefs:1\|case:mixed\|eff:no\|tok:13a\|smooth:exp\|version:[\d.]+")
BLEU_LINE = re.compile(r"^BLEU = ([\d.]+) ", re.MULTILINE)
ROUGE_LINE = re.compile(r"ROUGE-1 = ([\d.]+)  ROUGE-2 = ([\d.]+)  ROUGE-L = ([\d.]+)")


@pytest.fixture(scope="module")
def corpus():
    """The shared tiny corpus: {split: [(source sentence, target sentence)]}, "s<i>" words to reversed "t<i>"."""
    import random

    rng = random.Random(3)
    pairs = {}
    for split, n in SIZES.items():
        sources = [random_sentence(rng) for _ in range(n)]
        pairs[split] = [(" ".join(s), " ".join(translate(s))) for s in sources]
    return pairs


def write(path: Path, lines, compress: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    if compress:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data)
    path.write_bytes(data)


def make_tar(path: Path, files: dict) -> None:
    """An archive holding ``files`` ({name inside: text}), gzipped when its name ends in .tgz/.tar.gz."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "w" if path.name.endswith(".tar") else "w:gz"
    with tarfile.open(path, mode) as tar:
        for name, content in files.items():
            data = content.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def run_example(task: str, *args: str, timeout: int) -> subprocess.CompletedProcess:
    """``examples/<task>/run.py ARGS`` run to its end, as a user runs it; its output captured."""
    cmd = [sys.executable, str(REPO_ROOT / "examples" / task / "run.py"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


class RecipeRun:
    """One recipe's command, started in the background; :meth:`result` waits for it and checks it succeeded."""

    def __init__(self, task: str, out: Path, *args: str):
        self.task, self.out = task, out
        out.mkdir(parents=True)
        self.cmd = [
            sys.executable, str(REPO_ROOT / "examples" / task / "run.py"), "--out", str(out), "--vocab-size", "40",
            "--workers", "1", "--average-last", "2",
            "--train-args", shlex.join(TINY), "--generate-args", shlex.join(GENERATE), *args,
        ]  # fmt: skip
        self.log = out / "console.txt"
        with open(self.log, "w") as log:
            # one thread each: the four runs share the machine's cores instead of fighting over them
            env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, cwd=out, env=env)

    def result(self) -> str:
        """The run's console output, once it has finished with exit code 0."""
        try:
            self.proc.wait(timeout=900)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        output = self.log.read_text()
        assert self.proc.returncode == 0, f"{self.task} failed (exit {self.proc.returncode}):\n{output[-6000:]}"
        return output

    def copied_to(self, out: Path) -> list:
        """The finished run's folder copied to ``out``, and this run's command with ``--out`` there."""
        self.result()
        shutil.copytree(self.out, out)
        cmd = list(self.cmd)
        cmd[cmd.index("--out") + 1] = str(out)
        return cmd


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    """The four recipes on the shared corpus, started together (most of their time is single-threaded start-up
    of fairseq's tools, so two cores run them in about half the time one after the other would take)."""
    root = tmp_path_factory.mktemp("recipes")
    started = {
        "multi30k": start_multi30k(root / "multi30k", corpus),
        "wmt14_en_de": start_wmt14_en_de(root / "wmt14_en_de", corpus),
        "wmt14_en_fr": start_wmt14_en_fr(root / "wmt14_en_fr", corpus),
        "gigaword": start_gigaword(root / "gigaword", corpus),
    }
    yield started
    for run in started.values():
        if run.proc.poll() is None:
            run.proc.kill()


def lines(path: Path):
    return path.read_text(encoding="utf-8").splitlines()


def check_common_stages(out: Path, src: str, tgt: str, n_test: int, tag: str = "test.auto") -> None:
    """The outputs every recipe leaves, stage by stage."""
    for split in ("train", "valid", "test"):
        for lang in (src, tgt):
            assert (out / "raw" / f"{split}.{lang}").exists()
    assert len(lines(out / "raw" / f"test.{tgt}")) == n_test
    assert (out / "spm" / "spm.model").exists() and len(lines(out / "spm" / f"train.{src}")) > 0
    assert (out / "data-bin" / f"dict.{tgt}.txt").exists()
    assert (out / "data-bin" / f"train.{src}-{tgt}.{src}.bin").exists()
    ckpt = out / "checkpoints"
    assert list(ckpt.glob("checkpoint[0-9]*.pt"))  # epoch checkpoints (the last --average-last of them)
    # the model tested: the average of the last checkpoints or the best one, and why (stage 5)
    chosen, reason = (ckpt / "chosen.txt").read_text().strip().split("\t")
    assert (ckpt / chosen).exists() and reason.startswith(chosen + " (")
    # the validation curve, one row per epoch validated
    assert lines(out / "curve.tsv")[0].startswith("minutes\tepoch") and len(lines(out / "curve.tsv")) > 1
    assert (out / "curve.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "D-0\t" in (out / f"generate-{tag}.txt").read_text()
    assert len(lines(out / f"{tag}.hyp")) == n_test  # no test sentence dropped


# ---- multi30k: local files -----------------------------------------------------------------------------------


def multi30k_files(folder: Path, corpus, skip=(), short=()) -> Path:
    """Multi30k's six raw files of the shared corpus in ``folder`` (train gzipped, as on GitHub), without those
    named in ``skip`` and one line short in those named in ``short`` (names such as ``"val.en"``)."""
    for split, prefix in (("train", "train"), ("valid", "val"), ("test", "test_2016_flickr")):
        for side, lang in enumerate(("en", "de")):
            name = f"{prefix}.{lang}"
            if name not in skip:
                sentences = [pair[side] for pair in corpus[split]]
                write(folder / name, sentences[:-1] if name in short else sentences, compress=split == "train")
    return folder


def start_multi30k(root: Path, corpus) -> RecipeRun:
    raw = multi30k_files(root / "raw-files", corpus)
    # four epochs: the last quarter of training (epochs 3 and 4) is averaged
    train_args = shlex.join([*TINY, "--max-epoch", "4"])
    return RecipeRun("multi30k", root / "out", "--raw-dir", str(raw), "--train-args", train_args)


def test_multi30k_local_files(runs, corpus):
    """Multi30k's own file names (val, test_2016_flickr; gzipped as on GitHub), the fastest training flags,
    averaging the end of training, the choice by validation loss, BLEU, stage skipping."""
    run = runs["multi30k"]
    output = run.result()
    out = run.out
    check_common_stages(out, "en", "de", SIZES["test"])
    assert lines(out / "raw" / "train.en")[0] == corpus["train"][0][0]  # read from the .gz
    # on a CPU training goes through the plugin's entry to fairseq-train, which keeps freed memory
    entry = "fairseq_cli" if torch.cuda.is_available() else "fairseq_convs2s"
    assert re.search(rf"^\$ \S+ -m {entry}\.train ", output, re.M), output[:3000]
    criterion = "label_smoothed_cross_entropy" if torch.cuda.is_available() else "fused_label_smoothed_cross_entropy"
    assert f"   criterion: {criterion} (" in output and "   precision: " in output
    # the recipe's defaults without a budget: its update budget on the budget schedule, one embedding table
    assert "   length: 5000 updates (the recipe's default" in output
    assert "   embeddings: one table for both languages and the output" in output
    assert re.search(r"^\$ .* --lr-scheduler budget .*--max-update 5000 .*--share-all-embeddings ", output, re.M)

    # the averaged model is the element-wise mean of the last quarter's epochs, 3 and 4
    assert "   checkpoint3.pt, checkpoint4.pt\n" in output
    avg = torch.load(out / "checkpoints" / "checkpoint_avg.pt", weights_only=False)["model"]
    one, two = (torch.load(out / "checkpoints" / f"checkpoint{e}.pt", weights_only=False)["model"] for e in (3, 4))
    for key, value in avg.items():
        if value.is_floating_point():
            torch.testing.assert_close(value, (one[key] + two[key]) / 2)
    assert any(not torch.equal(one[k], two[k]) for k in one)  # training moved the weights: a real average
    assert torch.equal(avg["encoder.embed_tokens.weight"], avg["decoder.output_projection.weight"])  # one table

    # the score is sacrebleu's on the untokenized references, with its signature
    report = (out / "score-test.auto.txt").read_text()
    assert SIGNATURE.search(report), report
    expected = scoring.bleu(lines(out / "test.auto.hyp"), [[t for _, t in corpus["test"]]])
    assert report.strip() == expected
    # ... and tested only if fairseq-validate scores it below checkpoint_best.pt
    chosen, reason = (out / "checkpoints" / "chosen.txt").read_text().strip().split("\t")
    losses = [
        float(x) for x in re.findall(r"validation loss ([0-9.]+) for the average of .*; ([0-9.]+) for", reason)[0]
    ]
    assert chosen == ("checkpoint_avg.pt" if losses[0] < losses[1] else "checkpoint_best.pt"), reason
    assert f"   testing {reason}\n" in output
    assert "== results" in output and f"test ({chosen}): BLEU = " in output

    # a second run finds every stage done and runs nothing
    again = subprocess.run(run.cmd, capture_output=True, text=True, timeout=120, cwd=out)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("already done") == 7, again.stdout
    assert "\n$ " not in again.stdout
    assert report.strip() in again.stdout


def test_a_second_command_into_the_same_out_never_reports_the_firsts_results(runs, tmp_path):
    """Another --vocab-size, direction or model into a finished run's --out is refused in one line, naming the
    setting and both values, before anything runs (it skipped the stages those settings decide and printed the
    first model's score as the second's); another --generate-args generates and scores again, and says why."""
    out = tmp_path / "out"
    cmd = runs["multi30k"].copied_to(out)
    score = (out / "score-test.auto.txt").read_text()
    trained_with = [*TINY, "--max-epoch", "4"]
    for args, message in [
        (["--vocab-size", "41"], "--vocab-size 40, this command 41): give this command its own --out, or delete spm/"),
        (["--source-lang", "de"], '--source-lang/--target-lang "en-de", this command "de-en"'),
        (
            ["--train-args", shlex.join([*trained_with, "--seed", "2"])],
            "or only checkpoints/train.done there to train on",
        ),
        (["--train-args", shlex.join([*trained_with, "--arch", "fconv_iwslt_de_en"])], "to train anew\n"),
    ]:
        proc = subprocess.run(cmd + args, capture_output=True, text=True, timeout=120, cwd=out)
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert proc.stderr.startswith("run.py: error: ") and message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and "\n$ " not in proc.stdout  # nothing ran
        assert (out / "score-test.auto.txt").read_text() == score
    assert "train on" not in proc.stderr  # (another model cannot go on from this one's checkpoint)

    other = ["--generate-args", shlex.join([*GENERATE, "--lenpen", "1.5"])]
    proc = subprocess.run(cmd + other, capture_output=True, text=True, timeout=300, cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"--generate-args {json.dumps(shlex.join(GENERATE))}, this command " in proc.stdout
    assert ": generating again\n" in proc.stdout
    commands = re.findall(r"^\$ .*", proc.stdout, re.M)
    assert len(commands) == 1 and "fairseq_cli.generate" in commands[0] and "--lenpen 1.5" in commands[0]
    again = subprocess.run(cmd + other, capture_output=True, text=True, timeout=120, cwd=out)
    assert again.returncode == 0 and again.stdout.count("already done") == 7, again.stdout

    # a training told to go on (train.done deleted) resumes from checkpoint_last.pt: the same model only
    (out / "checkpoints" / "train.done").unlink()
    fconv = ["--train-args", shlex.join([*trained_with, "--arch", "fconv_iwslt_de_en"])]
    proc = subprocess.run(cmd + fconv, capture_output=True, text=True, timeout=120, cwd=out)
    assert proc.returncode == 1 and proc.stderr.endswith(f"delete checkpoints/ in {out} to train anew\n"), proc.stderr
    assert "\n$ " not in proc.stdout

    # as it says: checkpoints/ deleted, the other model trains anew, with a log of its own (it was appended to the
    # first model's, whose curve compare.py then reported); with --nbest 2 the best hypothesis of each is scored
    first_log = (out / "train.log").read_text()
    shutil.rmtree(out / "checkpoints")
    nbest = ["--generate-args", shlex.join([*GENERATE, "--nbest", "2"])]
    proc = subprocess.run(cmd + fconv + nbest, capture_output=True, text=True, timeout=600, cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the earlier training's log kept as train.1.log" in proc.stdout
    assert (out / "train.1.log").read_text() == first_log and "FConvModel" not in first_log
    assert "FConvModel" in (out / "train.log").read_text() and "ConvS2SModel" not in (out / "train.log").read_text()
    best = {}
    for line in (out / "generate-test.auto.txt").read_text().splitlines():
        if line.startswith("D-"):
            best.setdefault(int(line.split("\t")[0][2:]), line.split("\t")[2])
    assert lines(out / "test.auto.hyp") == [best[i] for i in range(len(best))]


def test_only_one_test_sets_translations_are_scored(tmp_path):
    """The hypotheses scored are the best of each test sentence's, all of them: fairseq-generate's output with
    --nbest 2 gave the second best, with --quiet an empty file marked done, with --gen-subset valid another set's
    translations scored against the test references, and a sentence left out for its length 'hypotheses are
    missing for some sentences'."""
    log, hyp = tmp_path / "generate.txt", tmp_path / "test.hyp"
    log.write_text("S-1\tb\nD-1\t-0.1\tbest of 1\nD-1\t-0.5\tsecond of 1\nD-0\t-0.2\tbest of 0\nD-0\t-0.9\tx\n")
    model_stages.write_hypotheses(log, hyp, 2)
    assert lines(hyp) == ["best of 0", "best of 1"]
    for written, sentences, message in [
        ("S-0\ta\n", 2, "holds no D- lines to score (a flag in --generate-args such as --quiet"),
        ("D-0\t-1\ta\nD-1\t-1\tb\nD-2\t-1\tc\n", 2, "translates sentence 2 and the test set has 2 (another"),
        ("D-0\t-1\ta\nD-2\t-1\tc\n", 3, "no hypothesis for 1 of the 3 test sentences (ids 1); --skip-invalid-size"),
    ]:  # fmt: skip
        log.write_text(written)
        with pytest.raises(text.DataError, match=re.escape(message)):
            model_stages.write_hypotheses(log, tmp_path / "not.hyp", sentences)
        assert not (tmp_path / "not.hyp").exists()


def test_settings_are_compared_only_where_their_output_is_kept(tmp_path):
    """A stage's output that was deleted, or a folder it left empty, is made anew (its record no obstacle); an
    unreadable record is named."""
    made = tmp_path / "spm"
    made.mkdir()
    RunSettings(tmp_path).record("sentencepiece", {"vocab_size": 8000, "max_train_lines": None})
    RunSettings(tmp_path).refuse_changed("sentencepiece", {"vocab_size": 4000, "max_train_lines": None}, made, "")
    (made / "spm.model").write_bytes(b"model")
    settings = RunSettings(tmp_path)
    settings.record("sentencepiece", {"vocab_size": 8000, "max_train_lines": None})
    with pytest.raises(SettingsChanged, match=r"--vocab-size 8000, this command 4000\): give this command its own"):
        RunSettings(tmp_path).refuse_changed("sentencepiece", {"vocab_size": 4000, "max_train_lines": None}, made, "")
    RunSettings(tmp_path).refuse_changed("sentencepiece", {"vocab_size": 8000, "max_train_lines": None}, made, "")
    shutil.rmtree(made)
    RunSettings(tmp_path).refuse_changed("sentencepiece", {"vocab_size": 4000, "max_train_lines": None}, made, "")
    (tmp_path / "settings.json").write_text('{"sentencepiece": ')
    with pytest.raises(SettingsChanged, match="settings.json cannot be read"):
        RunSettings(tmp_path)


# ---- wmt14_en_de: the download path ---------------------------------------------------------------------------


def start_wmt14_en_de(root: Path, corpus) -> RecipeRun:
    mirror = root / "mirror"
    train = corpus["train"]
    parts = {  # archive -> corpus stem inside it; the three corpora are concatenated in this order
        "training-parallel-europarl-v7.tgz": ("training/europarl-v7.de-en", train[:100]),
        "training-parallel-commoncrawl.tgz": ("commoncrawl.de-en", train[100:200]),
        "training-parallel-nc-v9.tgz": ("training/news-commentary-v9.de-en", train[200:]),
    }
    for archive, (stem, pairs) in parts.items():
        files = {f"{stem}.en": "".join(s + "\n" for s, _ in pairs), f"{stem}.de": "".join(t + "\n" for _, t in pairs)}
        make_tar(mirror / archive, files)

    def sgm(side):
        segs = "".join(f'<seg id="{i + 1}">{pair[side]} &amp; </seg>\n' for i, pair in enumerate(corpus["test"]))
        return f'<srcset setid="newstest2014">\n<doc docid="x">\n{segs}</doc>\n</srcset>\n'

    make_tar(
        mirror / "test-full.tgz",
        {"test-full/newstest2014-deen-src.en.sgm": sgm(0), "test-full/newstest2014-deen-ref.de.sgm": sgm(1)},
    )
    return RecipeRun("wmt14_en_de", root / "out", "--mirror", mirror.as_uri())


def test_wmt14_en_de_from_archives(runs, corpus):
    """The download path: statmt.org-shaped .tgz archives through --mirror, every 100th pair held out as valid,
    newstest2014 read from its .sgm files as sacrebleu reads them."""
    run = runs["wmt14_en_de"]
    run.result()
    out, train = run.out, corpus["train"]
    prepared = out / "download" / "prepared"
    assert lines(prepared / "valid.en") == [train[i - 1][0] for i in (100, 200, 300)]
    assert len(lines(prepared / "train.de")) == len(train) - 3
    assert lines(out / "raw" / "test.de")[0] == corpus["test"][0][1] + " &amp;"  # entities kept, as in sacrebleu
    check_common_stages(out, "en", "de", SIZES["test"])
    assert SIGNATURE.search((out / "score-test.auto.txt").read_text())


# ---- wmt14_en_fr: local files, the other direction -------------------------------------------------------------


def start_wmt14_en_fr(root: Path, corpus) -> RecipeRun:
    raw = root / "raw-files"
    for split, pairs in corpus.items():
        write(raw / f"{split}.en", [s for s, _ in pairs])
        write(raw / f"{split}.fr", [t for _, t in pairs])
    # a budget of 3 updates (no epoch limit), annealed to its end
    train_args = shlex.join([*TINY, "--max-epoch", "0"])
    return RecipeRun(
        "wmt14_en_fr", root / "out", "--raw-dir", str(raw), "--source-lang", "fr", "--update-budget", "3",
        "--train-args", train_args,
    )  # fmt: skip


def test_wmt14_en_fr_local_files_reverse_direction(runs, corpus):
    """Local {train,valid,test}.{en,fr} and the other direction (fr to en), scored against the English side;
    trained under an update budget, the rate annealed to 0 where fairseq stops."""
    run = runs["wmt14_en_fr"]
    output = run.result()
    check_common_stages(run.out, "fr", "en", SIZES["test"])
    assert "--arch convs2s_wmt_en_fr" in output
    assert "budget schedule: lr 0.5 for the first 50% of 3 updates, then linearly to 0" in output
    assert "Stopping training due to num_updates: 3 >= max_update: 3" in output
    assert re.findall(r"\| train \| epoch \d+ \|.*\| lr ([0-9.e-]+) \|", output)[-1] == "0"
    expected = scoring.bleu(lines(run.out / "test.auto.hyp"), [[s for s, _ in corpus["test"]]])
    assert (run.out / "score-test.auto.txt").read_text().strip() == expected


# ---- gigaword: ROUGE, DUC ---------------------------------------------------------------------------------------


def start_gigaword(root: Path, corpus) -> RecipeRun:
    mirror = root / "mirror"
    files = {}
    for split, prefix in (("train", "train"), ("valid", "dev"), ("test", "test")):
        unk = "<unk>" if split != "test" else "UNK"
        files[f"org_data/{prefix}.src.txt"] = "".join(f"{s} {unk}\n" for s, _ in corpus[split])
        files[f"org_data/{prefix}.tgt.txt"] = "".join(t + "\n" for _, t in corpus[split])
    make_tar(mirror / "gigaword.tar.gz", files)
    duc = root / "duc"
    write(duc / "input.txt", [s for s, _ in corpus["test"][:8]])
    refs = [duc / f"task1_ref{k}.txt" for k in range(4)]
    for k, path in enumerate(refs):
        write(path, [t if k % 2 == 0 else t.upper() for _, t in corpus["test"][:8]])
    return RecipeRun(
        "gigaword", root / "out", "--mirror", mirror.as_uri(), "--duc-source", str(duc / "input.txt"),
        "--duc-refs", *map(str, refs),
    )  # fmt: skip


def test_gigaword_with_duc(runs):
    """The harvardnlp archive layout through --mirror, <unk> unified to UNK, ROUGE F1 on the test set, and a
    DUC-style set: four references, at least 14 output pieces, recall on the first 75 bytes."""
    run = runs["gigaword"]
    output = run.result()
    out = run.out
    check_common_stages(out, "src", "tgt", SIZES["test"])
    assert lines(out / "raw" / "train.src")[0].endswith(" UNK")  # one spelling of the unknown word everywhere

    report = (out / "score-test.auto.txt").read_text()
    assert "(F1;" in report
    assert all(0 <= float(x) <= 100 for x in ROUGE_LINE.search(report).groups())

    duc_report = (out / "score-duc2004.auto.txt").read_text()
    assert "recall, hypotheses cut to 75 bytes" in duc_report and ROUGE_LINE.search(duc_report)
    assert len(list((out / "raw").glob("duc2004.tgt*"))) == 4  # the first reference and three more
    assert len(lines(out / "duc2004.auto.hyp")) == 8
    # --min-len 14: every output has at least 14 pieces before its end of sentence (a P- line scores each piece
    # and the end of sentence)
    generated = (out / "generate-duc2004.auto.txt").read_text()
    pieces = [len(line.split("\t")[1].split()) - 1 for line in generated.splitlines() if line.startswith("P-")]
    assert len(pieces) == 8 and min(pieces) >= 14, pieces
    assert "ROUGE-1/2/L 35.88/17.48/33.29" in output  # the paper's numbers, printed for comparison


def test_another_duc_set_into_the_same_out_is_prepared_and_scored_anew(runs, corpus, tmp_path):
    """Other DUC files given to a finished run's --out are normalized, encoded, binarized with the run's dictionary,
    translated and scored, the model and the Gigaword test set kept (the first files' score was reported as theirs:
    every stage's output was there)."""
    finished, out = runs["gigaword"], tmp_path / "out"
    cmd = finished.copied_to(out)
    del cmd[cmd.index("--duc-source") :]
    other = [s for s, _ in corpus["test"][8:14]]
    refs = [tmp_path / "duc" / f"ref{k}.txt" for k in range(4)]
    write(tmp_path / "duc" / "input.txt", other)
    for path in refs:
        write(path, [t for _, t in corpus["test"][8:14]])
    cmd += ["--duc-source", str(tmp_path / "duc" / "input.txt"), "--duc-refs", *map(str, refs)]
    test_score = (out / "score-test.auto.txt").read_text()

    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f'duc2004: source "{finished.out.parent / "duc" / "input.txt"} (sha256 ' in proc.stdout
    assert "preparing, translating and scoring it again" in proc.stdout
    commands = re.findall(r"^\$ .*", proc.stdout, re.M)
    assert len(commands) == 2, commands  # nothing trained, the test set not translated again
    assert "fairseq_cli.preprocess" in commands[0] and "--srcdict" in commands[0]
    assert "fairseq_cli.generate" in commands[1] and "--gen-subset test1" in commands[1]
    assert lines(out / "raw" / "duc2004.src") == other
    assert len(lines(out / "duc2004.auto.hyp")) == 6
    assert (out / "score-test.auto.txt").read_text() == test_score
    sources = [line for line in lines(out / "generate-duc2004.auto.txt") if line.startswith("S-")]
    assert len(sources) == 6  # (scored against the six new references: score() checks the counts)
    assert not list((out / "data-bin").glob("*.partial"))

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=out)
    assert again.returncode == 0 and "\n$ " not in again.stdout, again.stdout + again.stderr[-3000:]


def test_compare_reads_real_runs(runs, tmp_path):
    """examples/recipes/compare.py, run as a user runs it, on what the recipes wrote: the Multi30k run against a
    copy of it that translated every test sentence as its reference; Gigaword's ROUGE run against itself."""
    runs["multi30k"].result()
    out = runs["multi30k"].out
    perfect = tmp_path / "perfect"
    (perfect / "checkpoints").mkdir(parents=True)
    shutil.copytree(out / "raw", perfect / "raw")
    for name in ("train.log", "checkpoints/chosen.txt"):
        shutil.copy(out / name, perfect / name)
    refs = lines(out / "raw" / "test.de")
    (perfect / "test.auto.hyp").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    (perfect / "score-test.auto.txt").write_text(scoring.bleu(refs, [refs]) + "\n", encoding="utf-8")
    png = tmp_path / "both.png"
    script = REPO_ROOT / "examples" / "recipes" / "compare.py"
    result = subprocess.run(
        [sys.executable, str(script), str(out), str(perfect), "--png", str(png)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    updates = max(map(int, re.findall(r"num_updates (\d+)", (out / "train.log").read_text())))
    bleu = BLEU_LINE.search((out / "score-test.auto.txt").read_text()).group(1)
    chosen = (out / "checkpoints" / "chosen.txt").read_text().split("\t")[0]
    row = rf"^\| out \| convs2s_iwslt_de_en \| 1 \| [0-9.]+ \| {updates:,} \| .* \| {chosen} \| BLEU {bleu} \|$"
    assert re.search(row, result.stdout, re.M), result.stdout
    assert f"test.auto: BLEU against out ({float(bleu):.2f}), paired bootstrap, 1000 resamples" in result.stdout
    difference = float(re.search(r"^   perfect: 100\.00 \(\+([0-9.]+), p = 0\.0010; ", result.stdout, re.M).group(1))
    assert difference == pytest.approx(100 - float(bleu), abs=0.011)
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")

    runs["gigaword"].result()
    giga = subprocess.run(
        [sys.executable, str(script), str(runs["gigaword"].out), str(runs["gigaword"].out)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert giga.returncode == 0, giga.stderr[-3000:]
    assert "| ROUGE-1 = " in giga.stdout and "F1;" not in giga.stdout
    assert "duc2004.auto: no paired test: the paired bootstrap here is sacreBLEU's, for BLEU scores" in giga.stdout


# ---- the helpers, in-process -----------------------------------------------------------------------------------


def test_rouge_recall_counts_only_the_first_75_bytes():
    ref = "alpha beta gamma"
    padding = " ".join(["x"] * 40)  # 79 bytes that match nothing
    assert scoring.rouge([f"{ref} {padding}"], [[ref]], recall_bytes=75)["rouge1"] == pytest.approx(100)
    assert scoring.rouge([f"{padding} {ref}"], [[ref]], recall_bytes=75)["rouge1"] == pytest.approx(0)
    # without the cut, F1 punishes the padding either way
    assert scoring.rouge([f"{padding} {ref}"], [[ref]])["rouge1"] == pytest.approx(100 * 2 * 3 / 43 / (1 + 3 / 43))
    assert scoring.truncate_bytes("äää", 3) == "ä"  # never half a character


def test_the_scoring_command_keeps_lines_whole_and_names_a_file_it_cannot_read(tmp_path, capsys):
    """scoring.py's lines end at a newline only: a U+2028 inside a sentence split it in two (str.splitlines) and
    every later hypothesis met the wrong reference; a file that is not UTF-8, or is not there, is a usage error
    naming it, not a traceback."""
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_bytes("a b c d\u2028e f\r\ng h i j\r\n".encode("utf-8"))
    ref.write_bytes(b"a b c d e f\ng h i j\n")
    scoring.main(["bleu", "--hyp", str(hyp), "--ref", str(ref)])
    assert capsys.readouterr().out.startswith("BLEU = 100.00 ")
    ref.write_bytes("a b c d e f\ng h \xe9 j\n".encode("latin-1"))
    for refs, message in [([ref], f"{ref}: line 2 is not valid UTF-8"), ([tmp_path / "no.txt"], "No such file")]:
        with pytest.raises(SystemExit) as exit:
            scoring.main(["bleu", "--hyp", str(hyp), "--ref", *map(str, refs)])
        assert exit.value.code == 2 and message in capsys.readouterr().err


def test_rouge_recall_averages_over_references():
    scores = scoring.rouge(["a b"], [["a b"], ["c d"]], recall_bytes=75)
    assert scores["rouge1"] == pytest.approx(50)


def test_length_and_ratio_filter():
    assert text.keep_pair(10, 15, max_tokens=250, max_ratio=1.5)
    assert not text.keep_pair(10, 16, max_tokens=250, max_ratio=1.5)
    assert text.keep_pair(10, 16, max_tokens=250, max_ratio=None)
    assert not text.keep_pair(0, 3, max_tokens=250, max_ratio=None)
    assert not text.keep_pair(251, 251, max_tokens=250, max_ratio=1.5)


def test_misaligned_corpus_is_an_error(tmp_path):
    write(tmp_path / "a", ["x", "y"])
    write(tmp_path / "b", ["x"])
    with pytest.raises(text.DataError, match="different numbers of lines"):
        list(text.read_pairs(tmp_path / "a", tmp_path / "b"))
    with pytest.raises(text.DataError, match=r"gone\.de not found"):  # e.g. a corpus an archive did not hold
        list(text.read_pairs(tmp_path / "a", tmp_path / "gone.de"))


@pytest.mark.parametrize(
    "case, message",
    [
        ("misaligned", r"run.py: error: .*val.en and .*val.de have different numbers of lines \(.*val.en ends"),
        ("missing", r"run.py: error: .*test_2016_flickr.de \(or test_2016_flickr.de.gz\) not found"),
        ("unreachable", r"run.py: error: could not download file://.*/empty/train.en.gz \(.*\): give --raw-dir"),
    ],
)
def test_a_corpus_the_recipe_cannot_use_is_one_line_not_a_traceback(case, message, tmp_path, corpus):
    """A misaligned or missing raw file, or a download that fails (no internet; here a --mirror holding nothing),
    ended in a Python traceback (ValueError, FileNotFoundError, urllib's URLError) from the data stage."""
    if case == "unreachable":
        (tmp_path / "empty").mkdir()
        source = ["--mirror", (tmp_path / "empty").as_uri()]
    else:
        skip = {"test_2016_flickr.de"} if case == "missing" else set()
        short = {"val.en"} if case == "misaligned" else set()
        source = ["--raw-dir", str(multi30k_files(tmp_path / "raw", corpus, skip=skip, short=short))]
    out = tmp_path / "out"
    result = run_example("multi30k", "--out", str(out), *source, timeout=120)
    assert result.returncode == 1, result.stderr
    assert re.fullmatch(message + r"[^\n]*\n", result.stderr), result.stderr  # one line
    assert not list(out.glob("download/*.partial"))  # a failed download leaves no half file to trust
    assert not (out / "raw" / "test.de").exists()  # the stage is not marked done: a fixed corpus reruns it


def test_a_stage_whose_command_fails_ends_in_one_line_naming_it(tmp_path, corpus):
    """fairseq-train refusing a flag (here an --arch it does not know) ended the recipe in a traceback of
    subprocess.CalledProcessError that repeated the whole command; now one line names the command and its log."""
    raw = multi30k_files(tmp_path / "raw", corpus)
    out = tmp_path / "out"
    train_args = shlex.join([*TINY, "--arch", "no_such_arch"])
    result = run_example("multi30k", "--out", str(out), "--raw-dir", str(raw), "--train-args", train_args, timeout=300)
    assert result.returncode == 1, result.stderr
    tool = r"(fairseq-train|python -m fairseq_convs2s\.train)"  # fairseq's own entry on a GPU machine
    log = re.escape(str(out / "train.log"))
    expected = rf"run.py: error: {tool} exited with status 2 \(its output is also in {log}\); once fixed, run the same"
    last = result.stderr.splitlines()[-1]  # above it only fairseq's import notices, if any
    assert re.fullmatch(expected + r".*", last) and "Traceback" not in result.stderr, result.stderr
    assert "invalid choice: 'no_such_arch'" in result.stdout  # fairseq's own reason, shown above it
    assert (out / "data-bin").is_dir() and not (out / "checkpoints" / "train.done").exists()  # a rerun trains


def test_a_failed_command_says_how_it_ended(tmp_path):
    """A status, or the signal that killed it (the kernel's out-of-memory killer sends SIGKILL)."""
    python = re.escape(Path(sys.executable).name)
    with pytest.raises(commands.CommandFailed, match=rf"^{python} exited with status 3; once fixed"):
        commands.run([sys.executable, "-c", "raise SystemExit(3)"])
    killed = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    log = tmp_path / "log"
    with pytest.raises(commands.CommandFailed, match=r"killed by SIGKILL \(out of memory\?\) \(its output is also in"):
        commands.run(killed, log=log)
    assert commands.command_name([sys.executable, "-m", "fairseq_cli.generate", "data"]) == "fairseq-generate"


def test_an_interrupted_recipe_leaves_no_command_running(monkeypatch):
    """An interrupt that reached the recipe alone (kill -INT, a job scheduler) left its fairseq-train running,
    unseen and no longer logging, beside the rerun that would resume from the same checkpoints."""
    child = [sys.executable, "-c", "import os, time; print('pid', os.getpid(), flush=True); time.sleep(600)"]
    pids = []

    class InterruptedConsole(io.StringIO):
        def write(self, text):
            if text.startswith("pid "):  # the child is running: the interrupt arrives now
                pids.append(int(text.split()[1]))
                raise KeyboardInterrupt
            return super().write(text)

    monkeypatch.setattr(sys, "stdout", InterruptedConsole())
    try:
        with pytest.raises(KeyboardInterrupt):
            commands.run(child, log=Path(os.devnull))
        with pytest.raises(ProcessLookupError):  # terminated and reaped before the interrupt went on
            os.kill(pids[0], 0)
    finally:
        if pids:
            try:
                os.kill(pids[0], 9)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize(
    "raised, code, message",
    [
        (KeyboardInterrupt(), 130, "\nt.py: interrupted; run the same command again to go on from here\n"),
        (text.DataError("x.en not found"), "t.py: error: x.en not found", ""),
    ],
    ids=["interrupt", "data error"],
)
def test_main_answers_an_interrupt_or_an_error_in_one_line(raised, code, message, monkeypatch, capsys, tmp_path):
    def stages(*args):
        raise raised

    monkeypatch.setattr(pipeline, "run_stages", stages)
    monkeypatch.setattr(sys, "argv", ["t.py"])
    with pytest.raises(SystemExit) as exit_:
        pipeline.main(pipeline.Recipe(name="t", langs=("en", "de"), raw_prefixes={}), "doc", ["--out", str(tmp_path)])
    assert exit_.value.code == code and capsys.readouterr().err == message


@pytest.mark.parametrize("flag", ["--max-train-lines", "--vocab-size", "--average-last", "--workers"])
def test_counts_below_one_are_usage_errors(flag, capsys):
    """--max-train-lines -5 went on to sentencepiece, which stopped on an empty training set."""
    parser = pipeline.build_parser(pipeline.Recipe(name="t", langs=("en", "de"), raw_prefixes={}), "doc")
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args([flag, "0"])
    assert exit_.value.code == 2 and f"argument {flag}: must be at least 1, got 0" in capsys.readouterr().err
    assert getattr(parser.parse_args([flag, "3"]), flag[2:].replace("-", "_")) == 3


def test_an_out_that_is_a_file_is_a_usage_error(tmp_path, capsys):
    """--out naming a file ended in a NotADirectoryError traceback at the first stage's mkdir."""
    parser = pipeline.build_parser(pipeline.Recipe(name="t", langs=("en", "de"), raw_prefixes={}), "doc")
    (tmp_path / "a_file").write_text("")
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--out", str(tmp_path / "a_file")])
    assert exit_.value.code == 2 and "argument --out: " in capsys.readouterr().err
    assert parser.parse_args(["--out", str(tmp_path / "new")]).out == tmp_path / "new"
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--out", ""])  # (was the current folder: every stage's output among the user's files)
    assert exit_.value.code == 2 and "argument --out: must name a folder" in capsys.readouterr().err


@pytest.mark.parametrize("flag", sorted(pipeline.OWNED_TRAIN_FLAGS))
def test_train_args_that_would_part_training_from_the_later_stages_are_usage_errors(flag, capsys, tmp_path):
    """--train-args "--save-dir X" trained into X and stage 5 found nothing to average; another direction trained a
    model the generation stage could not load."""
    recipe = pipeline.Recipe(name="t", langs=("en", "de"), raw_prefixes={})
    with pytest.raises(SystemExit) as exit_:
        pipeline.main(recipe, "doc", ["--out", str(tmp_path), "--train-args", f"--max-epoch 1 {flag}=x"])
    assert exit_.value.code == 2 and f"error: {flag} in --train-args: " in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, direction",
    [([], ("en", "de")), (["--target-lang", "en"], ("de", "en")), (["--source-lang", "de"], ("de", "en"))],
)
def test_either_language_flag_alone_gives_the_direction(args, direction, monkeypatch, tmp_path):
    """--target-lang en alone, for German to English, stopped with '--source-lang and --target-lang must differ'
    (the source's default was English whatever the target)."""
    stages = []
    monkeypatch.setattr(pipeline, "run_stages", lambda recipe, args, src, tgt: stages.append((src, tgt)))
    recipe = pipeline.Recipe(name="t", langs=("en", "de"), raw_prefixes={})
    pipeline.main(recipe, "doc", ["--out", str(tmp_path), *args])
    assert stages == [direction]


@pytest.mark.parametrize("args", [["--max-epoch", "0"], ["--vocab-size", "0"], ["--out", __file__]])
def test_the_quickstarts_bad_flags_are_usage_errors(args):
    """The README's first command: --max-epoch 0 trained without end (fairseq's 0 is no limit), --vocab-size 0
    stopped in sentencepiece, a file as --out in a traceback; now argparse says so before any stage runs."""
    result = run_example("quickstart", *args, timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"argument {args[0]}: " in result.stderr and "Traceback" not in result.stderr
    assert "==" not in result.stdout  # no stage started


def test_the_quickstart_never_reports_another_commands_model(tmp_path):
    """Another --vocab-size or --max-epoch into a finished quickstart's --out skipped the stages they decide and
    printed the first model's BLEU; now one line names the flag and both values, before anything runs."""
    for folder, made in (("spm", "spm.model"), ("data-bin", "dict.src.txt"), ("checkpoints", "train.done")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / made).touch()
    settings = RunSettings(tmp_path)
    for stage in ("sentencepiece", "preprocess"):
        settings.record(stage, {"vocab_size": 120})
    settings.record("train", {"vocab_size": 120, "max_epoch": 5})
    for args, message in [
        (["--vocab-size", "100"], "spm was made by another command (--vocab-size 120, this command 100)"),
        (["--max-epoch", "8"], "checkpoints was made by another command (--max-epoch 5, this command 8)"),
    ]:
        result = run_example("quickstart", "--out", str(tmp_path), *args, timeout=60)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.startswith("run.py: error: ") and message in result.stderr, result.stderr
        assert "\n$ " not in result.stdout and not (tmp_path / "raw").exists()  # nothing ran


def test_the_quickstart_names_a_command_that_fails(tmp_path):
    """A stage's command that failed (here fairseq-preprocess, whose destination is a file) ended the quickstart in
    a traceback of subprocess.CalledProcessError; a --vocab-size above what the corpus holds, in sentencepiece's."""
    (tmp_path / "data-bin").write_text("")
    result = run_example("quickstart", "--out", str(tmp_path), "--vocab-size", "100000", timeout=300)
    assert result.returncode == 1, result.stderr
    last = result.stderr.splitlines()[-1]  # above it, fairseq-preprocess's own FileExistsError
    assert last.startswith("run.py: error: fairseq-preprocess exited with status 1; once fixed, run the same"), last
    assert (tmp_path / "spm" / "test.tgt").exists()  # sentencepiece took the vocabulary the corpus holds


def test_average_checkpoints_bad_input_is_a_message_not_a_traceback(tmp_path, capsys):
    """A missing, non-torch or non-fairseq input, a negative --last (which averaged all but the first files) and an
    --output in a folder that is not there: each ended in a traceback (or a wrong average) before."""
    good = tmp_path / "checkpoint1.pt"
    torch.save({"model": {"w": torch.ones(2)}}, good)
    (tmp_path / "text.pt").write_text("not a checkpoint")
    torch.save({"w": torch.ones(2)}, tmp_path / "bare.pt")
    (tmp_path / "pickle.pt").write_bytes(pickle.dumps({"model": object}, protocol=4))
    out = ["--output", str(tmp_path / "avg.pt")]
    for inputs, message in [
        ("missing.pt", "missing.pt: no such file"),
        ("text.pt", "text.pt: cannot be read as a torch checkpoint"),
        ("bare.pt", "bare.pt: not a fairseq checkpoint"),
        ("pickle.pt", r"pickle.pt: cannot be read as a torch checkpoint \(torch's safe loader: Unsupported operand"),
    ]:
        with pytest.raises(SystemExit, match=f"average_checkpoints: error: .*{message}") as ended:
            average_main(["--inputs", str(good), str(tmp_path / inputs), *out])
        assert "\n" not in str(ended.value) and "weights_only" not in str(ended.value)  # (torch's advice: unsafe)
    assert "pickle protocol" not in capsys.readouterr().err
    for args, message in [
        (["--last", "-3", "--checkpoint-dir", str(tmp_path), *out], "argument --last: must be at least 1, got -3"),
        (["--inputs", str(good), "--output", str(tmp_path / "gone" / "avg.pt")], "argument --output: "),
    ]:
        with pytest.raises(SystemExit) as exit_:
            average_main(args)
        assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "avg.pt").exists()
    average_main(["--inputs", str(good), str(good), *out])
    assert torch.equal(torch.load(tmp_path / "avg.pt")["model"]["w"], torch.ones(2))


@pytest.mark.parametrize("kind", ["not an archive", "cut short"])
def test_an_archive_that_cannot_be_unpacked_is_named(kind, tmp_path):
    """A page saved under an archive's name (a mirror's error page) or a download cut short ended in tarfile's
    ReadError (several lines) or an EOFError traceback."""
    import random

    archive = tmp_path / "training-parallel-nc-v9.tgz"
    make_tar(archive, {"training/news-commentary-v9.de-en.en": random.Random(0).randbytes(50_000).hex()})
    whole = archive.read_bytes()
    archive.write_bytes(b"<html>404</html>" if kind == "not an archive" else whole[: len(whole) // 2])
    with pytest.raises(text.DataError) as error:
        extract(archive, tmp_path / "orig")
    one_line = r".*training-parallel-nc-v9.tgz cannot be unpacked \([^\n]+\): delete it and run again to download it"
    assert re.fullmatch(one_line, str(error.value)), str(error.value)
    assert not list((tmp_path / "orig").glob(".extracted-*"))  # the next run unpacks again


def test_normalize():
    assert text.normalize("  a\u200b\tb \x07 c  ") == "a b c"


def test_sgm_segments(tmp_path):
    (tmp_path / "x.sgm").write_text('<doc>\n<seg id="1"> A  b &quot;c&quot; </seg>\n<p>\n<seg id="2">d</seg>\n</doc>\n')
    assert list(sgm_segments(tmp_path / "x.sgm")) == ["A b &quot;c&quot;", "d"]


def test_split_train_valid(tmp_path):
    write(tmp_path / "c1.en", [f"e{i}" for i in range(5)])
    write(tmp_path / "c1.de", [f"d{i}" for i in range(5)])
    write(tmp_path / "c2.en", [f"e{i}" for i in range(5, 7)], compress=True)
    write(tmp_path / "c2.de", [f"d{i}" for i in range(5, 7)], compress=True)
    corpora = [(tmp_path / "c1.en", tmp_path / "c1.de"), (tmp_path / "c2.en.gz", tmp_path / "c2.de.gz")]
    assert split_train_valid(corpora, tmp_path / "out", ("en", "de"), valid_every=3) == (5, 2)
    assert lines(tmp_path / "out" / "valid.de") == ["d2", "d5"]
    assert lines(tmp_path / "out" / "train.en") == ["e0", "e1", "e3", "e4", "e6"]


def test_average_checkpoints_keeps_dtypes_and_the_newest_state(tmp_path):
    for epoch, value in ((1, 1.0), (2, 2.0), (3, 6.0)):
        state = {
            "model": {
                "w": torch.full((2,), value),
                "h": torch.full((2,), value, dtype=torch.float16),
                "steps": torch.tensor([epoch]),
            },
            "extra_state": {"epoch": epoch},
        }
        torch.save(state, tmp_path / f"checkpoint{epoch}.pt")
    (tmp_path / "checkpoint_best.pt").write_bytes(b"not an epoch checkpoint")
    inputs = last_epoch_checkpoints(tmp_path, 2)
    assert [p.name for p in inputs] == ["checkpoint2.pt", "checkpoint3.pt"]
    averaged = average_checkpoints(inputs)
    assert torch.equal(averaged["model"]["w"], torch.full((2,), 4.0))
    assert averaged["model"]["h"].dtype == torch.float16 and torch.equal(
        averaged["model"]["h"].float(), torch.full((2,), 4.0)
    )
    assert torch.equal(averaged["model"]["steps"], torch.tensor([3]))  # integers: the newest
    assert averaged["extra_state"] == {"epoch": 3}
