"""torch.compile of the model: training, validation and a decoding step each trace as one graph (no graph
breaks), and the compiled model computes what the eager one does, with the oneDNN products inside the graph and
with the weights an optimizer changed in place."""

import copy

import pytest
import torch
import torch._dynamo as dynamo
from utils import assert_close_to_scale, build_model, random_batch

from convs2s_runtime import products


def _batch(model):
    """Padded sources (the encoder's masking path) and teacher-forced decoder input: B = 3."""
    d = model.encoder.dictionary
    src = random_batch(d, [7, 5, 6], seed=1)
    prev = random_batch(d, [6, 6, 4], seed=2, left_pad=False)
    return src, src.ne(d.pad()).sum(1), prev


def _logits(model, src, lengths, prev):
    return model(src, lengths, prev)[0]  # B x T x V


@pytest.fixture
def onednn_everywhere(monkeypatch):
    """Every linear of the tiny model through oneDNN, as the presets' large ones run on a CPU."""
    if not products.ONEDNN_DTYPES:
        pytest.fail("this torch has no oneDNN: the CPU products under test cannot run")
    monkeypatch.setattr(products, "ONEDNN_MIN_WEIGHT", 0)
    monkeypatch.setattr(products, "ONEDNN_MIN_MACS", 0)


@pytest.mark.parametrize("mode", ["training", "validation"])
def test_forward_traces_as_one_graph(mode, onednn_everywhere):
    model = build_model(dropout=0.2)
    model.train(mode == "training")
    dynamo.reset()
    with torch.set_grad_enabled(mode == "training"):
        explained = dynamo.explain(_logits)(model, *_batch(model))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), [b.reason for b in explained.break_reasons]


def test_decoding_step_traces_as_one_graph_and_decodes_as_eager(onednn_everywhere):
    """fairseq's incremental decoding, one step at a time: each step is one graph, and the compiled steps give
    the eager steps' outputs (the cached convolution windows carried from step to step)."""
    model = build_model(dropout=0.2).eval()
    src, _, prev = _batch(model)

    def step(p, encoder_out, state):
        return model.decoder(p, encoder_out, incremental_state=state)[0]  # B x 1 x V

    compiled_step = torch.compile(step, backend="aot_eager", fullgraph=True)
    eager_state: dict = {}
    compiled_state: dict = {}
    with torch.no_grad():
        encoder_out = model.encoder(src, None)
        for t in range(4):  # the window filling up, then full
            dynamo.reset()
            explained = dynamo.explain(step)(prev[:, : t + 1], encoder_out, copy.deepcopy(eager_state))
            assert (explained.graph_count, explained.graph_break_count) == (1, 0), (t, explained.break_reasons)
            expected = step(prev[:, : t + 1], encoder_out, eager_state)
            torch.testing.assert_close(compiled_step(prev[:, : t + 1], encoder_out, compiled_state), expected)


@pytest.mark.parametrize("backend, checkpointed", [("aot_eager", False), ("inductor", False), ("aot_eager", True)])
def test_compiled_training_step_equals_eager(backend, checkpointed, onednn_everywhere):
    """Forward, a loss and backward through torch.compile(fullgraph=True): the same loss and gradients, also with
    the blocks checkpointed (``--checkpoint-activations``: compiled as torch's checkpoint operator). The loss is the
    cross-entropy of fixed targets, so every gradient is a real one (the sum of logsumexp of log-probabilities this
    test used before is 0 whatever the weights: its gradients were rounding noise). Tolerances follow each
    tensor's size: seen, the compiled gradients within 1e-6 of the largest eager one (inductor: 8e-7)."""
    torch.manual_seed(0)
    model = build_model(dropout=0.0, checkpoint_activations=checkpointed).train()
    batch = _batch(model)
    targets = random_batch(model.decoder.dictionary, [6, 6, 6], seed=3, left_pad=False).unsqueeze(-1)  # B x T x 1

    def step(forward):
        model.zero_grad(set_to_none=True)
        loss = -torch.log_softmax(forward(model, *batch), dim=-1).gather(-1, targets).sum()
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    dynamo.reset()
    eager_loss, eager_grads = step(_logits)
    compiled_loss, compiled_grads = step(torch.compile(_logits, backend=backend, fullgraph=True))
    assert eager_loss > 1.0 and all(grad.abs().max() > 0 for grad in eager_grads.values())
    assert_close_to_scale(compiled_loss, eager_loss)
    assert compiled_grads.keys() == eager_grads.keys()
    for name, grad in eager_grads.items():
        assert_close_to_scale(compiled_grads[name], grad, msg=name)


def test_compiled_validation_sees_weights_changed_in_place(onednn_everywhere):
    """fairseq's NAG writes through ``p.data``; a compiled no-gradient forward after such an update computes with
    the new weights (weight norm folded afresh), not with the ones folded when it was compiled.

    Scaling every weight by 1.5 grows the logits from under 1 to 30-45, and their rounding with them: seen (seeds
    0-2), the compiled logits within 2.5e-6 of the largest eager one, which a fixed tolerance of 1e-5 missed once
    (an element near 0 off by 1.9e-5). The tolerance follows the logits' size; stale weights would be off by the
    whole change."""
    torch.manual_seed(0)
    model = build_model(dropout=0.2).eval()
    batch = _batch(model)
    compiled = torch.compile(_logits, backend="aot_eager", fullgraph=True)
    dynamo.reset()
    with torch.no_grad():
        before = compiled(model, *batch)
        assert_close_to_scale(before, _logits(model, *batch), rel=2e-5)
        for p in model.parameters():
            p.data.mul_(1.5).add_(0.01)
        after = compiled(model, *batch)
        expected = _logits(model, *batch)
        assert_close_to_scale(after, expected, rel=2e-5)
    assert (after - before).abs().max() > 0.1 * expected.abs().max()  # far outside the tolerance
