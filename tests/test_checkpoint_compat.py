"""fairseq checkpoints load under torch's weights_only unpickler once the plugin is imported."""

import argparse
import collections
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import fairseq_convs2s  # noqa: F401


def test_namespace_in_checkpoint_loads(tmp_path):
    path = tmp_path / "ckpt.pt"
    torch.save({"args": argparse.Namespace(arch="convs2s", lr=[0.25]), "model": {"w": torch.ones(2)}}, path)
    state = torch.load(path, map_location="cpu")
    assert state["args"].arch == "convs2s" and state["model"]["w"].sum() == 2


def test_the_numpy_meters_of_an_eval_bleu_run_load(tmp_path):
    """fairseq-train --eval-bleu saves its BLEU counts as numpy arrays and scalars in extra_state["metrics"]."""
    import numpy as np

    path = tmp_path / "ckpt.pt"
    meters = {"_bleu_counts": np.array([5, 3, 2, 1]), "_bleu_sys_len": np.int64(17), "ratio": np.array([0.5, 0.25])}
    torch.save({"args": argparse.Namespace(arch="convs2s"), "extra_state": {"metrics": meters}}, path)
    loaded = torch.load(path, map_location="cpu")["extra_state"]["metrics"]
    assert loaded["_bleu_counts"].tolist() == [5, 3, 2, 1] and int(loaded["_bleu_sys_len"]) == 17
    assert loaded["ratio"].dtype == np.float64


class NotAllowed:
    pass


def test_other_classes_are_still_refused(tmp_path):
    """The allow-list is narrow: the safe unpickler still refuses arbitrary classes."""
    path = tmp_path / "evil.pt"
    torch.save({"x": NotAllowed(), "y": collections.OrderedDict()}, path)
    with pytest.raises(Exception, match="NotAllowed"):
        torch.load(path, map_location="cpu")


def test_without_the_plugin_torch_refuses_namespace(tmp_path):
    """The problem the plugin fixes is real on this torch: a fresh interpreter without it cannot load."""
    path = tmp_path / "ckpt.pt"
    torch.save({"args": argparse.Namespace(arch="fconv")}, path)
    code = f"import torch; torch.load({str(path)!r}, map_location='cpu')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode != 0 and "argparse.Namespace" in result.stderr


def test_a_checkpoint_loads_without_the_embedding_files_it_was_trained_from(tmp_path):
    """A model trained with --encoder-embed-path / --decoder-embed-path keeps the paths in its saved cfg; fconv
    reads the files again at every load (and fails where they are gone), a convs2s model built to load a
    checkpoint skips them, while building one to train still reads them."""
    from fairseq import checkpoint_utils
    from fconv_helpers import write_fconv_archive
    from utils import make_dictionary

    from fairseq_convs2s.compat.checkpoints import building_to_load
    from fairseq_convs2s.convert_fconv import convert_file
    from fairseq_convs2s.models.convs2s import ConvS2SModel

    folder = write_fconv_archive(tmp_path / "archive", make_dictionary(25))
    fconv_path, gone = folder / "model.pt", str(tmp_path / "gone.txt")
    checkpoint = torch.load(fconv_path, map_location="cpu")
    checkpoint["args"].encoder_embed_path = checkpoint["args"].decoder_embed_path = gone
    torch.save(checkpoint, fconv_path)
    with pytest.raises(FileNotFoundError, match="gone.txt"):  # fconv, as fairseq loads it
        checkpoint_utils.load_model_ensemble_and_task([str(fconv_path)], arg_overrides={"data": str(folder)})

    convert_file(str(fconv_path), str(folder / "convs2s.pt"))  # builds the convs2s model to check the weights fit
    converted = torch.load(folder / "convs2s.pt", map_location="cpu")
    saved_args = converted["args"]  # (fairseq's format before 0.10, as the archive's)
    assert saved_args.encoder_embed_path == saved_args.decoder_embed_path == gone  # how it was trained stays
    (model,), _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(folder / "convs2s.pt")], arg_overrides={"data": str(folder)}
    )
    for side in ("encoder", "decoder"):
        key = f"{side}.embed_tokens.weight"
        assert torch.equal(model.state_dict()[key], converted["model"][key])

    task = SimpleNamespace(source_dictionary=model.encoder.dictionary, target_dictionary=model.decoder.dictionary)
    args = argparse.Namespace(**vars(saved_args))
    with pytest.raises(FileNotFoundError, match="gone.txt"):  # a model to train needs its vectors
        ConvS2SModel.build_model(args, task)
    with building_to_load():
        assert isinstance(ConvS2SModel.build_model(args, task), ConvS2SModel)
