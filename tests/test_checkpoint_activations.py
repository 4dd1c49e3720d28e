"""``--checkpoint-activations``: each block recomputed in the backward pass, the same loss and gradients, less kept."""

import pytest
import torch
from utils import build_model, make_dictionary, random_batch

from fairseq_convs2s.modules import conv_block

# the presets' block shapes (width changes with residual projections, 1-wide kernels), and lookback residuals of 2
# with a decoder that attends in some layers only
CASES = {
    "convs2s_iwslt_de_en": {},
    "convs2s_wmt_en_de": {},
    "lookback": {
        "encoder_layers": "[(16, 3), (16, 3, 2)] + [(24, 5, 2)] * 2",
        "decoder_layers": "[(16, 3)] + [(24, 3, 2)] * 3",
        "decoder_attention": "[True, False, False, True]",
    },
}


def _model(case: str, checkpointed: bool, dropout: float = 0.3):
    arch = case if case.startswith("convs2s") else "convs2s_iwslt_de_en"
    torch.manual_seed(0)  # the same weights in both modes
    return build_model(arch, make_dictionary(30), dropout=dropout, checkpoint_activations=checkpointed, **CASES[case])


def _batch(model):
    d = model.encoder.dictionary
    src = random_batch(d, [7, 4, 9], seed=1)  # padded on the left
    prev = random_batch(d, [6, 8, 3], seed=2, left_pad=False)
    return src, prev


def _update(model):
    """One training pass (dropout on, its masks from seed 5): the summed log-likelihood and every gradient."""
    src, prev = _batch(model)
    torch.manual_seed(5)
    logits, _ = model.train()(src, None, prev)
    loss = logits.log_softmax(-1).sum()
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


def _count_block_passes(model):
    """A list that gets one entry per run of any block's convolution."""
    calls = []
    for block in [*model.encoder.blocks, *model.decoder.blocks]:
        block.conv.register_forward_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("case", CASES)
def test_checkpointed_blocks_give_the_same_loss_and_gradients(case):
    """With dropout on, the checkpointed model's loss and every gradient are those of the model that keeps its
    activations, bit for bit (the recomputation replays the dropout masks from the random state of the first
    run), and each block runs twice an update: once forward, once again in the backward pass."""
    kept, checkpointed = _model(case, False), _model(case, True)
    kept_calls, checkpointed_calls = _count_block_passes(kept), _count_block_passes(checkpointed)
    blocks = len(kept.encoder.blocks) + len(kept.decoder.blocks)

    loss, grads = _update(kept)
    loss_c, grads_c = _update(checkpointed)

    assert len(kept_calls) == blocks and len(checkpointed_calls) == 2 * blocks
    assert torch.equal(loss, loss_c)
    assert grads.keys() == grads_c.keys()
    for name in grads:
        assert torch.equal(grads[name], grads_c[name]), name


def _saved_bytes(model, monkeypatch) -> int:
    """Bytes of the distinct tensors a training forward pass keeps for the backward one, parameters aside: what
    autograd saves outside the checkpoints, and (checkpointed) the checkpoints' tensor arguments."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept = {}

    def keep(t):
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in params:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    real_checkpoint = conv_block.checkpoint

    def recording_checkpoint(fn, *args, **kwargs):
        for arg in args:
            for t in arg if isinstance(arg, tuple) else (arg,):
                keep(t)
        return real_checkpoint(fn, *args, **kwargs)

    monkeypatch.setattr(conv_block, "checkpoint", recording_checkpoint)
    src, prev = _batch(model)
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model.train()(src, None, prev)
    return sum(kept.values())


def test_checkpointing_keeps_less_for_the_backward_pass(monkeypatch):
    """At the wmt_en_de preset's shapes (blocks of three widths) the checkpointed pass keeps under a quarter of the
    bytes (0.13 of them measured, dropout on): the blocks' inputs instead of their dropout masks, convolution
    inputs, GLU halves and attention scores."""
    kept = _saved_bytes(_model("convs2s_wmt_en_de", False), monkeypatch)
    checkpointed = _saved_bytes(_model("convs2s_wmt_en_de", True), monkeypatch)
    assert checkpointed < 0.25 * kept, (checkpointed, kept)


def test_no_checkpoints_without_gradients():
    """Inference (gradients off) runs each block once, as without the flag, and gives the same outputs;
    incremental decoding never goes through the checkpoints."""
    kept, checkpointed = _model("convs2s_wmt_en_de", False).eval(), _model("convs2s_wmt_en_de", True).eval()
    calls = _count_block_passes(checkpointed)
    src, prev = _batch(kept)
    with torch.no_grad():
        expected, _ = kept(src, None, prev)
        got, _ = checkpointed(src, None, prev)
    assert len(calls) == len(kept.encoder.blocks) + len(kept.decoder.blocks)
    assert torch.equal(expected, got)


def test_the_flag_defaults_to_off_and_reaches_both_stacks():
    """Models built from args without the field (checkpoints from before it) keep every activation."""
    off = _model("convs2s_iwslt_de_en", False)
    on = _model("convs2s_iwslt_de_en", True)
    assert not off.encoder.checkpoint_activations and not off.decoder.checkpoint_activations
    assert on.encoder.checkpoint_activations and on.decoder.checkpoint_activations
    default = build_model("convs2s_iwslt_de_en", make_dictionary(30))
    assert not default.encoder.checkpoint_activations and not default.decoder.checkpoint_activations
