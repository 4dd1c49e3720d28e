"""The fairseq-free runtime (``convs2s_runtime``) and its export (``python -m fairseq_convs2s.export``): the same
hypotheses and scores as fairseq's beam search for a convs2s and a converted fconv model, and as fairseq-generate
for a trained one; no fairseq import; every input line answered; bad input named in one line."""

import argparse
import json
import math
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tracemalloc
from pathlib import Path
from subprocess import PIPE

import pytest
import torch
from cli_helpers import (
    EVAL_FLAGS,
    REPO_ROOT,
    check_ok,
    generate,
    hypothesis_lines,
    make_splits,
    preprocess,
    split_hypothesis,
    train,
    wait_until_sleeping,
)
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY
from fconv_helpers import fairseq_checkpoint, train_fconv
from utils import beam_search, build_model, make_dictionary, random_batch, seed_all, shrink_spec

from convs2s_runtime import Translator
from fairseq_convs2s.export import ExportError, _check_sentencepiece, export
from fairseq_convs2s.export import main as export_main

ROOT = Path(__file__).resolve().parent.parent


def _score_close(a: float, b: float) -> bool:
    """Scores agree to 1e-4 (relative where they are large: a sum of many log-probabilities)."""
    return abs(a - b) <= 1e-4 * max(1.0, abs(a))


def _data_dir(folder: Path, dictionary) -> Path:
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    dictionary.save(str(data / "dict.src.txt"))
    dictionary.save(str(data / "dict.tgt.txt"))
    return data


def _convs2s_checkpoint(folder: Path, arch: str, dictionary, **flags) -> Path:
    """A tiny convs2s model of ``arch`` (and model ``flags``) saved as fairseq saves it (``args``, the data folder
    named)."""
    args = argparse.Namespace(arch=arch, dropout=0.0, **flags)
    ARCH_CONFIG_REGISTRY[arch](args)
    for side in ("encoder", "decoder"):
        setattr(args, f"{side}_layers", shrink_spec(getattr(args, f"{side}_layers")))
        setattr(args, f"{side}_embed_dim", 12)
    args.decoder_out_embed_dim = 12 if args.share_all_embeddings else 10
    seed_all(0)
    model = build_model(arch, dictionary=dictionary, dropout=0.0, **flags)
    args.data, args.source_lang, args.target_lang = str(_data_dir(folder, dictionary)), "src", "tgt"
    path = folder / "checkpoint.pt"
    torch.save({"args": args, "model": model.state_dict()}, path)
    return path


def _exported(folder: Path, arch: str, dictionary, **flags):
    """A tiny convs2s checkpoint exported to ``folder/model``; returns the plugin's model of it, as fairseq-generate
    runs it."""
    checkpoint = _convs2s_checkpoint(folder, arch, dictionary, **flags)
    export(checkpoint, folder / "model")
    model = build_model(arch, dictionary=dictionary, dropout=0.0, **flags).eval()
    model.load_state_dict(torch.load(checkpoint, weights_only=False)["model"])
    model.make_generation_fast_()
    return model


def _sources(dictionary, src):
    return [
        " ".join(dictionary[t] for t in row if t not in (dictionary.pad(), dictionary.eos())) for row in src.tolist()
    ]


def _assert_same_beams(results, expected, dictionary):
    for result, beam in zip(results, expected):
        assert len(result.hypotheses) == len(beam)
        for hypothesis, (tokens, score, _) in zip(result.hypotheses, beam):
            assert hypothesis.tokens == [dictionary[t] for t in tokens[:-1]]
            assert _score_close(hypothesis.score, score), (hypothesis.score, score)


@pytest.mark.parametrize(
    "arch, flags",
    [("convs2s_iwslt_de_en", {}), ("convs2s_wmt_en_de", {}), ("convs2s_iwslt_de_en", {"share_all_embeddings": True})],
)
def test_the_runtime_finds_fairseqs_hypotheses(arch, flags, tmp_path):
    """Every one of the 5 best hypotheses of fairseq's beam search (the plugin's model, as fairseq-generate runs
    it), token for token, its score to 1e-4: mixed widths, kernel-1 blocks, sentences finishing at other steps,
    one embedding table for sources, targets and outputs."""
    d = make_dictionary(25)
    model = _exported(tmp_path, arch, d, **flags)
    src = random_batch(d, [9, 5, 7, 3, 6, 8], seed=7)
    expected = beam_search([model], d, src, max_len_b=12)
    results = Translator(tmp_path / "model").translate_batch(_sources(d, src), max_len_b=12, nbest=5)
    _assert_same_beams(results, expected, d)
    one_at_a_time = Translator(tmp_path / "model").translate_batch(_sources(d, src), max_len_b=12, max_batch_size=1)
    assert [r.hypotheses[0].tokens for r in one_at_a_time] == [r.hypotheses[0].tokens for r in results]


def test_min_len_holds_hypotheses_back_as_fairseqs(tmp_path):
    """``min_len`` (fairseq's ``--min-len``) keeps EOS away until that many tokens, as fairseq's beam search does
    (it was accepted and not used); settings that leave a source no hypothesis are refused before decoding."""
    d = make_dictionary(25)
    model = _exported(tmp_path, "convs2s_iwslt_de_en", d)
    src = random_batch(d, [9, 5, 7, 3, 6, 8], seed=7)
    translator = Translator(tmp_path / "model")
    free = translator.translate_batch(_sources(d, src), max_len_b=12, nbest=5)
    assert min(len(h.tokens) for r in free for h in r.hypotheses) < 4  # (so that min_len 4 changes some beam)
    held = translator.translate_batch(_sources(d, src), max_len_b=12, nbest=5, min_len=4)
    assert min(len(h.tokens) for r in held for h in r.hypotheses) >= 4
    _assert_same_beams(held, beam_search([model], d, src, max_len_b=12, min_len=4), d)
    with pytest.raises(ValueError, match=r"allow hypotheses of at most 3 tokens .* fewer than min_len 4"):
        translator.translate_batch(_sources(d, src), max_len_b=3, min_len=4)


def test_an_fconv_checkpoint_exports_and_decodes_as_fconv(tmp_path):
    """A stock fairseq fconv checkpoint, converted on export: the runtime finds fconv's own beams."""
    d = make_dictionary(25)
    fconv, args = train_fconv(d)
    args.data, args.source_lang, args.target_lang = str(_data_dir(tmp_path, d)), "src", "tgt"
    checkpoint = fairseq_checkpoint(fconv, args)
    checkpoint["cfg"]["task"] = {"_name": "translation", "data": args.data, "source_lang": "src", "target_lang": "tgt"}
    torch.save(checkpoint, tmp_path / "fconv.pt")
    export(tmp_path / "fconv.pt", tmp_path / "model")
    src = random_batch(d, [9, 5, 7, 3], seed=5)
    fconv.make_generation_fast_()
    expected = beam_search([fconv], d, src, max_len_b=10)
    results = Translator(tmp_path / "model").translate_batch(_sources(d, src), max_len_b=10, nbest=5)
    _assert_same_beams(results, expected, d)


def test_translating_imports_no_fairseq(tmp_path):
    """A process in which importing fairseq fails loads the folder and translates."""
    d = make_dictionary(25)
    export(_convs2s_checkpoint(tmp_path, "convs2s_iwslt_de_en", d), tmp_path / "model")
    code = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("fairseq", "fairseq_convs2s"):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
from convs2s_runtime import Translator
result = Translator({str(tmp_path / "model")!r}).translate_batch(["w1 w2 w3", "w4"])
print(len(result), all(r.hypotheses[0].tokens for r in result))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "2 True"


def test_the_command_line_answers_every_line_in_order(tmp_path):
    """Empty lines give empty lines, a line longer than the position table is cut with a warning, and the
    translations come back in input order, whatever the batching."""
    d = make_dictionary(25)
    export(_convs2s_checkpoint(tmp_path, "convs2s_iwslt_de_en", d), tmp_path / "model")
    max_positions = json.loads((tmp_path / "model" / "config.json").read_text())["encoder"]["max_positions"]
    lines = ["w1 w2 w3", "", "w4 w5", " ".join(["w6"] * (max_positions + 5)), "w7", "", "w8 w9 w10 w11"]
    translator = Translator(tmp_path / "model")
    expected = [r.hypotheses[0].text for r in translator.translate_batch([line for line in lines if line])]
    cmd = [sys.executable, "-m", "convs2s_runtime", str(tmp_path / "model"), "--batch-size", "3"]
    proc = subprocess.run(cmd, input="\n".join(lines) + "\n", capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout.split("\n")[:-1]
    assert len(out) == len(lines)
    assert [o for o, line in zip(out, lines) if not line] == ["", ""]
    assert [o for o, line in zip(out, lines) if line] == expected
    assert f"cut to the model's {max_positions} positions" in proc.stderr


def test_a_line_far_longer_than_the_positions_is_encoded_from_its_head(tmp_path, caplog):
    """A source of more than 8 words a position: the ids of the whole line cut to the positions, its words counted,
    and memory that follows the positions, not the line (a list of its every word took 2.2 GB for a 64 MB line)."""
    d = make_dictionary(25)
    export(_convs2s_checkpoint(tmp_path, "convs2s_iwslt_de_en", d), tmp_path / "model")
    translator = Translator(tmp_path / "model")
    limit = translator.model.max_source_positions
    words = [f"w{i % 30}" for i in range(600_000)]  # (w25 to w29 unknown)
    line = " \t".join(words)
    tracemalloc.start()
    try:
        ids = translator.source_ids(line, "line 1")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < len(line), f"{peak} bytes to encode a line of {len(line)}"
    assert ids == [d.index(w) for w in words[: limit - 1]] + [d.eos()]
    assert f"line 1: 600000 words cut to the model's {limit} positions" in caplog.text
    assert translator.max_hypothesis_length(line, 1.0, 0) == min(limit, translator.model.max_target_positions - 1)


def test_lines_longer_than_a_read_arrive_whole(tmp_path):
    """The command's reader gives a line that spans many reads whole, then the lines after it and a last line without
    its newline. (The reader split the whole pending line again at every read, so that a line of megabytes took time
    quadratic in its length; now only a read that brings a newline splits.)"""
    from convs2s_runtime.__main__ import _Lines

    long = b"w5 " * 100_000  # (about five reads)
    path = tmp_path / "in.txt"
    path.write_bytes(long + b"\nw4\n\nw6")
    fd = os.open(path, os.O_RDONLY)
    try:
        lines = _Lines(fd)
        assert [lines.next(wait=True) for _ in range(5)] == [long, b"w4", b"", b"w6", None]
    finally:
        os.close(fd)


def test_a_line_too_short_for_min_len_is_answered_empty(tmp_path):
    """Under ``--max-len-a`` a short line can be too short for ``--min-len``: it is answered with an empty line and
    a warning naming it, and the lines around it are translated whatever the batch (the whole run ended at it, with
    the earlier batches written and the later lines lost)."""
    d = make_dictionary(25)
    export(_convs2s_checkpoint(tmp_path, "convs2s_iwslt_de_en", d), tmp_path / "model")
    lines, flags = ["w1 w2 w3 w4", "w5", "w6 w7 w8"], ["--max-len-a", "1", "--max-len-b", "0", "--min-len", "3"]
    expected = Translator(tmp_path / "model").translate_batch([lines[0], lines[2]], max_len_a=1, max_len_b=0, min_len=3)
    for batch_size in ("1", "2"):
        cmd = [sys.executable, "-m", "convs2s_runtime", str(tmp_path / "model"), *flags, "--batch-size", batch_size]
        proc = subprocess.run(cmd, input="\n".join(lines) + "\n", capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.split("\n")[:-1] == [expected[0].hypotheses[0].text, "", expected[1].hypotheses[0].text]
        assert "line 2: its hypotheses may have at most 2 tokens" in proc.stderr and "answered with an empty line" in (
            proc.stderr
        )
    with pytest.raises(ValueError, match=r"^sources\[1\]: 2 tokens \(EOS included\) allow hypotheses of at most 2"):
        Translator(tmp_path / "model").translate_batch(lines, max_len_a=1, max_len_b=0, min_len=3)


def test_the_command_line_reads_a_file_with_a_byte_order_mark_and_crlf_line_ends(tmp_path):
    """A file some Windows editors save: a UTF-8 byte-order mark before the first line, CRLF line ends. Each line is
    translated as its words (the mark was read as a character of the first word, which became <unk>)."""
    d = make_dictionary(25)
    export(_convs2s_checkpoint(tmp_path, "convs2s_iwslt_de_en", d), tmp_path / "model")
    lines = ["w1 w2 w3", "w4 w5", "", "w6 w7 w8"]
    translator = Translator(tmp_path / "model")
    expected = [r.hypotheses[0].text for r in translator.translate_batch([line for line in lines if line])]
    expected.insert(2, "")
    as_unk = translator.translate_batch(["<unk> w2 w3"])[0].hypotheses[0].text
    assert as_unk != expected[0]  # (the test can fail)
    cmd = [sys.executable, "-m", "convs2s_runtime", str(tmp_path / "model")]
    data = b"\xef\xbb\xbf" + "".join(line + "\r\n" for line in lines).encode()
    proc = subprocess.run(cmd, input=data, capture_output=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.decode().split("\n")[:-1] == expected


def test_the_command_line_writes_the_n_best_with_their_scores(tmp_path):
    """``--nbest N``: N lines for each input line, best first, ``LINE<TAB>SCORE<TAB>TEXT`` with the lines counted
    across batches and the API's hypotheses and scores; an empty line's N lines have no score and no text."""
    d = make_dictionary(25)
    export(_convs2s_checkpoint(tmp_path, "convs2s_iwslt_de_en", d), tmp_path / "model")
    lines = ["w1 w2 w3", "", "w4 w5", "w6 w7 w8 w9"]
    results = Translator(tmp_path / "model").translate_batch([line for line in lines if line], beam_size=3, nbest=2)
    expected = iter(results)
    cmd = [sys.executable, "-m", "convs2s_runtime", str(tmp_path / "model"), "--beam", "3", "--nbest", "2"]
    proc = subprocess.run(cmd + ["--batch-size", "2"], input="\n".join(lines) + "\n", capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = [row.split("\t") for row in proc.stdout.split("\n")[:-1]]
    assert [int(number) for number, _, _ in out] == [0, 0, 1, 1, 2, 2, 3, 3]
    for number, line in enumerate(lines):
        written = out[2 * number : 2 * number + 2]
        if not line:
            assert written == [[str(number), "", ""]] * 2
            continue
        hypotheses = next(expected).hypotheses
        assert [text for _, _, text in written] == [h.text for h in hypotheses]
        assert all(_score_close(float(score), h.score) for (_, score, _), h in zip(written, hypotheses))


def test_the_command_line_answers_a_line_as_it_arrives(tmp_path):
    """A process that writes one line and waits for its translation gets it (the command waited for --batch-size
    lines or the end of input first); a line that is not UTF-8 is answered as read with U+FFFD, with a warning (it
    was sentencepiece's RuntimeError, or a UnicodeDecodeError, and the end of the run)."""
    d = make_dictionary(25)
    export(_convs2s_checkpoint(tmp_path, "convs2s_iwslt_de_en", d), tmp_path / "model")
    expected = Translator(tmp_path / "model").translate_batch(["w1 w2 w3", "w4 \ufffd w5"])
    cmd = [sys.executable, "-m", "convs2s_runtime", str(tmp_path / "model")]
    with subprocess.Popen(cmd, stdin=PIPE, stdout=PIPE, stderr=PIPE, cwd=ROOT) as proc:
        for line, result in zip([b"w1 w2 w3\n", b"w4 \xff w5\n"], expected):
            proc.stdin.write(line)
            proc.stdin.flush()
            assert select.select([proc.stdout], [], [], 300)[0], "no answer to a line while the input stays open"
            assert proc.stdout.readline().decode() == result.hypotheses[0].text + "\n"
        proc.stdin.close()
        assert proc.wait(timeout=120) == 0 and proc.stdout.read() == b""
        assert "line 2 is not UTF-8" in proc.stderr.read().decode()


def test_the_command_line_ends_in_one_line(tmp_path):
    """Flags out of range and settings no line can meet end the run in one line; a reader that goes away
    (``| head``) ends it quietly, as SIGPIPE would (141); an interrupt says how many lines were answered (130).
    Each was a traceback."""
    d = make_dictionary(25)
    export(_convs2s_checkpoint(tmp_path, "convs2s_iwslt_de_en", d), tmp_path / "model")
    cmd = [sys.executable, "-m", "convs2s_runtime", str(tmp_path / "model"), "--batch-size", "1"]
    for flags, status, message in [
        (["--threads", "0"], 2, "error: --threads must be at least 1, got 0\n"),
        (["--max-len-b", "0"], 1, "error: --max-len-a 0.0 --max-len-b 0 allow no line a hypothesis of --min-len 1"),
        (["--device", "tpu9"], 1, "convs2s_runtime: error: device 'tpu9': "),
        (["--nbest", "6"], 2, "error: --nbest 6 asks for more hypotheses than --beam 5 keeps\n"),
    ]:
        proc = subprocess.run(cmd + flags, input="w1 w2\n", capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == status and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stdout == ""
    closed = subprocess.run(["bash", "-c", 'exec "$@" <&-', "-", *cmd], capture_output=True, text=True, cwd=ROOT)
    assert closed.returncode == 2 and "error: stdin closed: the command reads lines from stdin" in closed.stderr
    for end in ("reader gone", "interrupt"):
        with subprocess.Popen(cmd, stdin=PIPE, stdout=PIPE, stderr=PIPE, text=True, cwd=ROOT) as proc:
            proc.stdin.write("w1 w2\nw3\n")
            proc.stdin.flush()
            assert proc.stdout.readline() and proc.stdout.readline()  # two lines answered
            if end == "reader gone":
                proc.stdout.close()
                proc.stdin.write("w4\n")
                proc.stdin.close()
                assert proc.wait(timeout=120) == 141 and proc.stderr.read() == ""
            else:
                wait_until_sleeping(proc.pid)  # (past the count of lines answered: the message is exact)
                proc.send_signal(signal.SIGINT)
                assert proc.wait(timeout=120) == 130
                assert proc.stderr.read() == (
                    "convs2s_runtime: interrupted after writing the translations of the first 2 lines\n"
                )


def test_hypotheses_carry_attention_over_the_source(tmp_path):
    d = make_dictionary(25)
    export(_convs2s_checkpoint(tmp_path, "convs2s_iwslt_de_en", d), tmp_path / "model")
    (result,) = Translator(tmp_path / "model").translate_batch(["w1 w2 w3"], return_attention=True, nbest=2)
    for hypothesis in result.hypotheses:
        attention = torch.tensor(hypothesis.attention)
        assert attention.shape == (len(hypothesis.tokens) + 1, 4)  # target tokens and EOS x source tokens and EOS
        torch.testing.assert_close(attention.sum(1), torch.ones(len(attention)))


@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="this CPU has no bf16 instructions")
def test_bf16_decodes_close_to_fp32(tmp_path):
    d = make_dictionary(25)
    export(_convs2s_checkpoint(tmp_path, "convs2s_iwslt_de_en", d), tmp_path / "model")
    sources = _sources(d, random_batch(d, [9, 5, 7, 3, 6, 8], seed=7))
    fp32 = Translator(tmp_path / "model").translate_batch(sources)
    bf16 = Translator(tmp_path / "model", compute_type="bfloat16")
    assert bf16.compute_type == "bfloat16" and bf16.model.step_weights.blocks[0].conv.bias.dtype == torch.bfloat16
    for a, b in zip(fp32, bf16.translate_batch(sources)):
        assert math.isfinite(b.hypotheses[0].score) and abs(a.hypotheses[0].score - b.hypotheses[0].score) < 0.1


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A small model trained by fairseq-train on the toy corpus, and fairseq-generate's output on its test set."""
    folder = tmp_path_factory.mktemp("runtime")
    make_splits(folder, {"train": 1000, "valid": 50, "test": 41})
    preprocess(folder, "bin", trainpref="train", validpref="valid", testpref="test")
    train(folder, "bin", "ckpt", "--max-epoch", "4")
    generated = generate(folder, "bin", "ckpt/checkpoint_last.pt")
    return folder, hypothesis_lines(generated.stdout)


def test_the_command_line_equals_fairseq_generate(trained):
    """Exported by the command line, translated by ``python -m convs2s_runtime``: fairseq-generate's best
    hypothesis for every test sentence; the API's score is fairseq's (it prints log base 2) to 1e-4."""
    folder, lines = trained
    check_ok(subprocess.run(
        [sys.executable, "-m", "fairseq_convs2s.export", "ckpt/checkpoint_last.pt", "model"],
        cwd=folder, capture_output=True, text=True,
    ))  # fmt: skip
    sources = [lines["S"][i] for i in sorted(lines["S"])]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    cmd = [sys.executable, "-m", "convs2s_runtime", "model"]
    proc = subprocess.run(cmd, input="\n".join(sources) + "\n", capture_output=True, text=True, cwd=folder, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:-1] == [" ".join(split_hypothesis(lines["H"][i])[1]) for i in sorted(lines["S"])]
    results = Translator(folder / "model").translate_batch(sources)
    for i, result in zip(sorted(lines["S"]), results):
        assert _score_close(result.hypotheses[0].score / math.log(2), split_hypothesis(lines["H"][i])[0])
    assert len(sources) == 41 and EVAL_FLAGS  # (fairseq-generate kept every sentence: see EVAL_FLAGS)


def test_the_api_names_what_it_cannot_translate(tmp_path):
    """A string where a list of them belongs (it was read as one source a character), a source that is not a str,
    settings out of range and a device this torch lacks: TypeError or ValueError naming the argument, before
    anything is decoded (they failed inside the search or in torch, or translated characters)."""
    d = make_dictionary(25)
    _exported(tmp_path, "convs2s_iwslt_de_en", d)
    translator = Translator(tmp_path / "model")
    source = " ".join(d[i] for i in range(4, 8))
    calls = [
        (TypeError, "pass [source]", dict(sources=source)),
        (TypeError, "sources[1] must be a str, got NoneType", dict(sources=[source, None])),
        (TypeError, "sources[0] must be a str, got bytes", dict(sources=[source.encode()])),
        (TypeError, "beam_size must be an int, got float 2.5", dict(beam_size=2.5)),
        (ValueError, "beam_size must be at least 1, got 0", dict(beam_size=0)),
        (ValueError, "max_len_b must be at least 0, got -1", dict(max_len_b=-1)),
        (ValueError, "max_batch_size must be at least 0, got -1", dict(max_batch_size=-1)),
        (ValueError, "length_penalty must be a finite number, got nan", dict(length_penalty=float("nan"))),
        (ValueError, "nbest (3) <= beam_size (2)", dict(beam_size=2, nbest=3)),
    ]
    for error, message, kwargs in calls:
        with pytest.raises(error, match=re.escape(message)):
            translator.translate_batch(**{"sources": [source], **kwargs})
    assert len(translator.translate_batch([source, ""])) == 2  # (an empty source is a source, as in fairseq)
    with pytest.raises(ValueError, match="threads must be at least 1, got 0"):
        Translator(tmp_path / "model", threads=0)
    with pytest.raises(ValueError, match=f"threads must be at most {os.cpu_count()}, the CPUs this machine has"):
        Translator(tmp_path / "model", threads=os.cpu_count() + 1)  # (thousands crashed OpenMP)
    for device, message in [("tpu9", "device 'tpu9': "), ("meta", "device 'meta': the runtime decodes on cpu or cuda")]:
        with pytest.raises(ValueError, match=message):
            Translator(tmp_path / "model", device=device)
    with pytest.raises(ValueError, match="checkpoint.pt is a file, not a model folder: export a checkpoint first"):
        Translator(tmp_path / "checkpoint.pt")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device 'cuda': this torch sees no CUDA GPU"):
            Translator(tmp_path / "model", device="cuda")


def test_the_api_reads_any_iterable_and_keeps_the_beam_in_the_vocabulary(tmp_path):
    """Sources given as a generator are translated (they were read up by the type check: no result at all); a beam
    wider than the target vocabulary less one is narrowed to it, as fairseq's (it was an IndexError in the
    search); a huge ``max_len_a`` is the target positions (it overflowed)."""
    d = make_dictionary(12)
    model = _exported(tmp_path, "convs2s_iwslt_de_en", d)
    src = random_batch(d, [6, 3, 5], seed=2)
    sources = _sources(d, src)
    translator = Translator(tmp_path / "model")
    listed = translator.translate_batch(sources, max_len_b=12)
    assert translator.translate_batch((s for s in sources), max_len_b=12) == listed
    widest = len(d) - 1
    wide = translator.translate_batch(sources, beam_size=widest + 5, max_len_b=12, nbest=widest)
    assert wide == translator.translate_batch(sources, beam_size=widest, max_len_b=12, nbest=widest)
    _assert_same_beams(wide, beam_search([model], d, src, beam_size=widest + 5, max_len_b=12), d)
    with pytest.raises(ValueError, match=f"nbest {widest + 1}: the target vocabulary of {len(d)} symbols allows"):
        translator.translate_batch(sources, beam_size=widest + 5, nbest=widest + 1)
    (huge,) = translator.translate_batch(sources[:1], max_len_a=1e308, beam_size=1)
    assert (
        huge.hypotheses
        and translator.max_hypothesis_length(sources[0], 1e308) == translator.model.max_target_positions - 1
    )


def test_the_text_leaves_out_bos_as_fairseqs(tmp_path):
    """A hypothesis of ``<s>`` tokens keeps them in ``tokens`` and leaves them out of ``text``, as fairseq's
    ``Dictionary.string`` does (the runtime wrote them), also for a folder exported before the config named ``bos``."""
    d = make_dictionary(25)
    export(_convs2s_checkpoint(tmp_path, "convs2s_iwslt_de_en", d), tmp_path / "model")
    weights = torch.load(tmp_path / "model" / "model.pt")
    weights["decoder.output_projection.bias"][d.bos()] = 1e4  # (every step's best token: <s>)
    torch.save(weights, tmp_path / "model" / "model.pt")
    config_file = tmp_path / "model" / "config.json"
    config = json.loads(config_file.read_text())
    assert config["bos"] == d.bos()
    for named in (True, False):
        if not named:  # (as a folder exported before)
            del config["bos"]
            config_file.write_text(json.dumps(config))
        (result,) = Translator(tmp_path / "model").translate_batch(["w1 w2 w3"], max_len_b=3, beam_size=1)
        assert result.hypotheses[0].tokens == ["<s>"] * 3 and result.hypotheses[0].text == ""


def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    d = make_dictionary(25)
    checkpoint = _convs2s_checkpoint(tmp_path, "convs2s_iwslt_de_en", d)
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint\n")
    other = tmp_path / "other.pt"
    torch.save({"args": argparse.Namespace(arch="transformer"), "model": {}}, other)
    big = make_dictionary(33)
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    big.save(str(wrong / "dict.src.txt"))
    big.save(str(wrong / "dict.tgt.txt"))
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("keep me")
    project = tmp_path / "project"  # (another tool's config.json: it was taken for an earlier export and deleted)
    (project / ".git").mkdir(parents=True)
    (project / ".git" / "HEAD").write_text("ref")
    (project / "config.json").write_text('{"lr": 0.1}')
    notes = tmp_path / "notes"
    assert export_main([str(checkpoint), str(notes)]) == 0
    (notes / "NOTES.md").write_text("mine")
    cases = [
        ([str(text), str(tmp_path / "a")], "is not a torch checkpoint"),
        ([str(other), str(tmp_path / "b")], "arch 'transformer'"),
        ([str(checkpoint), str(tmp_path / "c"), "--data", str(wrong)], "dictionary mismatch"),
        ([str(checkpoint), str(taken)], "not an earlier export"),
        ([str(checkpoint), str(project)], "not an earlier export"),
        ([str(checkpoint), str(notes)], "an earlier export that also holds NOTES.md, which replacing it would delete"),
        ([str(checkpoint), str(tmp_path / "d"), "--data", str(tmp_path / "nowhere")], "--data"),
        ([str(checkpoint), str(tmp_path / "e"), "--sentencepiece-model", str(text)], "not a sentencepiece model"),
    ]
    before = sorted(p.name for p in tmp_path.iterdir())
    for argv, message in cases:
        assert export_main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith("export: error: ") and message in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing half-written
    assert (taken / "mine.txt").read_text() == "keep me" and (project / ".git" / "HEAD").read_text() == "ref"
    assert (notes / "NOTES.md").read_text() == "mine"
    assert export_main([str(checkpoint), str(tmp_path / "model")]) == 0
    assert export_main([str(checkpoint), str(tmp_path / "model")]) == 0  # an earlier export is replaced


def test_a_broken_model_folder_is_named_in_one_line(tmp_path):
    """A model folder whose files do not load or do not fit together: a ``ValueError`` naming the file and what is
    wrong, and one line from the command. A model.pt of another export or a config.json missing a setting was a
    ``KeyError`` traceback, a truncated sentencepiece model sentencepiece's ``RuntimeError``."""
    d = make_dictionary(25)
    export(_convs2s_checkpoint(tmp_path, "convs2s_iwslt_de_en", d), tmp_path / "model")
    other = _convs2s_checkpoint(tmp_path / "other", "convs2s_iwslt_de_en", d, decoder_attention="[False, True, True]")
    export(other, tmp_path / "o")  # (no attention in the first block: its weights are not there)
    import sentencepiece as spm

    text = tmp_path / "text.txt"
    text.write_text("".join(f"w{i} w{i + 1} w{i + 2}\n" for i in range(4, 24)))
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "spm"), vocab_size=30, minloglevel=2)

    def broken(name: str, change) -> Path:
        folder = tmp_path / name
        shutil.copytree(tmp_path / "model", folder)
        change(folder)
        return folder

    def without_attention(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        del config["decoder"]["attention"]
        (folder / "config.json").write_text(json.dumps(config))

    cases = [
        (lambda f: shutil.copy(tmp_path / "o" / "model.pt", f), "model.pt and config.json do not describe one model"),
        (without_attention, "model.pt and config.json do not describe one model (KeyError: 'attention')"),
        (lambda f: (f / "model.pt").write_bytes(b"PK"), "model.pt: cannot be read"),
        (lambda f: (f / "config.json").unlink(), "no config.json: not a model folder"),
        (lambda f: (f / "config.json").write_text("{"), "config.json: not JSON"),
        (lambda f: (f / "source_vocabulary.txt").unlink(), "no source_vocabulary.txt"),
        (
            lambda f: (f / "target_vocabulary.txt").write_text("a\nb\n"),
            "the target vocabulary has 2 symbols, the model",
        ),
        (
            lambda f: (f / "sentencepiece.model").write_bytes((tmp_path / "spm.model").read_bytes()[:100]),
            "sentencepiece.model: not a sentencepiece model",
        ),
    ]
    for k, (change, message) in enumerate(cases):
        folder = broken(f"broken{k}", change)
        with pytest.raises(ValueError, match=re.escape(message)):
            Translator(folder)
    proc = subprocess.run(
        [sys.executable, "-m", "convs2s_runtime", str(tmp_path / "broken0")],
        input="w4 w5\n", capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 1 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("convs2s_runtime: error: ") and "do not describe one model" in proc.stderr


def test_export_through_a_link_writes_the_folder_it_points_to(tmp_path):
    """An OUT_DIR that is a link to an earlier export: the folder it points to is replaced and the link kept (the
    link was replaced by a folder, and the next export failed)."""
    d = make_dictionary(25)
    checkpoint = _convs2s_checkpoint(tmp_path, "convs2s_iwslt_de_en", d)
    assert export_main([str(checkpoint), str(tmp_path / "real")]) == 0
    (tmp_path / "link").symlink_to("real")
    for _ in range(2):
        (tmp_path / "real" / "config.json").write_text(json.dumps({"format": "convs2s-runtime", "stale": True}))
        assert export_main([str(checkpoint), str(tmp_path / "link")]) == 0
        assert (tmp_path / "link").is_symlink() and "stale" not in json.loads(
            (tmp_path / "real" / "config.json").read_text()
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "data", "link", "real"]


def test_an_interrupted_export_leaves_the_earlier_one_and_a_reader_that_goes_ends_nothing(
    tmp_path, monkeypatch, capsys
):
    """Ctrl-C during an export was a traceback, and between its two renames left the earlier export only under a
    hidden name; ``export ... | true`` wrote the folder, then a BrokenPipeError traceback."""
    from fairseq_convs2s import export as export_module

    checkpoint = _convs2s_checkpoint(tmp_path, "convs2s_iwslt_de_en", make_dictionary(25))
    model = tmp_path / "model"
    assert export_main([str(checkpoint), str(model)]) == 0
    (model / "config.json").write_text(json.dumps({"format": "convs2s-runtime", "earlier": True}))
    replaces = []

    def interrupted_replace(src, dst):
        replaces.append(dst)
        if len(replaces) == 2:  # the new folder's rename into place
            raise KeyboardInterrupt
        os.rename(src, dst)

    monkeypatch.setattr(export_module.os, "replace", interrupted_replace)
    capsys.readouterr()
    assert export_main([str(checkpoint), str(model)]) == 130
    assert capsys.readouterr().err == f"export: interrupted; {model} is as it was\n"
    monkeypatch.undo()
    assert json.loads((model / "config.json").read_text())["earlier"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "data", "model"]

    cmd = [sys.executable, "-m", "fairseq_convs2s.export", str(checkpoint), str(tmp_path / "piped")]
    proc = subprocess.Popen(cmd, stdout=PIPE, stderr=PIPE, cwd=tmp_path)
    proc.stdout.close()  # (the reader gone before the export ends)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err
    assert (tmp_path / "piped" / "config.json").exists()


def test_export_checks_the_sentencepiece_model_and_the_languages(tmp_path, capsys):
    """A sentencepiece model that did not encode the data is refused (the runtime wrote garbage); a dictionary of
    pieces exported without one gets a warning; a checkpoint and data folder that do not say the languages ask for
    --source-lang and --target-lang (it looked for dict.None.txt)."""
    import sentencepiece as spm

    text = tmp_path / "text.txt"
    text.write_text("".join(f"the cat {w} on the mat with a {w}s hat\n" for w in ("sat", "lay", "ran", "hid")) * 5)
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "spm"), vocab_size=24, minloglevel=2)
    pieces = Dictionary()
    processor = spm.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))
    for i in range(3, processor.get_piece_size()):  # (after <unk>, <s>, </s>)
        pieces.add_symbol(processor.id_to_piece(i))
    (tmp_path / "pieces").mkdir()
    checkpoint = _convs2s_checkpoint(tmp_path / "pieces", "convs2s_iwslt_de_en", pieces)
    assert export_main([str(checkpoint), str(tmp_path / "bare")]) == 0
    assert "no --sentencepiece-model was given: the runtime will read and write pieces" in capsys.readouterr().err
    assert (
        export_main([str(checkpoint), str(tmp_path / "m"), "--sentencepiece-model", str(tmp_path / "spm.model")]) == 0
    )
    assert "warning" not in capsys.readouterr().err
    assert export_main([str(checkpoint), str(tmp_path / "my model")]) == 0  # (the command it prints, quoted)
    assert f"translate with: python -m convs2s_runtime '{tmp_path / 'my model'}'\n" in capsys.readouterr().out
    processor_pieces = {processor.id_to_piece(i) for i in range(processor.get_piece_size())}
    translator = Translator(tmp_path / "m")
    (result,) = translator.translate_batch(["the cat sat"])
    assert "\u2581" not in result.hypotheses[0].text
    # the source ids fairseq-interactive gives (pieces joined by spaces and split again): a piece of a character that
    # splitting takes for a space (U+0085, cp1252's ellipsis read as Latin-1) is none (it was an <unk>)
    for line in ("the cat\u0085 sat", "the\u001fcat hid\u0085", "the cat sat"):
        fairseq_ids = pieces.encode_line(" ".join(processor.encode(line, out_type=str)), add_if_not_exist=False)
        assert translator.source_ids(line) == fairseq_ids.tolist(), line
    # a line of more words than 8 a position, encoded from its head alone: the ids of the whole line, cut
    limit = translator.model.max_source_positions
    line = "the cat sat on the\u0085 mat " * (2 * limit)
    whole = pieces.encode_line(" ".join(processor.encode(line, out_type=str)), add_if_not_exist=False).tolist()
    assert translator.source_ids(line) == whole[: limit - 1] + [pieces.eos()]

    words = _convs2s_checkpoint(tmp_path, "convs2s_iwslt_de_en", make_dictionary(25))
    assert export_main([str(words), str(tmp_path / "w"), "--sentencepiece-model", str(tmp_path / "spm.model")]) == 1
    assert "only 0 of the dictionary's 25 words are its pieces" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()
    # a model that shares half the words (one of another corpus, with a similar vocabulary) is refused too, and so
    # is a model that encoded one side of separate dictionaries alone (the runtime applies it to both)
    half = Dictionary()
    for i, symbol in enumerate(pieces.symbols[pieces.nspecial :]):
        half.add_symbol(f"other{i}" if i % 2 else symbol)
    (tmp_path / "half").mkdir()
    half_pieces = _convs2s_checkpoint(tmp_path / "half", "convs2s_iwslt_de_en", half)
    assert (
        export_main([str(half_pieces), str(tmp_path / "h"), "--sentencepiece-model", str(tmp_path / "spm.model")]) == 1
    )
    found = sum(symbol in processor_pieces for symbol in half.symbols[half.nspecial :])
    assert f"only {found} of the dictionary's {len(half) - half.nspecial} words are its pieces" in (
        capsys.readouterr().err
    )
    assert 0.5 * (len(half) - half.nspecial) <= found < len(half) - half.nspecial
    with pytest.raises(ExportError, match="only 0 of the target dictionary's 25 words are its pieces"):
        _check_sentencepiece(tmp_path / "spm.model", processor_pieces, (pieces, make_dictionary(25)))
    assert _check_sentencepiece(tmp_path / "spm.model", processor_pieces, (pieces, pieces)) == []

    state = torch.load(words, weights_only=False)
    state["args"].source_lang = state["args"].target_lang = None
    torch.save(state, tmp_path / "nolangs.pt")
    assert export_main([str(tmp_path / "nolangs.pt"), str(tmp_path / "n")]) == 1
    assert "says which languages the model translates (dict.src.txt, dict.tgt.txt there): pass --source-lang" in (
        capsys.readouterr().err
    )
    assert (
        export_main([str(tmp_path / "nolangs.pt"), str(tmp_path / "n"), "--source-lang", "src", "--target-lang", "tgt"])
        == 0
    )
    assert json.loads((tmp_path / "n" / "config.json").read_text())["source_lang"] == "src"
