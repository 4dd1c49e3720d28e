"""The start-up hook of the installed package (``fairseq_convs2s_autoload``): it finds the convs2s arch in a
checkpoint without running its pickle, knows every registered convs2s arch, and is installed by ``pip install``.
The end-to-end case, fairseq-generate without --user-dir, is in test_bad_input.py."""

import argparse
import site
import subprocess
import sys
from pathlib import Path

import torch
from fairseq.models import ARCH_MODEL_REGISTRY

import fairseq_convs2s_autoload as autoload
from fairseq_convs2s import ConvS2SModel


def test_arch_list_is_the_registry():
    """The hook cannot import the plugin to ask (it runs at every interpreter start-up): its list must be kept
    equal to what the plugin registers."""
    registered = {name for name, cls in ARCH_MODEL_REGISTRY.items() if cls is ConvS2SModel}
    assert autoload.CONVS2S_ARCHS == registered


class Exploding:
    """Unpickling this would run code: the hook must find the arch without doing so."""

    def __reduce__(self):
        return (sys.exit, ("the pickle was executed",))


def test_checkpoint_arch_reads_opcodes_only(tmp_path):
    convs2s = tmp_path / "convs2s.pt"
    torch.save({"cfg": {"model": argparse.Namespace(arch="convs2s_wmt_en_de")}, "x": Exploding()}, convs2s)
    assert autoload.checkpoint_arch(convs2s) == "convs2s_wmt_en_de"

    fconv = tmp_path / "fconv.pt"
    torch.save({"args": argparse.Namespace(arch="fconv_wmt_en_de", save_dir="convs2s_runs")}, fconv)
    assert autoload.checkpoint_arch(fconv) is None  # a path that mentions convs2s is not an arch
    other = tmp_path / "transformer.pt"  # (a value that is an arch's name, but not the arch's: it was taken for one)
    torch.save({"args": argparse.Namespace(arch="transformer_iwslt_de_en", save_dir="convs2s")}, other)
    assert autoload.checkpoint_arch(other) is None
    preset = "convs2s_iwslt_de_en"  # (one string object: the second time the pickle refers back to the first)
    config = tmp_path / "config.pt"
    torch.save({"note": preset, "cfg": {"model": {"_name": "convs2s", "arch": preset}}}, config)
    assert autoload.checkpoint_arch(config) == preset

    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(convs2s.read_bytes()[:100])
    assert autoload.checkpoint_arch(truncated) is None
    assert autoload.checkpoint_arch(tmp_path / "missing.pt") is None
    assert autoload.checkpoint_arch(tmp_path) is None


def test_pth_is_installed_and_imports_only_the_standard_library():
    """pip put fairseq_convs2s_autoload.pth into site-packages; a fresh interpreter runs it, installs the finder,
    and has imported neither torch nor fairseq nor the plugin by the end of start-up."""
    pths = [p for d in site.getsitepackages() for p in Path(d).glob("fairseq_convs2s_autoload.pth")]
    assert len(pths) == 1, site.getsitepackages()
    code = (
        "import sys; print(any(type(f).__name__ == '_AfterImportFinder' for f in sys.meta_path), "
        "sorted(m for m in ('torch', 'fairseq', 'fairseq_convs2s') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True []"
