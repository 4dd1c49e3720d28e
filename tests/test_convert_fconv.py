"""fconv checkpoints convert to convs2s with identical outputs; bad inputs fail cleanly."""

import argparse
import os
import stat
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from fconv_helpers import fairseq_checkpoint, train_fconv
from utils import beam_search, full_log_probs, make_dictionary, random_batch

from fairseq_convs2s.convert_fconv import convert_file
from fairseq_convs2s.models.convs2s import ConvS2SModel
from fairseq_convs2s.models.fconv_checkpoint import ConversionError, convert_checkpoint


def load_converted(converted, dictionary):
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    model = ConvS2SModel.build_model(argparse.Namespace(**vars(converted["cfg"]["model"])), task)
    model.load_state_dict(converted["model"], strict=True)
    return model.eval()


def log_probs(model, src, prev):
    with torch.no_grad():
        return full_log_probs(model, src, prev)


def rounded_beam_search(model, dictionary, src):
    return [[(tokens, round(score, 4)) for tokens, score, _ in beam] for beam in beam_search([model], dictionary, src)]


@pytest.mark.parametrize("share", [False, True])
def test_converted_model_gives_fconv_outputs(share):
    """Same log-probs (1e-5) and same beam-search hypotheses as the fconv model it came from."""
    dictionary = make_dictionary(25)
    fconv, args = train_fconv(dictionary, share=share)
    converted = convert_checkpoint(fairseq_checkpoint(fconv, args), ConvS2SModel)
    convs2s = load_converted(converted, dictionary)
    assert convs2s.max_positions() == fconv.max_positions() == (38, 48)

    src = random_batch(dictionary, [9, 5, 7, 3], seed=7)
    prev = random_batch(dictionary, [8, 8, 8, 8], seed=8, left_pad=False)
    torch.testing.assert_close(log_probs(convs2s, src, prev), log_probs(fconv, src, prev), atol=1e-5, rtol=1e-5)
    assert rounded_beam_search(convs2s, dictionary, src) == rounded_beam_search(fconv, dictionary, src)
    assert "last_optimizer_state" not in converted


def test_ensembles_decode_as_fconvs_ensemble():
    """``--path a.pt:b.pt``: an ensemble of converted checkpoints, and one mixing a converted checkpoint with an
    fconv model, gives the hypotheses and scores of the fconv ensemble they came from. Each decoder keeps its own
    folded products and source tensors for the pass, so the models must not share them. The converted ensemble's
    averaged attention is fconv's times 4/3 (fconv averages over all 4 layers, 3 of them attending; a porting note
    of the decoder): a distribution over the source."""
    dictionary = make_dictionary(25)
    (fconv_a, args_a), (fconv_b, args_b) = train_fconv(dictionary, steps=5), train_fconv(dictionary, steps=9)
    convs2s_a = load_converted(convert_checkpoint(fairseq_checkpoint(fconv_a, args_a), ConvS2SModel), dictionary)
    convs2s_b = load_converted(convert_checkpoint(fairseq_checkpoint(fconv_b, args_b), ConvS2SModel), dictionary)
    src = random_batch(dictionary, [9, 5, 7, 3, 6, 8], seed=7)

    expected = beam_search([fconv_a, fconv_b], dictionary, src)
    alone = beam_search([fconv_a], dictionary, src)
    assert [b[0][0] for b in expected] != [b[0][0] for b in alone], "the second model changes no best hypothesis"
    converted, mixed = (beam_search(m, dictionary, src) for m in ([convs2s_a, convs2s_b], [convs2s_a, fconv_b]))
    for got in (converted, mixed):
        assert [[h[0] for h in beam] for beam in got] == [[h[0] for h in beam] for beam in expected]
        scores = [h[1] for beam in got for h in beam]
        assert scores == pytest.approx([h[1] for beam in expected for h in beam], abs=1e-5)

    for beam, fconv_beam in zip(converted, expected):
        for (_, _, attention), (_, _, fconv_attention) in zip(beam, fconv_beam):
            torch.testing.assert_close(attention, fconv_attention * 4 / 3, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(attention.sum(0), torch.ones(attention.size(1)))  # S x T: over the source


def test_old_formats_convert_the_same():
    """A version-1 decoder (weight norm over dim 0) and stray _linearized_weight keys give the same model."""
    dictionary = make_dictionary(25)
    fconv, args = train_fconv(dictionary)
    new = fairseq_checkpoint(fconv, args)
    old = fairseq_checkpoint(fconv, args)
    state = dict(old["model"])
    state["decoder.version"] = torch.tensor([1.0])
    for i in range(4):
        prefix = f"decoder.convolutions.{i}."
        weight = state[prefix + "weight_v"] * (
            state[prefix + "weight_g"] / state[prefix + "weight_v"].norm(dim=(0, 1), keepdim=True)
        )
        state[prefix + "weight_v"] = weight * 3.0  # any scale: only the direction of v counts
        state[prefix + "weight_g"] = weight.norm(dim=(1, 2), keepdim=True)  # k x 1 x 1, the old layout
        state[prefix + "_linearized_weight"] = torch.zeros(1)
    old["model"] = state
    old["args"], old["cfg"] = old["cfg"]["model"], None  # pre-hydra checkpoints kept a Namespace in 'args'
    a, b = load_converted(convert_checkpoint(new, ConvS2SModel), dictionary), convert_checkpoint(old, ConvS2SModel)
    assert b["args"].arch == "convs2s"
    b = load_converted({"cfg": {"model": b["args"]}, "model": b["model"]}, dictionary)
    src = random_batch(dictionary, [6, 4], seed=3)
    prev = random_batch(dictionary, [5, 5], seed=4, left_pad=False)
    torch.testing.assert_close(log_probs(a, src, prev), log_probs(b, src, prev), atol=1e-5, rtol=1e-5)


def test_a_swapped_weight_is_caught():
    """The equality check has teeth: swapping two same-shaped tensors changes the outputs."""
    dictionary = make_dictionary(25)
    fconv, args = train_fconv(dictionary)
    converted = convert_checkpoint(fairseq_checkpoint(fconv, args), ConvS2SModel)
    state = converted["model"]
    a, b = "decoder.blocks.0.conv.weight_v", "decoder.blocks.1.conv.weight_v"
    state[a], state[b] = state[b], state[a]
    convs2s = load_converted(converted, dictionary)
    src, prev = random_batch(dictionary, [6], seed=1), random_batch(dictionary, [5], seed=2, left_pad=False)
    assert (log_probs(convs2s, src, prev) - log_probs(fconv, src, prev)).abs().max() > 1e-3


def test_bad_inputs_fail_with_a_message_and_leave_no_file(tmp_path):
    dictionary = make_dictionary(25)
    fconv, args = train_fconv(dictionary, steps=1)
    good = tmp_path / "fconv.pt"
    torch.save(fairseq_checkpoint(fconv, args), good)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[:2000])
    other = tmp_path / "other.pt"
    checkpoint = fairseq_checkpoint(fconv, args)
    checkpoint["cfg"]["model"] = argparse.Namespace(**{**vars(args), "arch": "transformer"})
    torch.save(checkpoint, other)
    out = tmp_path / "out.pt"
    for path, message in [
        (truncated, r"truncated\.pt \(2,000 bytes\) is truncated: the zip archive torch saves has no end"),
        (other, "not an fconv translation model: its arch is 'transformer'"),
        (tmp_path / "missing.pt", "no such file"),
    ]:
        with pytest.raises(ConversionError, match=message):
            convert_file(str(path), str(out))
        assert not out.exists() and not list(tmp_path.glob(".convert_fconv.*"))

    cli = [sys.executable, "-m", "fairseq_convs2s.convert_fconv"]
    result = subprocess.run(cli + [str(truncated), str(out)], capture_output=True, text=True)
    assert result.returncode == 1 and "convert_fconv: error:" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()
    result = subprocess.run(cli + [str(good), str(out)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert torch.load(out, map_location="cpu")["cfg"]["model"].arch == "convs2s"


def test_an_output_that_cannot_take_the_checkpoint_fails_with_a_message(tmp_path, monkeypatch):
    """A directory, a file in a directory that does not exist, the input itself (which it would have replaced),
    and a write that fails: each a ConversionError naming the path, the input untouched and no file left behind.
    Before, the first two ended in a traceback about the temporary file's name."""
    dictionary = make_dictionary(25)
    fconv, args = train_fconv(dictionary, steps=1)
    good = tmp_path / "fconv.pt"
    torch.save(fairseq_checkpoint(fconv, args), good)
    before = good.read_bytes()
    (tmp_path / "models").mkdir()
    for out, message in [
        (tmp_path / "models", "models is a directory: name the file to write"),
        (tmp_path / "gone" / "out.pt", "out.pt: no such directory .*gone"),
        (good, "fconv.pt is the fconv checkpoint being converted: write the convs2s one elsewhere"),
    ]:
        with pytest.raises(ConversionError, match=message):
            convert_file(str(good), str(out))
    assert good.read_bytes() == before

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(ConversionError, match="cannot write .*out.pt: No space left on device"):
        convert_file(str(good), str(tmp_path / "out.pt"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fconv.pt", "models"]


def test_the_converted_file_is_readable_as_a_plainly_written_one(tmp_path):
    """The temporary file it is written to is private (0600); the checkpoint gets 0666 less the umask."""
    dictionary = make_dictionary(25)
    fconv, args = train_fconv(dictionary, steps=1)
    good, out = tmp_path / "fconv.pt", tmp_path / "out.pt"
    torch.save(fairseq_checkpoint(fconv, args), good)
    old_umask = os.umask(0o027)
    try:
        convert_file(str(good), str(out))
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o640


def test_a_checkpoint_of_weights_alone_converts_to_one_fairseq_loads(tmp_path):
    """A checkpoint stripped to its cfg and weights (no optimizer history, no extra_state), and one of fairseq's
    oldest format (its optimizer state under 'optimizer'): the converted files load in fairseq. Before, the first
    was written and then stopped fairseq-generate with ``KeyError: 'extra_state'``; the second kept the optimizer
    state that the conversion drops."""
    from fairseq import checkpoint_utils

    dictionary = make_dictionary(25)
    fconv, args = train_fconv(dictionary, steps=1)
    full = fairseq_checkpoint(fconv, args)
    bare = {"cfg": full["cfg"], "model": full["model"]}
    oldest = {"args": args, "model": full["model"], "optimizer": {"state": {"x": torch.ones(3)}}, "best_loss": 1.0,
              "epoch": 2, "batch_offset": 0, "val_loss": 1.0}  # fmt: skip
    for name, checkpoint in [("bare", bare), ("oldest", oldest)]:
        torch.save(checkpoint, tmp_path / f"{name}.pt")
        convert_file(str(tmp_path / f"{name}.pt"), str(tmp_path / f"{name}.convs2s.pt"))
        assert "optimizer" not in torch.load(tmp_path / f"{name}.convs2s.pt", weights_only=False)
        loaded = checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / f"{name}.convs2s.pt"))
        assert loaded["cfg"]["model"].arch == "convs2s"


def test_an_empty_output_or_one_naming_a_missing_directory_is_refused_before_reading(tmp_path):
    """``out/`` (a directory that does not exist) and ``""``: refused naming the path before the input is read. They
    were read and converted, then refused as 'cannot write out/: Not a directory' and 'cannot write : No such file
    or directory'; an existing directory's example path had a double slash."""
    missing = tmp_path / "missing.pt"  # (never read: the output is refused first)
    for out, message in [
        (f"{tmp_path}/new/", r"new/ names a directory, and there is none: name the file to write in an existing one"),
        ("", "no output file named: name the file to write"),
        (f"{tmp_path}/", f"is a directory: name the file to write, e.g. {tmp_path}/model.pt$"),
    ]:
        with pytest.raises(ConversionError, match=message):
            convert_file(str(missing), out)


def test_converting_a_converted_checkpoint_says_it_needs_none(tmp_path):
    """The converter run on its own output (or on any convs2s checkpoint) says that file is ready to use; it said
    'not an fconv translation model: its arch is 'convs2s' (expected one of ...)', as for another model."""
    dictionary = make_dictionary(25)
    fconv, args = train_fconv(dictionary, steps=1)
    torch.save(fairseq_checkpoint(fconv, args), tmp_path / "fconv.pt")
    convert_file(str(tmp_path / "fconv.pt"), str(tmp_path / "convs2s.pt"))
    with pytest.raises(ConversionError, match="already a convs2s checkpoint .arch 'convs2s'.: use it as it is"):
        convert_file(str(tmp_path / "convs2s.pt"), str(tmp_path / "again.pt"))
    assert not (tmp_path / "again.pt").exists()
