"""Inputs of the recipes' tools that they once took without a word or ended in a traceback: a raw corpus that is
not UTF-8, a ``.gz`` that cannot be decompressed, checkpoints of two models to average, an average written over
its input, an interrupted fairseq-preprocess in the quickstart. Each is checked in-process on files of a few lines.
"""

import gzip
import importlib.util
import itertools
import subprocess
import sys
from argparse import Namespace

import pytest
import torch
from cli_helpers import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "examples"))

from recipes import text  # noqa: E402
from recipes.average_checkpoints import main as average_main  # noqa: E402
from recipes.commands import CommandFailed, OutLock, errors_in_one_line  # noqa: E402


def _reported(read) -> str:
    """What the driver prints when ``read()`` fails: its one line (run.py: error: ...)."""
    with pytest.raises(SystemExit) as ended:
        with errors_in_one_line("run.py"):
            read()
    return str(ended.value.code)


def test_a_corpus_that_is_not_utf8_is_named_with_its_first_bad_line(tmp_path):
    """A Latin-1 file was read with U+FFFD for each of its non-ASCII characters (35 of 60 references of a test set),
    and scored without a word; now the run stops, naming the file, its first bad line and how many there are."""
    src, tgt = tmp_path / "train.en", tmp_path / "train.de"
    src.write_text("a man\na boy runs\nthe green grass\nbye\n", encoding="utf-8")
    tgt.write_text("ein Mann\nein Junge läuft\nüber grünes Gras\ntschüss\n", encoding="latin-1")
    hint = f"convert the file to UTF-8 (iconv -f LATIN1 -t UTF-8 when it is Latin-1; python scripts/check_utf8.py {tgt}"
    expected = f"run.py: error: {tgt}: line 2 is not valid UTF-8 (3 such lines in all): {hint} lists them)"
    assert _reported(lambda: list(text.read_pairs(src, tgt))) == expected
    assert _reported(lambda: text.read_lines(tgt)) == expected
    # the same bytes gzipped: named as well (scripts/check_utf8.py reads no .gz, so it is not offered)
    packed = tmp_path / "train.de.gz"
    packed.write_bytes(gzip.compress(tgt.read_bytes()))
    assert _reported(lambda: text.read_lines(packed)) == (
        f"run.py: error: {packed}: line 2 is not valid UTF-8 (3 such lines in all): convert the file to UTF-8 "
        "(iconv -f LATIN1 -t UTF-8 when it is Latin-1)"
    )
    assert text.read_lines(src) == ["a man", "a boy runs", "the green grass", "bye"]  # (UTF-8 reads as before)


@pytest.mark.parametrize(
    "kind, reason",
    [
        ("cut short", "EOFError: Compressed file ended before the end-of-stream marker was reached"),
        ("not gzipped", "BadGzipFile: Not a gzipped file (b'ei')"),
    ],
)
def test_a_gz_that_cannot_be_decompressed_is_named(kind, reason, tmp_path):
    """A .gz in --raw-dir cut short (an interrupted download) or a plain file named .gz ended the data stage in an
    EOFError or BadGzipFile traceback that named no file."""
    lines = [f"ein satz {i}" for i in range(2000)]
    src, tgt = tmp_path / "val.en", tmp_path / "val.de.gz"
    src.write_text("".join(f"sentence {i}\n" for i in range(2000)), encoding="utf-8")
    whole = gzip.compress("".join(line + "\n" for line in lines).encode("utf-8"))
    tgt.write_bytes(whole[: len(whole) // 2] if kind == "cut short" else "\n".join(lines).encode("utf-8"))
    assert _reported(lambda: list(text.read_pairs(src, tgt))) == (
        f"run.py: error: {tgt} cannot be decompressed ({reason}): download or compress it again (a plain text file "
        "must not end in .gz)"
    )


def _checkpoint(path, embed_rows):
    torch.save({"model": {"embed.weight": torch.ones(embed_rows, 4), "bias": torch.zeros(4)}}, path)


def test_averaging_two_models_names_the_files_and_the_parameter(tmp_path):
    """Checkpoints of models of two vocabularies ended in torch's bare RuntimeError traceback ("The size of tensor
    a (296) must match the size of tensor b (200)"), naming neither file nor parameter."""
    a, b = tmp_path / "checkpoint1.pt", tmp_path / "checkpoint2.pt"
    _checkpoint(a, 200)
    _checkpoint(b, 296)
    with pytest.raises(SystemExit) as ended:
        average_main(["--inputs", str(a), str(b), "--output", str(tmp_path / "avg.pt")])
    assert ended.value.code == (
        f"average_checkpoints: error: {b} and {a} hold embed.weight in different shapes ((296, 4) and (200, 4)): "
        "not the same model"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint1.pt", "checkpoint2.pt"]


def test_averaging_never_writes_over_an_input_nor_leaves_half_a_file(tmp_path, capsys, monkeypatch):
    """An --output that is one of the --inputs was overwritten without a word (the newest epoch's checkpoint
    replaced by the average); a save that failed (a full disk) left a truncated file under the output's name, in
    place of the average that was there."""
    a, b = tmp_path / "checkpoint1.pt", tmp_path / "checkpoint2.pt"
    _checkpoint(a, 2)
    _checkpoint(b, 2)
    kept = b.read_bytes()
    (tmp_path / "latest.pt").symlink_to(b.name)
    for output in (b, tmp_path / "latest.pt"):
        with pytest.raises(SystemExit) as ended:
            average_main(["--inputs", str(a), str(b), "--output", str(output)])
        message = f"argument --output: {output} is one of the inputs; give the average a file of its own"
        assert ended.value.code == 2 and message in capsys.readouterr().err
    assert b.read_bytes() == kept

    avg = tmp_path / "avg.pt"
    avg.write_bytes(b"the average of an earlier call")

    def disk_full(obj, path):
        with open(path, "wb") as f:
            f.write(b"half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(SystemExit) as ended:
        average_main(["--inputs", str(a), str(b), "--output", str(avg)])
    assert ended.value.code == "average_checkpoints: error: [Errno 28] No space left on device"
    assert avg.read_bytes() == b"the average of an earlier call"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["avg.pt", "checkpoint1.pt", "checkpoint2.pt", "latest.pt"]


def _quickstart():
    """examples/quickstart/run.py as a module."""
    spec = importlib.util.spec_from_file_location("quickstart_run", REPO_ROOT / "examples" / "quickstart" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("left", ["dictionaries", "all but the last split"])
def test_the_quickstart_redoes_an_interrupted_preprocess(left, tmp_path, monkeypatch, capsys):
    """fairseq-preprocess writes the dictionaries first, then binarizes; interrupted between the two, the rerun took
    stage 3 as done (by data-bin/dict.tgt.txt) and failed in fairseq-train ('Could not infer language pair') on
    every rerun after. Now stage 3 runs again, on a data-bin emptied of what the interrupted one left."""
    quickstart = _quickstart()
    out = tmp_path / "out"
    for done in ("raw/test.tgt", "spm/test.tgt"):  # (stages 1 and 2)
        (out / done).parent.mkdir(parents=True, exist_ok=True)
        (out / done).write_text("")
    bin_dir = out / "data-bin"
    bin_dir.mkdir()
    written = ["dict.src.txt", "dict.tgt.txt"]
    if left == "all but the last split":
        # (fairseq binarizes the source side's splits, then the target side's: the last file is test's .tgt.idx)
        splits = itertools.product(("src", "tgt"), ("train", "valid", "test"), ("bin", "idx"))
        written += [f"{split}.src-tgt.{lang}.{ext}" for lang, split, ext in splits][:-1]
    for name in written:
        (bin_dir / name).write_text("")
    ran = []

    def fake_run(cmd, **kwargs):  # each command fails: the first one the quickstart runs ends it
        ran.append((cmd, sorted(p.name for p in bin_dir.iterdir()) if bin_dir.exists() else None))
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(quickstart.subprocess, "run", fake_run)
    with pytest.raises(CommandFailed, match="^fairseq-preprocess exited with status 1"):
        quickstart.run_stages(Namespace(out=out, max_epoch=1, vocab_size=120), OutLock())
    printed = capsys.readouterr().out
    assert "\n== 3/7 fairseq-preprocess\n$ " in printed and "fairseq_cli.preprocess" in printed, printed
    assert len(ran) == 1 and ran[0][1] is None  # (what the interrupted one left was gone before it ran)

    # once fairseq-preprocess has written its last file, the stage is done
    bin_dir.mkdir()
    (bin_dir / "test.src-tgt.tgt.idx").write_text("")
    with pytest.raises(CommandFailed, match="^fairseq-train exited with status 1"):
        quickstart.run_stages(Namespace(out=out, max_epoch=1, vocab_size=120), OutLock())
    assert f"== 3/7 fairseq-preprocess: already done ({bin_dir / 'test.src-tgt.tgt.idx'})" in capsys.readouterr().out


def _wmt_files(folder, sizes, lines=lambda lang, i: f"{lang} words {i}"):
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in sizes.items():
        for lang in ("en", "de"):
            (folder / f"{split}.{lang}").write_text("".join(lines(lang, i) + "\n" for i in range(n)), encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    "split, blank, said",
    [
        ("train", False, "are empty: the train split needs sentences"),
        ("train", True, "hold no pair with words on both sides in 3 lines: the train split needs sentences"),
        ("valid", False, "are empty: the valid split needs sentences"),
        ("test", False, "are empty: the test split needs sentences"),
    ],
)
def test_a_split_without_sentences_is_refused_at_the_data_stage(split, blank, said, tmp_path):
    """An empty (or blank) train split ended stage 2 in sentencepiece's RuntimeError traceback ('[!sentences_
    .empty()]'); an empty valid split stopped only in fairseq-train, an empty test split only after training."""
    from recipes import pipeline

    sizes = {"train": 20, "valid": 5, "test": 5, split: 3 if blank else 0}
    raw = _wmt_files(tmp_path / "raw", sizes, lambda lang, i: "" if blank else f"{lang} words {i}")
    recipe = pipeline.Recipe(name="t", langs=("en", "de"), raw_prefixes={s: s for s in ("train", "valid", "test")})
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as ended:
        pipeline.main(recipe, "doc", ["--out", str(out), "--raw-dir", str(raw), "--vocab-size", "40"])
    assert ended.value.code.split(": error: ")[1] == f"{raw / split}.en and {raw / split}.de {said}"
    assert not (out / "raw" / f"{split}.de").exists()  # (not taken as done: the fixed files are read on the rerun)
    assert not (out / "spm").exists()


def test_a_split_the_length_filter_empties_is_refused_before_fairseq_preprocess(tmp_path):
    """A valid split whose every pair the length/ratio filter drops was binarized empty, and fairseq-train refused
    it after fairseq-preprocess (tens of minutes on WMT) with a remedy that named neither the filter nor raw/."""
    from recipes import pipeline

    def lines(lang, i):
        return f"{lang} words {i}" if i < 20 or lang == "de" else "x"  # valid: 1 piece against 3 or more

    raw = _wmt_files(tmp_path / "raw", {"train": 20, "valid": 25, "test": 5}, lines)
    (raw / "valid.en").write_text("x\n" * 5, encoding="utf-8")
    (raw / "valid.de").write_text("".join(f"de words {i} and more words\n" for i in range(5)), encoding="utf-8")
    recipe = pipeline.Recipe(name="t", langs=("en", "de"), raw_prefixes={s: s for s in ("train", "valid", "test")})
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as ended:
        pipeline.main(recipe, "doc", ["--out", str(out), "--raw-dir", str(raw), "--vocab-size", "40"])
    assert ended.value.code.split(": error: ")[1] == (
        f"no pair of {out / 'raw' / 'valid'}.{{en,de}} passes the length filter (each side 1 to 250 "
        f"pieces, lengths within 1.5x): fix the raw files, then delete raw/ and spm/ in {out} to redo them"
    )
    assert not (out / "spm" / "test.done").exists() and not (out / "data-bin").exists()


@pytest.mark.parametrize(
    "given, said",
    [
        (["--duc-source", "input.txt"], "--duc-source needs --duc-refs, its reference headlines"),
        (["--duc-refs", "ref0.txt"], "--duc-refs needs --duc-source, the articles they are the headlines of"),
        (["--duc-source", "gone.txt", "--duc-refs", "ref0.txt"], "gone.txt not found"),
        (["--duc-source", "input.txt", "--duc-refs", "ref0.txt", "gone.txt"], "gone.txt not found"),
    ],
)
def test_gigaword_duc_flags_it_cannot_use_stop_before_any_stage(given, said, tmp_path, monkeypatch, capsys):
    """A missing DUC file ended in a FileNotFoundError traceback once stages 1-3 had run; --duc-source alone stopped
    with a bare line ('--duc-source needs --duc-refs', no 'run.py: error:'), and --duc-refs alone was ignored."""
    spec = importlib.util.spec_from_file_location("gigaword_run", REPO_ROOT / "examples" / "gigaword" / "run.py")
    gigaword = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gigaword)
    for name in ("input.txt", "ref0.txt"):
        (tmp_path / name).write_text("a line\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ended:
        gigaword.main(gigaword.RECIPE, "doc", ["--out", "out", "--raw-dir", "nowhere", *given])
    assert ended.value.code.split(": error: ", 1)[1] == said
    assert "== 1/7" not in capsys.readouterr().out and not (tmp_path / "out").exists()


def _tar(path, files):
    """An archive of ``files`` ({name inside: bytes}), gzipped unless its name ends in .tar."""
    import io
    import tarfile

    with tarfile.open(path, "w" if path.name.endswith(".tar") else "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


EN_FR_CORPORA = {  # archive: the corpus inside it (the recipe's names, as statmt.org ships them)
    "training-parallel-europarl-v7.tgz": "training/europarl-v7.fr-en",
    "training-parallel-commoncrawl.tgz": "commoncrawl.fr-en",
    "training-parallel-un.tgz": "un/undoc.2000.fr-en",
    "training-parallel-nc-v9.tgz": "training/news-commentary-v9.fr-en",
    "training-giga-fren.tar": "giga-fren.release2.fixed",  # as .gz files inside the .tar
}


def _en_fr_download(mirror, with_reference=True):
    """The En-Fr recipe's download function, and its six archives in ``mirror`` (1,400 pairs in all, 3 test pairs
    as .sgm in test-full/)."""
    spec = importlib.util.spec_from_file_location("wmt14_en_fr_run", REPO_ROOT / "examples" / "wmt14_en_fr" / "run.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    mirror.mkdir()
    for k, (archive, stem) in enumerate(EN_FR_CORPORA.items()):
        files = {
            f"{stem}.{lang}": "".join(f"{lang} {i}\n" for i in range(k * 280, (k + 1) * 280)).encode()
            for lang in ("en", "fr")
        }
        if archive.endswith(".tar"):
            files = {name + ".gz": gzip.compress(data) for name, data in files.items()}
        _tar(mirror / archive, files)
    test = {
        f"test-full/newstest2014-fren-{kind}.{lang}.sgm": "".join(
            f'<seg id="{i}">{lang} test {i}</seg>\n' for i in range(3)
        ).encode()
        for kind, lang in (("src", "en"), ("ref", "fr"))
        if with_reference or lang == "en"
    }
    _tar(mirror / "test-full.tgz", test)
    return recipe.download


def test_the_en_fr_download_writes_its_test_set_whole_or_not_at_all(tmp_path, monkeypatch):
    """The En-Fr download path on local archives (--mirror file://): the five corpora in order, giga-fren read as
    the .gz files its .tar holds, every 1,333rd pair held out, newstest2014 from test-full/'s .sgm files. An
    interrupt while it wrote the test set left a test.fr cut short under its final name, which marks the download
    done: the rerun took it, and stopped at the data stage on test.en and test.fr of different lengths."""
    from recipes import download as download_module

    download = _en_fr_download(tmp_path / "mirror")
    segments = download_module.sgm_segments

    def cut_short(path):
        for n, segment in enumerate(segments(path)):
            if n == 2 and path.name.endswith(".fr.sgm"):
                raise KeyboardInterrupt
            yield segment

    monkeypatch.setattr(download_module, "sgm_segments", cut_short)
    with pytest.raises(KeyboardInterrupt):
        download(tmp_path / "download", (tmp_path / "mirror").as_uri())
    monkeypatch.setattr(download_module, "sgm_segments", segments)
    prepared = download(tmp_path / "download", (tmp_path / "mirror").as_uri())
    assert (prepared / "test.fr").read_text() == "fr test 0\nfr test 1\nfr test 2\n"
    assert (prepared / "valid.en").read_text() == "en 1332\n"  # (the 1,333rd pair, from giga-fren's .gz)
    assert (prepared / "train.fr").read_text().splitlines()[-1] == "fr 1399"
    assert len((prepared / "train.en").read_text().splitlines()) == 1399


def test_an_en_fr_test_set_missing_from_its_archive_is_named(tmp_path):
    """A test-full.tgz without newstest2014's reference ended, after every corpus was split, in a
    FileNotFoundError traceback."""
    download = _en_fr_download(tmp_path / "mirror", with_reference=False)
    reported = _reported(lambda: download(tmp_path / "download", (tmp_path / "mirror").as_uri()))
    missing = tmp_path / "download" / "orig" / "test-full" / "newstest2014-fren-ref.fr.sgm"
    assert (
        reported
        == f"run.py: error: {missing} not found: no archive held it; put it there and run again, or give --raw-dir"
    )
    assert not (tmp_path / "download" / "prepared").exists()  # (checked before the corpora are split)


def test_plot_attention_run_alone_names_the_model_it_needs(tmp_path):
    """``python examples/quickstart/plot_attention.py`` did nothing, silently, whatever it was given: the file only
    defined the quickstart's last stage. Run alone it draws a sentence with a finished quickstart's model, and names
    what is missing in one line."""
    script = REPO_ROOT / "examples" / "quickstart" / "plot_attention.py"
    ran = subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path), "two cats"], capture_output=True, text=True
    )
    missing = tmp_path / "checkpoints" / "checkpoint_best.pt"
    expected = f"plot_attention.py: error: {missing} not found: run examples/quickstart/run.py --out {tmp_path} first"
    assert ran.returncode == 2 and ran.stderr.splitlines()[-1] == expected, ran.stderr
