"""``--criterion fused_label_smoothed_cross_entropy`` against fairseq's ``label_smoothed_cross_entropy``: the
same loss, NLL and gradient, on raw logits, through a model and in fairseq-train, and the fall-back for other
normalizations."""

from types import SimpleNamespace

import pytest
import torch
from cli_helpers import load_checkpoint, make_splits, max_param_difference, preprocess, train, update_records
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    label_smoothed_nll_loss,
)
from fairseq.models.fconv import FConvModel
from fconv_helpers import fconv_model_args
from utils import build_model, make_dictionary, random_batch, seed_all

from fairseq_convs2s.criterions import fused_label_smoothed, label_smoothed_loss
from fairseq_convs2s.criterions.fused_label_smoothed import (
    FusedLabelSmoothedCrossEntropyCriterion,
    ProjectedLossTargets,
    label_smoothed_nll_loss_from_logits,
    loss_of_logits,
    normalizes_by_log_softmax,
    projected_label_smoothed_loss,
)

PAD = 1


def _stock(logits, target, epsilon, reduce=True):
    lprobs = torch.log_softmax(logits.float(), dim=-1)
    return label_smoothed_nll_loss(lprobs, target, epsilon, ignore_index=PAD, reduce=reduce)


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("chunk_bytes", [64, 1 << 19])  # one row per chunk, and all rows in one chunk
def test_loss_and_gradient_equal_fairseqs(epsilon, chunk_bytes, monkeypatch):
    monkeypatch.setattr(label_smoothed_loss, "CHUNK_BYTES", chunk_bytes)
    torch.manual_seed(0)
    logits = (torch.randn(37, 50, dtype=torch.float64) * 3).float()
    target = torch.randint(2, 50, (37,))
    target[[0, 5, 36]] = PAD  # padding rows: no loss, no gradient
    # upstream gradients that differ per row (reduce=False), into the loss and into the NLL (which sequence-level
    # training differentiates: the candidates' log-probabilities)
    weights, nll_weights = torch.rand(37, 1), torch.randn(37, 1)
    for reduce in (True, False):
        results = []
        for fn in (_stock, lambda x, t, e, reduce: label_smoothed_nll_loss_from_logits(x, t, e, PAD, reduce)):
            x = logits.clone().requires_grad_()
            loss, nll = fn(x, target.unsqueeze(1) if fn is _stock else target, epsilon, reduce=reduce)
            (loss - 0.7 * nll if reduce else loss * weights + nll * nll_weights).sum().backward()
            results.append((loss.detach(), nll.detach(), x.grad))
        (loss_a, nll_a, grad_a), (loss_b, nll_b, grad_b) = results
        assert loss_b.shape == loss_a.shape and nll_b.shape == nll_a.shape
        torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(nll_b, nll_a, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(grad_b, grad_a, rtol=1e-5, atol=1e-6)
        assert grad_b[[0, 5, 36]].abs().max() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("chunk_bytes", [64, 1 << 19])  # one row per chunk, and all rows in one chunk
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_the_criterions_loss_of_logits_takes_its_gradient_in_the_forward(dtype, chunk_bytes, epsilon, monkeypatch):
    """``loss_of_logits`` (the criterion's path for logits: bf16 on a CPU, any dtype on a GPU) computes the
    gradient with the loss: fairseq's loss, NLL and gradient, in the logits' dtype, scaled by the loss's gradient
    (1 in fairseq's bf16 training, where it leaves as computed); the logits untouched; padding rows give nothing;
    with gradients off the same loss; a second backward through it is refused (the gradient is not kept)."""
    monkeypatch.setattr(label_smoothed_loss, "CHUNK_BYTES", chunk_bytes)
    torch.manual_seed(5)
    logits = (torch.randn(37, 50, dtype=torch.float64) * 3).to(dtype)
    target = torch.randint(2, 50, (37,))
    target[[0, 5, 36]] = PAD
    targets = ProjectedLossTargets(target, epsilon, PAD)
    x = logits.double().clone().requires_grad_()
    lprobs = torch.log_softmax(x, dim=-1)  # fp64 throughout
    expected, expected_nll = label_smoothed_nll_loss(lprobs, target.unsqueeze(1), epsilon, ignore_index=PAD)
    expected.backward()
    tolerance = {"rtol": 1e-5, "atol": 1e-4} if dtype != torch.float64 else {"rtol": 1e-12, "atol": 1e-12}
    for scale in (1.0, 2.5):
        y = logits.clone().requires_grad_()
        out = loss_of_logits(y, targets)
        (scale * out.loss).backward()
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        assert out.loss.dtype == out.nll_loss.dtype == compute and y.grad.dtype == dtype
        assert not out.nll_loss.requires_grad
        torch.testing.assert_close(out.loss, expected.to(compute), **tolerance)
        torch.testing.assert_close(out.nll_loss, expected_nll.to(compute), **tolerance)
        torch.testing.assert_close(y.grad, (scale * x.grad).to(dtype))  # dtype's own tolerances
        assert torch.equal(y.detach(), logits) and y.grad[[0, 5, 36]].abs().max() == 0
    with torch.no_grad():
        torch.testing.assert_close(loss_of_logits(logits, targets).loss, out.loss)
    assert torch.equal(y.detach(), logits)
    out = loss_of_logits(logits.clone().requires_grad_(), targets)
    out.loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="taken once already"):
        out.loss.backward()


def test_rows_go_in_cache_sized_chunks_on_a_cpu_and_in_one_elsewhere(monkeypatch):
    # on a GPU each chunk costs kernel launches: chunked, an update on an H200 ran 0.58x as fast as with fairseq's loss
    monkeypatch.setattr(label_smoothed_loss, "CHUNK_BYTES", 4 * 50 * 8)  # 8 rows of 50 fp32 logits
    cpu = list(label_smoothed_loss._chunks(37, 50, torch.device("cpu")))
    assert cpu == [(0, 8), (8, 16), (16, 24), (24, 32), (32, 37)]
    assert list(label_smoothed_loss._chunks(37, 50, torch.device("cuda"))) == [(0, 37)]
    assert list(label_smoothed_loss._chunks(0, 50, torch.device("cuda"))) == []


def test_bf16_logits_give_fp32_loss_and_bf16_gradient():
    torch.manual_seed(1)
    logits = torch.randn(8, 30).bfloat16().requires_grad_()
    target = torch.randint(2, 30, (8,))
    loss, _ = label_smoothed_nll_loss_from_logits(logits, target, 0.1, PAD)
    loss.backward()
    expected, _ = _stock(logits.detach(), target.unsqueeze(1), 0.1)
    assert loss.dtype == torch.float32 and logits.grad.dtype == torch.bfloat16
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-4)


def test_fp64_logits_are_computed_in_fp64():
    """Double-precision logits keep double precision (the gradient tests of sequence_risk rest on it)."""
    torch.manual_seed(2)
    logits = (torch.randn(9, 40, dtype=torch.float64) * 3).requires_grad_()
    target = torch.randint(2, 40, (9,))
    loss, nll = label_smoothed_nll_loss_from_logits(logits, target, 0.1, PAD)
    (loss + nll).backward()
    x = logits.detach().clone().requires_grad_()
    lprobs = torch.log_softmax(x, dim=-1)  # fp64 throughout
    loss_ref, nll_ref = label_smoothed_nll_loss(lprobs, target.unsqueeze(1), 0.1, ignore_index=PAD)
    (loss_ref + nll_ref).backward()
    assert loss.dtype == nll.dtype == logits.grad.dtype == torch.float64
    torch.testing.assert_close(loss, loss_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(nll, nll_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(logits.grad, x.grad, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("chunk_rows", [4, 256])  # ten chunks (the last one short), and all rows in one
@pytest.mark.parametrize("onednn", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_projected_loss_equals_the_loss_of_the_logits(chunk_rows, onednn, bias, monkeypatch):
    """Projection and loss a chunk of rows at a time: the loss, NLL and argmax hits of the logits x W^T + b, and
    the gradients of x, W and b that backpropagating through the logits gives, scaled by the loss's gradient."""
    monkeypatch.setattr(label_smoothed_loss, "PROJECTED_CHUNK_ROWS", chunk_rows)
    monkeypatch.setattr(label_smoothed_loss, "onednn_pays", lambda x, weight_size: onednn)
    torch.manual_seed(3)
    n, d, vocab = 37, 16, 50
    inputs = [torch.randn(n, d), torch.randn(vocab, d) * 0.5, torch.randn(vocab) if bias else None]
    target = torch.randint(2, vocab, (n,))
    argmax = torch.nn.functional.linear(*inputs).argmax(1)
    target[10:20] = argmax[10:20].clamp(min=2)  # some rows whose argmax is the target (unless it is a special)
    target[[0, 5, 36]] = PAD
    targets = ProjectedLossTargets(target, 0.1, PAD, count_correct=True)
    results = []
    for projected in (False, True):
        x, weight, b = (t.clone().requires_grad_() if t is not None else None for t in inputs)
        if projected:
            out = projected_label_smoothed_loss(x, weight, b, targets)
        else:
            out = loss_of_logits(torch.nn.functional.linear(x, weight, b), targets)
        (2.5 * out.loss).backward()
        results.append((out, [t.grad for t in (x, weight, b) if t is not None]))
    (expected, expected_grads), (out, grads) = results
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.nll_loss, expected.nll_loss, rtol=1e-5, atol=1e-5)
    assert not out.nll_loss.requires_grad
    assert int(out.n_correct) == int(expected.n_correct) >= 5
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-6)
    assert grads[0][[0, 5, 36]].abs().max() == 0  # padding rows: no gradient


def test_projected_loss_in_fp64_and_without_gradients(monkeypatch):
    """fp64 stays fp64 and equals fairseq's loss through the log-softmax; with gradients off (validation) the
    same loss; no accuracy unless asked for; no rows at all, no loss and no gradient."""
    monkeypatch.setattr(label_smoothed_loss, "PROJECTED_CHUNK_ROWS", 5)
    torch.manual_seed(4)
    x, weight, b = torch.randn(13, 8, dtype=torch.float64), torch.randn(30, 8, dtype=torch.float64), None
    target = torch.randint(2, 30, (13,))
    targets = ProjectedLossTargets(target, 0.2, PAD)
    out = projected_label_smoothed_loss(x, weight, b, targets)
    lprobs = torch.log_softmax(x @ weight.t(), dim=-1)
    loss_ref, nll_ref = label_smoothed_nll_loss(lprobs, target.unsqueeze(1), 0.2, ignore_index=PAD)
    assert out.loss.dtype == torch.float64 and out.n_correct is None
    torch.testing.assert_close(out.loss, loss_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.nll_loss, nll_ref, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(projected_label_smoothed_loss(x, weight, b, targets).loss, out.loss)
    # no row to score (every position ignored by --ignore-prefix-size): zero loss, zero gradients
    x = x[:0].clone().requires_grad_()
    weight = weight.clone().requires_grad_()
    empty = projected_label_smoothed_loss(x, weight, None, ProjectedLossTargets(target[:0], 0.2, PAD))
    empty.loss.backward()
    assert empty.loss.item() == 0 and x.grad.shape == (0, 8)
    assert torch.equal(weight.grad, torch.zeros_like(weight))


def _criteria(dictionary, **flags):
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    args = {"sentence_avg": False, "label_smoothing": 0.1, "ignore_prefix_size": 0, "report_accuracy": True, **flags}
    return LabelSmoothedCrossEntropyCriterion(task, **args), FusedLabelSmoothedCrossEntropyCriterion(task, **args)


def _assert_fused_follows_fairseqs(model, d, **flags):
    """Both criteria on one batch of 3 pairs through ``model``: the fused one gives fairseq's loss, sample size,
    NLL, accuracy and every parameter's gradient."""
    src = random_batch(d, [5, 7, 3], seed=1)
    tgt = random_batch(d, [6, 4, 5], seed=2, left_pad=False)
    prev = torch.cat([torch.full((3, 1), d.eos()), tgt[:, :-1]], dim=1)
    sample = {
        "net_input": {"src_tokens": src, "src_lengths": src.ne(d.pad()).sum(1), "prev_output_tokens": prev},
        "target": tgt,
        "ntokens": int(tgt.ne(d.pad()).sum()),
    }
    outputs = []
    for criterion in _criteria(d, **flags):
        model.zero_grad()
        loss, sample_size, log = criterion(model, sample)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        outputs.append((loss.detach(), sample_size, log, grads))
    (loss_a, size_a, log_a, grads_a), (loss_b, size_b, log_b, grads_b) = outputs
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=1e-5)
    assert size_b == size_a
    torch.testing.assert_close(log_b["nll_loss"], log_a["nll_loss"], rtol=1e-5, atol=1e-5)
    assert (log_b["n_correct"], log_b["total"]) == (log_a["n_correct"], log_a["total"])
    assert grads_b.keys() == grads_a.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("ignore_prefix_size", [0, 2])
@pytest.mark.parametrize("chunk_rows", [3, 256])
def test_criterion_equals_label_smoothed_cross_entropy_on_a_model(ignore_prefix_size, chunk_rows, monkeypatch):
    """Loss, logging outputs (NLL, accuracy) and every parameter's gradient, through a ConvS2S model, whose
    decoder projects and scores its rows a chunk at a time (of 3 rows, or all in one)."""
    monkeypatch.setattr(label_smoothed_loss, "PROJECTED_CHUNK_ROWS", chunk_rows)
    seed_all(0)
    d = make_dictionary()
    model = build_model("convs2s_iwslt_de_en", dictionary=d, dropout=0.0)
    assert normalizes_by_log_softmax(model)
    _assert_fused_follows_fairseqs(model, d, ignore_prefix_size=ignore_prefix_size)


def test_criterion_equals_label_smoothed_cross_entropy_on_fairseqs_fconv():
    """fairseq's fconv, whose decoder projects every position and ends in a plain log-softmax: the fused pass from
    its stored logits gives fairseq's loss, logging outputs and every parameter's gradient (as README.md says;
    the recipes keep fairseq's criterion for fconv, as fast there)."""
    seed_all(0)
    d = make_dictionary()
    args = fconv_model_args()
    args.dropout = 0.0
    model = FConvModel.build_model(args, SimpleNamespace(source_dictionary=d, target_dictionary=d))
    assert normalizes_by_log_softmax(model) and not fused_label_smoothed.projects_selected_rows(model)
    _assert_fused_follows_fairseqs(model, d)


@pytest.mark.parametrize("in_chunks", [True, False])
def test_the_criterion_projects_only_the_targets_positions(in_chunks, monkeypatch):
    """Through a ConvS2S model (here inside fairseq's two distributed wrappers) the criterion takes the loss of
    the target's non-padding positions alone, from the decoder's features and output projection a chunk at a
    time (on a CPU in fp32) or from their logits (elsewhere); with --sentence-avg it normalizes by sentences as
    fairseq's does; unreduced, it gives fairseq's per-position losses, padding included."""
    scored = []
    projected_loss = fused_label_smoothed.projected_label_smoothed_loss
    monkeypatch.setattr(fused_label_smoothed, "projects_in_chunks", lambda x: in_chunks)
    monkeypatch.setattr(
        fused_label_smoothed,
        "projected_label_smoothed_loss",
        lambda x, *args: scored.append(x.shape[:-1]) or projected_loss(x, *args),
    )
    seed_all(0)
    d = make_dictionary()
    model = build_model("convs2s_iwslt_de_en", dictionary=d, dropout=0.0)
    src = random_batch(d, [5, 7, 3], seed=1)
    tgt = random_batch(d, [6, 2, 5], seed=2, left_pad=False)  # 13 tokens in 18 positions
    prev = torch.cat([torch.full((3, 1), d.eos()), tgt[:, :-1]], dim=1)
    sample = {
        "net_input": {"src_tokens": src, "src_lengths": src.ne(d.pad()).sum(1), "prev_output_tokens": prev},
        "target": tgt,
        "ntokens": 13,
    }
    projected = []
    hook = model.decoder.output_projection.register_forward_pre_hook(lambda m, a: projected.append(a[0].shape[:-1]))
    stock, fused = _criteria(d, sentence_avg=True)
    loss, sample_size, log = fused(_Wrapper(_Wrapper(model)), sample)
    assert (scored, projected) == (([(13,)], []) if in_chunks else ([], [(13,)]))
    expected_loss, expected_size, expected_log = stock(model, sample)
    torch.testing.assert_close(loss, expected_loss)
    assert sample_size == expected_size == 3
    assert {k: v for k, v in log.items() if k not in ("loss", "nll_loss")} == {
        k: v for k, v in expected_log.items() if k not in ("loss", "nll_loss")
    }
    projected.clear()
    scored.clear()
    rows, _, _ = fused(model, sample, reduce=False)
    assert scored == []
    assert projected == [(3, 6)]  # fairseq's unreduced losses are per position: the whole batch
    torch.testing.assert_close(rows, stock(model, sample, reduce=False)[0])
    hook.remove()


class _Wrapper(torch.nn.Module):
    """Stands for fairseq's distributed wrappers: a ModuleProxyWrapper around DistributedDataParallel."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def test_the_check_sees_through_distributed_wrappers_and_instance_overrides():
    """Multi-process training hands the criterion the model inside two wrappers: it still takes the fused pass,
    as through torch.compile's wrapper. A normalization replaced on the instance (not the class) is seen too,
    and falls back."""
    model = build_model("convs2s_iwslt_de_en", dictionary=make_dictionary(), dropout=0.0)
    assert normalizes_by_log_softmax(_Wrapper(_Wrapper(model)))
    compiled = torch.compile(model)  # (compiled at its first call: never here)
    assert fused_label_smoothed.unwrap(_Wrapper(compiled)) is model and normalizes_by_log_softmax(compiled)
    assert fused_label_smoothed.projects_selected_rows(compiled)
    model.decoder.get_normalized_probs = lambda net_output, log_probs, sample=None: net_output[0]
    assert not normalizes_by_log_softmax(_Wrapper(_Wrapper(model)))
    assert not normalizes_by_log_softmax(_Wrapper(torch.nn.Linear(2, 2)))


def test_models_with_their_own_normalization_fall_back_to_fairseqs_computation():
    d = make_dictionary()
    model = build_model("convs2s_iwslt_de_en", dictionary=d, dropout=0.0)

    class Tempered(type(model)):
        def get_normalized_probs(self, net_output, log_probs, sample=None):
            return torch.log_softmax(net_output[0].float() / 2.0, dim=-1)

    model.__class__ = Tempered
    assert not normalizes_by_log_softmax(model)
    src = random_batch(d, [4, 4], seed=3)
    tgt = random_batch(d, [3, 3], seed=4, left_pad=False)
    prev = torch.cat([torch.full((2, 1), d.eos()), tgt[:, :-1]], dim=1)
    sample = {
        "net_input": {"src_tokens": src, "src_lengths": torch.tensor([4, 4]), "prev_output_tokens": prev},
        "target": tgt,
        "ntokens": 6,
    }
    stock, fused = _criteria(d)
    torch.testing.assert_close(fused(model, sample)[0], stock(model, sample)[0])


def test_fairseq_train_with_the_fused_criterion_follows_label_smoothed_cross_entropy(tmp_path):
    """``fairseq-train --criterion fused_label_smoothed_cross_entropy``: the same per-update loss, NLL and
    accuracy as ``label_smoothed_cross_entropy`` and the same weights after 4 updates."""
    make_splits(tmp_path, {"train": 200, "valid": 10})
    preprocess(tmp_path, "bin", trainpref="train", validpref="valid")
    flags = ["--max-update", "4", "--max-tokens", "300", "--log-format", "json", "--log-interval", "1"]
    logs = {}
    for criterion in ("label_smoothed_cross_entropy", "fused_label_smoothed_cross_entropy"):
        proc = train(tmp_path, "bin", criterion, "--criterion", criterion, "--report-accuracy", *flags)
        logs[criterion] = update_records(proc.stdout + proc.stderr)
    stock, fused = logs.values()
    assert len(stock) == len(fused) == 4
    for a, b in zip(stock, fused):
        for key in ("loss", "nll_loss", "accuracy"):
            assert b[key] == pytest.approx(a[key], abs=2e-3), (key, a, b)
    states = [load_checkpoint(tmp_path / c / "checkpoint_last.pt") for c in logs]
    assert max_param_difference(*states) < 1e-4


@pytest.mark.parametrize("label_smoothing", [-0.1, 1.0, 2.0])
def test_label_smoothing_outside_zero_to_one_is_refused(label_smoothing):
    """fairseq's criterion trains on with any value (above 1 the target's weight in the loss is negative)."""
    with pytest.raises(ValueError, match=rf"--label-smoothing must lie in \[0, 1\), got {label_smoothing}"):
        _criteria(make_dictionary(), label_smoothing=label_smoothing)
