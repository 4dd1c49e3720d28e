"""Decoding in bfloat16: ``ConvS2SModel.prepare_for_inference_`` with ``cfg.common.bf16`` (what ``--bf16`` sets in
fairseq-generate and fairseq-interactive; the command-line runs are in test_cli.py, the hub's in test_hub.py)."""

import copy
import itertools

import torch
from omegaconf import OmegaConf
from utils import build_model, full_log_probs, incremental_log_probs, make_dictionary, random_batch, seed_all


def inference_cfg(bf16: bool):
    """The parts of fairseq-generate's config that ``prepare_for_inference_`` reads."""
    return OmegaConf.create({"common": {"bf16": bf16}, "generation": {"beam": 5, "print_alignment": False}})


def floating_tensors(model):
    return [t for t in itertools.chain(model.parameters(), model.buffers()) if t.is_floating_point()]


def test_bf16_folds_weight_norm_in_fp32_then_rounds_each_weight_once():
    """With bf16 every floating parameter and buffer becomes bfloat16, each equal to the fp32 preparation's
    (weight norm folded in fp32) rounded once; without it the model stays fp32."""
    seed_all(0)
    model = build_model("convs2s_wmt_en_de").eval()
    fp32 = copy.deepcopy(model)
    model.prepare_for_inference_(inference_cfg(True))
    fp32.prepare_for_inference_(inference_cfg(False))

    assert floating_tensors(fp32) and all(t.dtype == torch.float32 for t in floating_tensors(fp32))
    assert all(t.dtype == torch.bfloat16 for t in floating_tensors(model))
    weights = dict(fp32.named_parameters())
    for name, weight in model.named_parameters():
        assert torch.equal(weight, weights[name].to(torch.bfloat16)), name


def test_bf16_decoding_gives_fp32_log_probs_near_the_fp32_models():
    """A bf16-prepared model decodes step by step as it runs in one pass (to bf16's rounding), returns fp32
    log-probabilities (what fairseq's beam search adds to its fp32 scores), and stays near the fp32 model: the
    rounding shows (far above fp32's own differences) but moves no log-probability far."""
    seed_all(1)
    dictionary = make_dictionary(30)
    model = build_model("convs2s_wmt_en_de", dictionary).eval()
    fp32 = copy.deepcopy(model)
    model.prepare_for_inference_(inference_cfg(True))
    fp32.prepare_for_inference_(inference_cfg(False))
    src = random_batch(dictionary, [7, 4, 6], seed=2)
    prev = random_batch(dictionary, [5, 5, 5], seed=3, left_pad=False)

    with torch.no_grad():
        steps = incremental_log_probs(model, src, prev)
        whole = full_log_probs(model, src, prev)
        reference = incremental_log_probs(fp32, src, prev)
    assert steps.dtype == whole.dtype == torch.float32
    assert torch.isfinite(steps).all()
    # seen with seeds 0-4: step by step against one pass 3e-3 to 5e-3 (fp32: 5e-7), bf16 against fp32 3e-3 to 8e-3,
    # with log-probabilities spread by 0.08 to 0.10 (a standard deviation) in this untrained model
    assert (steps - whole).abs().max() < 0.02, (steps - whole).abs().max()
    difference = (steps - reference).abs().max()
    assert 1e-4 < difference < 0.03, difference
