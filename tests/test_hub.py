"""``ConvS2SModel.from_pretrained`` (fairseq's hub interface), fconv checkpoints converted on first load, and a
checkpoint loaded against data whose dictionary is not the one it was trained with.

Two models: a plugin-trained one (``fairseq-train`` on the toy corpus of ``cli_helpers`` through a sentencepiece
model trained here), and a stock-fairseq fconv model trained in-process and saved in a directory laid out like the
published fconv archives (``fconv_helpers.write_fconv_archive``).
"""

import logging
import os
import re
import shutil
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import sentencepiece as spm
import torch
from cli_helpers import PLUGIN_DIR, check_ok, generate, hypothesis_lines, make_splits, preprocess, run_cli, tail, train
from fairseq import hub_utils
from fairseq.hub_utils import GeneratorHubInterface
from fairseq.models.fconv import FConvModel
from fconv_helpers import write_fconv_archive
from utils import make_dictionary

from fairseq_convs2s import ConvS2SModel
from fairseq_convs2s.models import pretrained as hub_module
from fairseq_convs2s.models.fconv_checkpoint import ConversionError

# toy-corpus sentences (source words s<i>; the target is t<i> in reverse order)
SPM_SENTENCES = ["s1 s2 s3", "s4 s10 s12 s7 s20", "s23 s0", "s5 s5 s6 s9 s11 s14 s15"]
# sentences in the fconv model's dictionary (w0 ... w24)
FCONV_SENTENCES = ["w3 w5 w7 w1", "w10 w2", "w20 w21 w22 w23 w24 w0 w4", "w8"]
# both models are barely trained and rarely stop on their own: cap their outputs (fairseq's default is 200 tokens)
MAX_LEN_B = 16


@pytest.fixture(autouse=True, scope="module")
def quiet_fairseq():
    """fairseq logs every config it loads at INFO; keep the test output readable (restored afterwards)."""
    logger = logging.getLogger("fairseq")
    level = logger.level
    logger.setLevel(logging.WARNING)
    yield
    logger.setLevel(level)


def _interactive(folder: Path, data: str, checkpoint: str, lines, *extra: str):
    args = [data, "--user-dir", PLUGIN_DIR, "--path", checkpoint, "--source-lang", "src", "--target-lang", "tgt"]
    proc = run_cli("interactive", [*args, "--cpu", "--beam", "5", *extra], cwd=folder, stdin="\n".join(lines) + "\n")
    return check_ok(proc)


# ---- a plugin-trained model, through sentencepiece ---------------------------------------------------------------


@pytest.fixture(scope="module")
def spm_trained(tmp_path_factory):
    """The toy corpus through a joint sentencepiece model (30 pieces, so words split into pieces), binarized
    with a joined dictionary, and a small convs2s model trained on it with ``fairseq-train``."""
    folder = tmp_path_factory.mktemp("hub_spm")
    make_splits(folder, {"train": 200, "valid": 20}, seed=3)
    spm.SentencePieceTrainer.train(
        input=f"{folder / 'train.src'},{folder / 'train.tgt'}",
        model_prefix=str(folder / "spm"),
        vocab_size=30,
        character_coverage=1.0,
        model_type="bpe",
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_file=str(folder / "spm.model"))
    for split in ("train", "valid"):
        for side in ("src", "tgt"):
            lines = (folder / f"{split}.{side}").read_text().splitlines()
            encoded = "".join(" ".join(sp.encode(line, out_type=str)) + "\n" for line in lines)
            (folder / f"{split}.spm.{side}").write_text(encoded)
    preprocess(folder, "bin", "--joined-dictionary", trainpref="train.spm", validpref="valid.spm")
    train(folder, "bin", "ckpt", "--max-epoch", "2")
    return SimpleNamespace(folder=folder, data=folder / "bin", ckpt=folder / "ckpt", spm=folder / "spm.model")


def test_from_pretrained_translates_like_fairseq_interactive(spm_trained):
    """from_pretrained on a plugin-trained checkpoint directory with bpe='sentencepiece' returns fairseq's hub
    interface around the convs2s model; .translate() gives, sentence by sentence, what fairseq-interactive prints
    (D- lines: detokenized) for the same checkpoint, data and sentencepiece model at beam 5, and the same scores."""
    hub = ConvS2SModel.from_pretrained(
        str(spm_trained.ckpt),
        checkpoint_file="checkpoint_last.pt",
        data_name_or_path=str(spm_trained.data),
        bpe="sentencepiece",
        sentencepiece_model=str(spm_trained.spm),
    )
    assert isinstance(hub, GeneratorHubInterface) and isinstance(hub.models[0], ConvS2SModel)
    translations = hub.translate(SPM_SENTENCES, max_len_b=MAX_LEN_B)
    assert hub.translate(SPM_SENTENCES[0], max_len_b=MAX_LEN_B) == translations[0]  # a single string in, a string out
    # the sentencepiece model is applied on the way in and undone on the way out (joined dictionary: decode works)
    pieces = spm.SentencePieceProcessor(model_file=str(spm_trained.spm)).encode("s1 s19", out_type=str)
    assert hub.src_dict.string(hub.encode("s1 s19")) == " ".join(pieces) and len(pieces) > 2, pieces
    assert [hub.decode(hub.encode(s)) for s in SPM_SENTENCES] == SPM_SENTENCES

    proc = _interactive(
        spm_trained.folder, "bin", "ckpt/checkpoint_last.pt", SPM_SENTENCES,
        "--bpe", "sentencepiece", "--sentencepiece-model", spm_trained.spm, "--max-len-b", str(MAX_LEN_B),
    )  # fmt: skip
    lines = hypothesis_lines(proc.stdout)
    cli = [lines["D"][i].split("\t", 1) for i in range(len(SPM_SENTENCES))]
    assert [text for _, text in cli] == translations, tail(proc)

    hypos = hub.generate([hub.encode(s) for s in SPM_SENTENCES], beam=5, max_len_b=MAX_LEN_B)
    base2 = [h[0]["score"].item() / torch.log(torch.tensor(2.0)).item() for h in hypos]  # interactive prints base 2
    assert [float(score) for score, _ in cli] == pytest.approx(base2, abs=1e-4)
    assert not list(spm_trained.ckpt.glob("*.convs2s.pt")), "a convs2s checkpoint must not be converted"


def test_from_pretrained_decodes_in_bf16_when_asked_not_because_training_did(spm_trained, tmp_path):
    """The hub interface hands the checkpoint's saved settings to the model's preparation for inference: a model
    trained with --bf16 (its checkpoint says bf16) still decodes in fp32 unless ``bf16=True`` is asked, which casts
    it to bfloat16; it then translates every sentence with scores near the fp32 ones, not equal to them."""
    state = torch.load(spm_trained.ckpt / "checkpoint_last.pt", weights_only=False)
    state["cfg"]["common"]["bf16"] = True  # as a checkpoint of a run with --bf16 records it
    torch.save(state, tmp_path / "checkpoint_last.pt")
    kwargs = dict(
        checkpoint_file="checkpoint_last.pt",
        data_name_or_path=str(spm_trained.data),
        bpe="sentencepiece",
        sentencepiece_model=str(spm_trained.spm),
    )
    fp32 = ConvS2SModel.from_pretrained(str(tmp_path), **kwargs)
    bf16 = ConvS2SModel.from_pretrained(str(tmp_path), bf16=True, **kwargs)
    assert {p.dtype for p in fp32.models[0].parameters()} == {torch.float32}
    assert {p.dtype for p in bf16.models[0].parameters()} == {torch.bfloat16}
    loaded = hub_utils.from_pretrained(str(tmp_path), archive_map=None, **kwargs)  # fairseq's own route (was bf16)
    fairseqs = GeneratorHubInterface(loaded["args"], loaded["task"], loaded["models"])
    assert {p.dtype for p in fairseqs.models[0].parameters()} == {torch.float32}

    sources = [fp32.encode(s) for s in SPM_SENTENCES]
    scores = [
        [h[0]["score"].item() for h in hub.generate(sources, beam=5, max_len_b=MAX_LEN_B)] for hub in (fp32, bf16)
    ]
    assert scores[0] != scores[1] and scores[1] == pytest.approx(scores[0], abs=0.1), scores
    assert len(bf16.translate(SPM_SENTENCES, max_len_b=MAX_LEN_B)) == len(SPM_SENTENCES)


def test_translate_names_bad_arguments_and_answers_every_sentence(spm_trained):
    """The hub's translate: None, bytes, a list holding None, a float beam and a misspelt option are a TypeError
    naming them (fairseq: NoneType is not iterable, sentencepiece's 'Input must be str or bytes', a failure inside
    the search, an option set and ignored). A sentence longer than the positions is a ValueError naming it and its
    length (fairseq: a bare Exception naming a command-line flag); with skip_invalid_size_inputs=True it gets an
    empty translation in its place (fairseq left it out: the rest shifted one place up)."""
    hub = ConvS2SModel.from_pretrained(
        str(spm_trained.ckpt), "checkpoint_last.pt", str(spm_trained.data), bpe="sentencepiece",
        sentencepiece_model=str(spm_trained.spm),
    )  # fmt: skip
    calls = [
        ("sentences must be a str or a list of str, got NoneType", (None,), {}),
        ("sentences must be a str or a list of str, got bytes", (b"s1 s2",), {}),
        ("sentences[1] must be a str, got NoneType", (["s1", None],), {}),
        ("beam must be an int, got float 2.5", ("s1",), {"beam": 2.5}),
        ("no generation option lenpn", ("s1",), {"lenpn": 2.0}),
    ]
    for message, args, kwargs in calls:
        with pytest.raises(TypeError, match=re.escape(message)):
            hub.translate(*args, **kwargs)

    positions = hub.max_positions[0]
    long = " ".join(["s1"] * positions)  # (each word one piece or more, EOS added: over the limit)
    sentences = [SPM_SENTENCES[0], long, SPM_SENTENCES[1]]
    with pytest.raises(
        ValueError,
        match=rf"longer than the model's {positions} source positions \(EOS included; sentence 1: \d+ tokens\)",
    ):
        hub.translate(sentences, max_len_b=MAX_LEN_B)
    tokens = [hub.encode(s) for s in sentences]
    fairseq_alone = GeneratorHubInterface.generate.__wrapped__
    with pytest.raises(Exception, match="--skip-invalid-size-inputs-valid-test"):
        fairseq_alone(hub, tokens, max_len_b=MAX_LEN_B)
    answered = hub.translate(sentences, skip_invalid_size_inputs=True, max_len_b=MAX_LEN_B)
    first, second = (hub.translate(s, max_len_b=MAX_LEN_B) for s in SPM_SENTENCES[:2])
    assert answered == [first, "", second]
    hypos = hub.generate(tokens, skip_invalid_size_inputs=True, max_len_b=MAX_LEN_B)
    assert [len(h) for h in hypos] == [5, 0, 5]
    assert len(fairseq_alone(hub, tokens, skip_invalid_size_inputs=True, max_len_b=MAX_LEN_B)) == 2  # (shifted up)
    # one sentence as one tensor: no hypothesis (fairseq's path for it dropped the flag, and the error asked for it)
    assert hub.generate(tokens[1], skip_invalid_size_inputs=True, max_len_b=MAX_LEN_B) == []
    # nbest: that many hypotheses a sentence (fairseq set it on its config, read by nothing: the whole beam)
    assert [len(h) for h in hub.generate([tokens[0], tokens[2]], nbest=3, max_len_b=MAX_LEN_B)] == [3, 3]
    # no room for a hypothesis: named (fairseq: AssertionError "min_len cannot be larger than max_len")
    with pytest.raises(ValueError, match=re.escape("--max-len-b 0 (with --max-len-a 0) leaves no room")):
        hub.translate(SPM_SENTENCES[0], max_len_b=0)


def test_a_sentence_longer_than_max_tokens_is_answered_in_its_place(spm_trained):
    """from_pretrained(..., max_tokens=N) caps each batch at N tokens: a sentence longer than that (but within the
    positions) was left out by fairseq's batcher with skip_invalid_size_inputs=True, the rest shifted up; now it is
    answered with no translation in its place, and without the flag named with the limit and how to raise it."""
    kwargs = dict(bpe="sentencepiece", sentencepiece_model=str(spm_trained.spm))
    hub = ConvS2SModel.from_pretrained(str(spm_trained.ckpt), "checkpoint_last.pt", str(spm_trained.data), **kwargs)
    short = [hub.encode(s) for s in SPM_SENTENCES[:2]]
    limit = max(len(t) for t in short)
    long = " ".join(["s1"] * limit)  # (over the limit, within the positions)
    capped = ConvS2SModel.from_pretrained(
        str(spm_trained.ckpt), "checkpoint_last.pt", str(spm_trained.data), max_tokens=limit, **kwargs
    )
    assert len(capped.encode(long)) > limit
    sentences = [SPM_SENTENCES[0], long, SPM_SENTENCES[1]]
    with pytest.raises(ValueError, match=rf"longer than max_tokens {limit} \(from_pretrained\(\.\.\., max_tokens=N\)"):
        capped.translate(sentences, max_len_b=MAX_LEN_B)
    answered = capped.translate(sentences, skip_invalid_size_inputs=True, max_len_b=MAX_LEN_B)
    assert answered == [
        hub.translate(SPM_SENTENCES[0], max_len_b=MAX_LEN_B),
        "",
        hub.translate(SPM_SENTENCES[1], max_len_b=MAX_LEN_B),
    ]


def test_a_data_folder_without_dictionaries_is_named(spm_trained):
    """The checkpoint directory alone (data_name_or_path left at '.'): fairseq's hub stopped with a bare
    ``Exception: Could not infer language pair``; the plugin names the folder and the argument to pass."""
    with pytest.raises(Exception, match="Could not infer language pair"):
        hub_utils.from_pretrained(str(spm_trained.ckpt), "checkpoint_last.pt", ".")
    with pytest.raises(
        FileNotFoundError, match=r"no fairseq dictionaries \(dict.<lang>.txt\) in .*ckpt: pass data_name"
    ):
        ConvS2SModel.from_pretrained(str(spm_trained.ckpt), checkpoint_file="checkpoint_last.pt")
    with pytest.raises(FileNotFoundError, match=r"in .*no_such_folder: pass data_name_or_path"):
        ConvS2SModel.from_pretrained(str(spm_trained.ckpt), "checkpoint_last.pt", "./no_such_folder")
    relative = ConvS2SModel.from_pretrained(str(spm_trained.ckpt), "checkpoint_last.pt", "../bin")  # fairseq's '.'
    assert isinstance(relative, GeneratorHubInterface)


def test_a_checkpoint_or_dictionary_file_for_a_folder_is_named(spm_trained, tmp_path):
    """The checkpoint file given for its folder, or a dictionary file for the data folder: fairseq took any local
    file for an archive and stopped in ``tarfile.CompressionError: unknown compression type 'pt'`` ('txt'); the
    plugin says what to pass instead. A real archive of the data folder is still unpacked and used."""
    checkpoint = spm_trained.ckpt / "checkpoint_last.pt"
    with pytest.raises(ValueError) as error:
        ConvS2SModel.from_pretrained(str(checkpoint), data_name_or_path=str(spm_trained.data))
    assert str(error.value) == (
        f"{checkpoint} is a file, not a model directory nor a .tar.gz/.bz2/.xz archive: pass its folder and the "
        f"checkpoint's name, from_pretrained('{spm_trained.ckpt}', checkpoint_file='checkpoint_last.pt')"
    )
    dictionary = spm_trained.data / "dict.src.txt"
    with pytest.raises(ValueError) as error:
        ConvS2SModel.from_pretrained(str(spm_trained.ckpt), "checkpoint_last.pt", str(dictionary))
    assert str(error.value) == (
        f"data_name_or_path: {dictionary} is a file, not a folder nor a .tar.gz/.bz2/.xz archive: pass the "
        "fairseq-preprocess folder holding the dict.<lang>.txt files"
    )
    with tarfile.open(tmp_path / "bin.tar.gz", "w:gz") as archive:
        archive.add(spm_trained.data, arcname="bin")
    hub = ConvS2SModel.from_pretrained(str(spm_trained.ckpt), "checkpoint_last.pt", str(tmp_path / "bin.tar.gz"))
    assert hub.generate([hub.encode("s1 s2")], beam=2, max_len_b=MAX_LEN_B)[0]


def test_a_folder_of_dictionaries_alone_asks_for_the_languages(spm_trained, tmp_path):
    """The two dictionaries alone (as deployed, without the binarized data whose file names carry the language
    pair) and a checkpoint that does not name its languages: fairseq stopped with a bare ``Exception: Could not
    infer language pair``; the plugin names the folder, its dictionaries and the arguments, which then work."""
    for name in ("dict.src.txt", "dict.tgt.txt"):
        shutil.copy(spm_trained.data / name, tmp_path)
    with pytest.raises(Exception, match="Could not infer language pair"):
        hub_utils.from_pretrained(str(spm_trained.ckpt), "checkpoint_last.pt", str(tmp_path))
    with pytest.raises(ValueError) as error:
        ConvS2SModel.from_pretrained(str(spm_trained.ckpt), "checkpoint_last.pt", str(tmp_path))
    assert str(error.value) == (
        f"the checkpoint does not name its languages and {tmp_path} holds no binarized data to tell them "
        "(dict.src.txt, dict.tgt.txt): pass source_lang= and target_lang="
    )
    named = ConvS2SModel.from_pretrained(
        str(spm_trained.ckpt), "checkpoint_last.pt", str(tmp_path), source_lang="src", target_lang="tgt"
    )
    full = ConvS2SModel.from_pretrained(str(spm_trained.ckpt), "checkpoint_last.pt", str(spm_trained.data))
    sources = [full.encode(s) for s in SPM_SENTENCES]
    assert [h[0]["tokens"].tolist() for h in named.generate(sources, max_len_b=MAX_LEN_B)] == [
        h[0]["tokens"].tolist() for h in full.generate(sources, max_len_b=MAX_LEN_B)
    ]


def test_generate_prints_the_alignment_fairseq_interactive_prints(spm_trained):
    """generate(..., print_alignment=True): fairseq's hub prepared the model without its attention, and the
    search stopped in ``IndexError: Dimension out of range``. Now each hypothesis carries the hard alignment
    fairseq-interactive --print-alignment prints (A- lines) for the same checkpoint, sentences and beam, the
    hypotheses unchanged; 'soft' gives a row per target token; the attention is off again after the call, and
    another value is a ValueError naming the option (fairseq: an AttributeError after the search)."""
    hub = ConvS2SModel.from_pretrained(
        str(spm_trained.ckpt), "checkpoint_last.pt", str(spm_trained.data), bpe="sentencepiece",
        sentencepiece_model=str(spm_trained.spm),
    )  # fmt: skip
    sources = [hub.encode(s) for s in SPM_SENTENCES]
    plain = hub.generate(sources, beam=5, max_len_b=MAX_LEN_B)
    aligned = hub.generate(sources, beam=5, max_len_b=MAX_LEN_B, print_alignment=True)
    assert [h[0]["tokens"].tolist() for h in aligned] == [h[0]["tokens"].tolist() for h in plain]
    after = hub.generate(sources[:1], beam=5, max_len_b=MAX_LEN_B)[0][0]  # (no attention computed, as before)
    assert (
        hub.models[0].decoder.need_attn is None and after["attention"].numel() == 0 == plain[0][0]["attention"].numel()
    )

    proc = _interactive(
        spm_trained.folder, "bin", "ckpt/checkpoint_last.pt", SPM_SENTENCES, "--print-alignment",
        "--bpe", "sentencepiece", "--sentencepiece-model", spm_trained.spm, "--max-len-b", str(MAX_LEN_B),
    )  # fmt: skip
    cli = hypothesis_lines(proc.stdout)["A"]
    ours = [" ".join(f"{s}-{t}" for s, t in h[0]["alignment"]) for h in aligned]
    assert ours == [cli[i] for i in range(len(SPM_SENTENCES))] and all(ours), tail(proc)

    soft = hub.generate(sources[:1], beam=5, max_len_b=MAX_LEN_B, print_alignment="soft")[0][0]
    assert len(soft["alignment"]) == len(soft["tokens"]) and len(soft["alignment"][0]) == len(sources[0])
    with pytest.raises(ValueError, match=re.escape("print_alignment must be 'hard', 'soft', True or False, got 'yes'")):
        hub.generate(sources, print_alignment="yes")


def test_a_dictionary_of_another_size_is_named_not_a_torch_size_mismatch(spm_trained):
    """fairseq-generate of the trained checkpoint against a data dir whose dict.src.txt has 9 more words (as if
    preprocessed without --srcdict) stops before decoding with the plugin's message naming both sizes and the
    file, exit code non-zero, no torch size-mismatch error and no hypotheses."""
    folder = spm_trained.folder
    shutil.copytree(spm_trained.data, folder / "bin_other")
    with open(folder / "bin_other/dict.src.txt", "a") as f:
        f.writelines(f"extra{i} 1\n" for i in range(9))
    size = len((spm_trained.data / "dict.src.txt").read_text().splitlines()) + 4  # + fairseq's 4 special symbols
    proc = generate(folder, "bin_other", "ckpt/checkpoint_last.pt", "--gen-subset", "valid", check=False)
    assert proc.returncode != 0, tail(proc)
    expected = (
        f"dictionary mismatch: the checkpoint's source dictionary has {size} entries, the data's dict.src.txt in "
        f"bin_other has {size + 9}: use the dictionary the model was trained with"
    )
    assert expected in proc.stderr, tail(proc)
    assert "size mismatch" not in proc.stderr and "H-" not in proc.stdout, tail(proc)


def test_a_reordered_dictionary_of_the_same_size_is_caught(spm_trained, tmp_path):
    """Same size, other order (the embedding shapes match, so the weights would load and translate into garbage):
    the dictionary fingerprint the model's args carry catches it when the model is built (so fairseq-generate and
    fairseq-interactive stop the same way). The training data's own dictionary, copied elsewhere, is accepted."""
    shutil.copytree(spm_trained.data, tmp_path / "copy")
    shutil.copytree(spm_trained.data, tmp_path / "reordered")
    lines = (spm_trained.data / "dict.tgt.txt").read_text().splitlines()
    (tmp_path / "reordered/dict.tgt.txt").write_text("".join(line + "\n" for line in reversed(lines)))
    kwargs = {"checkpoint_file": "checkpoint_last.pt", "bpe": "sentencepiece", "sentencepiece_model": spm_trained.spm}

    copy = ConvS2SModel.from_pretrained(str(spm_trained.ckpt), data_name_or_path=str(tmp_path / "copy"), **kwargs)
    assert copy.translate(SPM_SENTENCES[0], max_len_b=MAX_LEN_B)
    with pytest.raises(ValueError) as error:
        ConvS2SModel.from_pretrained(str(spm_trained.ckpt), data_name_or_path=str(tmp_path / "reordered"), **kwargs)
    assert str(error.value) == (
        f"dictionary mismatch: the data's dict.tgt.txt in {tmp_path / 'reordered'} has the {len(lines) + 4} entries "
        "of the checkpoint's target dictionary but not the same words in the same order: use the dictionary the "
        "model was trained with (fairseq-preprocess --srcdict/--tgtdict with the training data's dict files, or "
        "the checkpoint's own data dir)"
    )


def test_the_model_of_an_ensemble_that_does_not_fit_the_data_is_named(spm_trained):
    """fairseq-generate --path a.pt:b.pt where b.pt was trained on another dictionary: the message said "the
    checkpoint's" dictionary without saying which of the two."""
    folder = spm_trained.folder
    state = torch.load(spm_trained.ckpt / "checkpoint_last.pt", weights_only=False)
    recorded = state["cfg"]["model"].source_dictionary_fingerprint
    state["cfg"]["model"].source_dictionary_fingerprint = recorded.split(":")[0] + ":0123456789abcdef"
    torch.save(state, folder / "ckpt" / "other.pt")
    paths = "ckpt/checkpoint_last.pt:ckpt/other.pt"
    proc = generate(folder, str(spm_trained.data), paths, "--gen-subset", "valid", check=False)
    assert proc.returncode != 0 and "H-" not in proc.stdout, tail(proc)
    named = "fairseq-generate: error: ckpt/other.pt (model 2 of the 2 in --path): dictionary mismatch: the data's"
    assert f"\n{named} dict.src.txt" in proc.stderr and "Traceback" not in proc.stderr, tail(proc)


# ---- a stock fconv model in an archive-like directory ------------------------------------------------------------


@pytest.fixture(scope="module")
def fconv_archive(tmp_path_factory):
    """``model.pt`` (stock fconv) + ``dict.src.txt`` + ``dict.tgt.txt``, and fconv's own hub interface on it: the
    translations, and the 5-best hypotheses with scores, of FCONV_SENTENCES (computed before any conversion)."""
    folder = write_fconv_archive(tmp_path_factory.mktemp("hub_fconv") / "archive", make_dictionary(25))
    reference = FConvModel.from_pretrained(str(folder), checkpoint_file="model.pt")
    return SimpleNamespace(folder=folder, translations=reference.translate(FCONV_SENTENCES, max_len_b=MAX_LEN_B),
                           beams=_beams(reference))  # fmt: skip


def _beams(hub):
    """The 5-best (tokens, score) of every FCONV_SENTENCES, from a hub interface."""
    hypos = hub.generate([hub.encode(s) for s in FCONV_SENTENCES], beam=5, max_len_b=MAX_LEN_B)
    return [[(h["tokens"].tolist(), round(h["score"].item(), 4)) for h in beam] for beam in hypos]


def test_fconv_checkpoint_is_converted_once_and_translates_like_fconv(fconv_archive, monkeypatch):
    """The first from_pretrained on the directory writes model.convs2s.pt (and no temporary file), loads it as a
    convs2s model, and gives fconv's own hub output: the same translations and the same 5-best hypotheses and
    scores. The second load reuses that file without reading model.pt again; a model.pt replaced by another, newer
    or older (cp -p: it was taken for the one converted), is converted anew."""
    folder = fconv_archive.folder
    converted = folder / "model.convs2s.pt"
    first = ConvS2SModel.from_pretrained(str(folder), checkpoint_file="model.pt")
    assert isinstance(first.models[0], ConvS2SModel)
    assert sorted(p.name for p in folder.iterdir()) == ["dict.src.txt", "dict.tgt.txt", "model.convs2s.pt", "model.pt"]
    assert first.translate(FCONV_SENTENCES, max_len_b=MAX_LEN_B) == fconv_archive.translations
    assert _beams(first) == fconv_archive.beams
    written = converted.stat().st_mtime_ns

    read = hub_module.read_checkpoint

    def the_conversion_only(path, *args, **kwargs):
        if Path(path).name == "model.pt":
            raise AssertionError("the fconv checkpoint was read again although its conversion is up to date")
        return read(path, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(hub_module, "read_checkpoint", the_conversion_only)
        second = ConvS2SModel.from_pretrained(str(folder), checkpoint_file="model.pt")
    assert converted.stat().st_mtime_ns == written
    assert second.translate(FCONV_SENTENCES, max_len_b=MAX_LEN_B) == fconv_archive.translations

    conversions = []
    convert = hub_module.convert_checkpoint
    monkeypatch.setattr(hub_module, "convert_checkpoint", lambda *a, **k: conversions.append(a) or convert(*a, **k))
    later = converted.stat().st_mtime + 10
    os.utime(folder / "model.pt", (later, later))  # as if model.pt had been replaced after the conversion
    ConvS2SModel.from_pretrained(str(folder), checkpoint_file="model.pt")
    assert len(conversions) == 1
    earlier = converted.stat().st_mtime - 100
    os.utime(folder / "model.pt", (earlier, earlier))  # replaced again, by a file with an older timestamp (cp -p)
    ConvS2SModel.from_pretrained(str(folder), checkpoint_file="model.pt")
    assert len(conversions) == 2
    ConvS2SModel.from_pretrained(str(folder), checkpoint_file="model.pt")
    assert len(conversions) == 2  # (that conversion is of the file now there)


def test_interactive_on_the_converted_file_gives_fconv_output(fconv_archive):
    """fairseq-interactive --path model.convs2s.pt --user-dir fairseq_convs2s prints fconv's translations, with
    fconv's scores (fairseq-interactive prints them in base 2)."""
    folder = fconv_archive.folder
    ConvS2SModel.from_pretrained(str(folder), checkpoint_file="model.pt")  # makes sure the converted file is there
    proc = _interactive(folder, ".", "model.convs2s.pt", FCONV_SENTENCES, "--max-len-b", str(MAX_LEN_B))
    lines = hypothesis_lines(proc.stdout)
    hypotheses = [lines["H"][i].split("\t", 1) for i in range(len(FCONV_SENTENCES))]
    assert [text for _, text in hypotheses] == fconv_archive.translations, tail(proc)
    scores = [beam[0][1] / torch.log(torch.tensor(2.0)).item() for beam in fconv_archive.beams]
    assert [float(score) for score, _ in hypotheses] == pytest.approx(scores, abs=1e-3)


def test_hub_models_name_the_published_fconv_archives_and_load_by_name(fconv_archive, monkeypatch):
    """hub_models lists fconv's published archives with the same URLs, tokenizer and BPE. A name resolves to its
    URL (the download is stubbed here: the archive directory stands for the unpacked download), its Moses/subword-nmt
    settings apply unless overridden, and the model is converted and loaded; without sacremoses installed, the
    default Moses tokenizer fails with fairseq's message saying what to install."""
    assert ConvS2SModel.hub_models() == FConvModel.hub_models()
    url = ConvS2SModel.hub_models()["conv.wmt14.en-de"]["path"]
    kwargs = {"bpe": None}  # what the caller gives wins over the archive's settings
    assert hub_module._resolve_name(ConvS2SModel.hub_models(), "conv.wmt14.en-de", kwargs) == (url, "")
    assert kwargs == {"bpe": None, "tokenizer": "moses"}
    unpacked = {url: str(fconv_archive.folder)}
    monkeypatch.setattr(hub_module.file_utils, "load_archive_file", lambda path: unpacked.get(path, path))

    hub = ConvS2SModel.from_pretrained("conv.wmt14.en-de", tokenizer=None, bpe=None)
    assert hub.translate(FCONV_SENTENCES, max_len_b=MAX_LEN_B) == fconv_archive.translations
    try:
        import sacremoses  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install sacremoses"):
            ConvS2SModel.from_pretrained("conv.wmt14.en-de")
    with pytest.raises(FileNotFoundError, match="neither a model directory nor a known name .*conv.wmt14.en-de"):
        ConvS2SModel.from_pretrained("conv.no-such-model")


def test_converted_fconv_checkpoint_against_a_dictionary_of_another_size(fconv_archive, tmp_path):
    """A converted fconv checkpoint carries no dictionary fingerprint: the embedding-size check in load_state_dict
    still turns a data dir with a bigger dict.src.txt into the plugin's message."""
    shutil.copy(fconv_archive.folder / "dict.tgt.txt", tmp_path)
    shutil.copy(fconv_archive.folder / "dict.src.txt", tmp_path)
    with open(tmp_path / "dict.src.txt", "a") as f:
        f.writelines(f"extra{i} 1\n" for i in range(3))
    with pytest.raises(
        ValueError,
        match=re.escape(f"source dictionary has 29 entries, the data's dict.src.txt in {tmp_path} has 32: use the"),
    ):
        ConvS2SModel.from_pretrained(
            str(fconv_archive.folder), checkpoint_file="model.pt", data_name_or_path=str(tmp_path)
        )


def test_bad_checkpoints_fail_with_a_message_and_leave_no_file(fconv_archive, tmp_path):
    """A truncated model.pt, a checkpoint of another model (a transformer) and a missing file each raise a
    ValueError saying what is wrong, and leave neither a converted file nor a temporary one behind."""
    good = (fconv_archive.folder / "model.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(good[: len(good) // 2])
    checkpoint = torch.load(fconv_archive.folder / "model.pt")
    checkpoint["args"].arch = "transformer"
    torch.save(checkpoint, tmp_path / "transformer.pt")
    for name, message in [
        ("truncated.pt", r"truncated.pt \([0-9,]+ bytes\) is truncated: the zip archive torch saves has no end"),
        ("transformer.pt", "transformer.pt: a checkpoint of arch 'transformer', neither convs2s nor fconv"),
        ("missing.pt", "missing.pt: no such file"),
    ]:
        with pytest.raises(ConversionError, match=message):
            ConvS2SModel.from_pretrained(str(tmp_path), checkpoint_file=name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["transformer.pt", "truncated.pt"]


def test_download_problems_say_what_to_do(monkeypatch):
    """A published name whose download needs a package that is missing (fairseq imports requests only to download)
    names the pip install; a download that fails names the URL."""

    def without_requests(path):
        raise ModuleNotFoundError("No module named 'requests'", name="requests")

    monkeypatch.setattr(hub_module.file_utils, "load_archive_file", without_requests)
    with pytest.raises(ImportError, match=r"wmt17.v2.en-de.fconv-py.tar.bz2 needs the requests package: pip install"):
        ConvS2SModel.from_pretrained("conv.wmt17.en-de")
    monkeypatch.setattr(hub_module.file_utils, "load_archive_file", lambda path: None)  # fairseq's "not found"
    with pytest.raises(FileNotFoundError, match=r"could not download or unpack https://dl.fbaipublicfiles.com/"):
        ConvS2SModel.from_pretrained("conv.wmt14.en-fr")


@pytest.mark.parametrize("layout", ["top_folder", "dot_slash"])
def test_a_local_archive_is_unpacked_and_left_as_it_is(fconv_archive, tmp_path, monkeypatch, layout):
    """A local .tar.gz of the model (files under one top folder, or ``tar -C dir .``'s './' names) and one of the
    data: both translate like fconv, and both archives are still there, unchanged. fairseq's load_archive_file
    deleted a local archive and moved the unpacked folder to its name; with './' names it then stopped in
    ``OSError: [Errno 22] Invalid argument`` (shutil.rmtree), the archive already gone. The second load reuses the
    unpacked folder and its conversion."""
    monkeypatch.setattr(hub_module.file_utils, "PYTORCH_FAIRSEQ_CACHE", str(tmp_path / "cache"))
    model_tar, data_tar = tmp_path / "model.tar.gz", tmp_path / "data.tar.gz"
    with tarfile.open(model_tar, "w:gz") as archive:
        for name in ("model.pt", "dict.src.txt", "dict.tgt.txt"):
            top = "archive/" if layout == "top_folder" else "./"
            archive.add(fconv_archive.folder / name, arcname=top + name)
    with tarfile.open(data_tar, "w:gz") as archive:
        archive.add(fconv_archive.folder / "dict.src.txt", arcname="./dict.src.txt")
        archive.add(fconv_archive.folder / "dict.tgt.txt", arcname="./dict.tgt.txt")
    before = model_tar.read_bytes(), data_tar.read_bytes()
    for _ in range(2):
        hub = ConvS2SModel.from_pretrained(str(model_tar), data_name_or_path=str(data_tar))
        assert hub.translate(FCONV_SENTENCES, max_len_b=MAX_LEN_B) == fconv_archive.translations
        assert (model_tar.read_bytes(), data_tar.read_bytes()) == before
    assert len(list((tmp_path / "cache").rglob("model.convs2s.pt"))) == 1
