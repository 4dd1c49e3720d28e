"""fairseq checkpoints load under torch's weights_only unpickler once the plugin is imported."""

import argparse
import collections
import subprocess
import sys

import pytest
import torch

import fairseq_convs2s  # noqa: F401


def test_namespace_in_checkpoint_loads(tmp_path):
    path = tmp_path / "ckpt.pt"
    torch.save({"args": argparse.Namespace(arch="convs2s", lr=[0.25]), "model": {"w": torch.ones(2)}}, path)
    state = torch.load(path, map_location="cpu")
    assert state["args"].arch == "convs2s" and state["model"]["w"].sum() == 2


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
