"""Weight normalization and the folded-weight cache used while decoding."""

import copy

import pytest
import torch
import torch.nn.functional as F

from fairseq_convs2s.modules.weight_norm import (
    ONEDNN_MIN_MACS,
    WeightNormConvTBC,
    WeightNormLinear,
    start_inference_pass,
)


def test_weight_is_g_times_direction():
    layer = WeightNormLinear(6, 4, std=0.3)
    with torch.no_grad():
        layer.weight_g.copy_(torch.arange(1.0, 5.0).view(4, 1))
    expected = layer.weight_g * layer.weight_v / layer.weight_v.norm(dim=1, keepdim=True)
    torch.testing.assert_close(layer.weight, expected)
    torch.testing.assert_close(layer.weight.norm(dim=1), torch.arange(1.0, 5.0))


def test_conv_is_normalized_per_output_channel_like_fconv():
    conv = WeightNormConvTBC(3, 5, 2, std=0.5)
    assert conv.weight_v.shape == (2, 3, 5) and conv.weight_g.shape == (1, 1, 5)
    torch.testing.assert_close(conv.weight.pow(2).sum((0, 1)).sqrt(), conv.weight_g.view(-1))


def test_gradients_flow_to_g_and_v_in_training():
    layer = WeightNormLinear(3, 2, std=0.5)
    layer(torch.randn(4, 3)).sum().backward()
    assert layer.weight_g.grad is not None and layer.weight_v.grad is not None


def test_folded_weight_cache_sees_parameter_updates():
    """With gradients off the weight is folded once; an in-place update (optimizer step, load) refreshes it."""
    conv = WeightNormConvTBC(3, 4, 3, std=0.5)
    with torch.no_grad():
        first = conv.weight
        assert conv.weight is first  # cached
        lin = conv.linearized_weight()
        assert lin.shape == (4, 9)
        conv.weight_g.mul_(2.0)  # what an optimizer step does
        torch.testing.assert_close(conv.weight, first * 2.0)
        torch.testing.assert_close(conv.linearized_weight(), lin * 2.0)
        conv.load_state_dict({k: v * 3 for k, v in conv.state_dict().items()})
        torch.testing.assert_close(conv.weight, first * 6.0)


def test_linearized_conv_step_equals_convolution():
    """The kernel flattened to out x (k * in) applied to a window equals conv_tbc at that position."""
    conv = WeightNormConvTBC(3, 4, 3, std=0.5)
    x = torch.randn(5, 2, 3)  # T x B x C
    with torch.no_grad():
        full = conv(x)  # (T - 2) x B x 4
        window = x[1:4].transpose(0, 1).reshape(2, -1)  # B x (k * in), time-major
        step = torch.nn.functional.linear(window, conv.linearized_weight(), conv.bias)
    torch.testing.assert_close(step, full[1])


def test_updates_through_param_data_are_seen_by_the_next_inference_pass():
    """fairseq's NAG writes through p.data, which bumps no version counter: a new pass must still re-fold."""
    conv = WeightNormConvTBC(3, 4, 3, std=0.5)
    with torch.no_grad():
        start_inference_pass()
        before = conv.weight
        conv.weight_g.data.mul_(2.0)
        start_inference_pass()
        torch.testing.assert_close(conv.weight, before * 2.0)


@pytest.mark.parametrize("rows", [1, 64])
def test_inference_linear_equals_the_training_product(rows):
    """At inference a linear goes through oneDNN with a packed weight (64 rows: 64 x 512 x 1024 multiply-adds,
    over ONEDNN_MIN_MACS) or through MKL on the cached W^T (1 row: under); both give x W^T + b."""
    layer = WeightNormLinear(512, 1024, std=0.05)
    with torch.no_grad():
        layer.bias.normal_()
    x = torch.randn(rows, 512)
    expected = F.linear(x, layer.weight, layer.bias)  # gradients on: the plain product
    with torch.no_grad():
        start_inference_pass()
        torch.testing.assert_close(layer(x), expected, rtol=1e-4, atol=1e-4)
    packed = rows * 512 * 1024 >= ONEDNN_MIN_MACS and torch.backends.mkldnn.is_available()
    assert ("weight.onednn" in layer._inference_cache) == packed
    assert ("weight.t" in layer._inference_cache) == (not packed)


def test_packed_window_product_sees_parameter_updates_and_survives_deepcopy():
    """The packed conv kernel is re-packed after an in-place update; a deep copy (EMA) drops the cache; the
    packed matrix is the only copy of the kernel the cache keeps."""
    conv = WeightNormConvTBC(256, 512, 3, std=0.05)
    window = torch.randn(8, 3 * 256)  # 8 x 768 x 512 multiply-adds: the oneDNN path
    with torch.no_grad():
        conv.bias.normal_()
        first = conv.forward_window(window)
        packed = "linearized.onednn" if torch.backends.mkldnn.is_available() else "linearized.t"
        assert set(conv._inference_cache) == {packed}
        torch.testing.assert_close(first, F.linear(window, conv.linearized_weight(), conv.bias), rtol=1e-4, atol=1e-4)
        conv.weight_g.mul_(2.0)
        torch.testing.assert_close(conv.forward_window(window), 2 * first - conv.bias, rtol=1e-4, atol=1e-4)
        twin = copy.deepcopy(conv)
        assert twin._inference_cache == {}
        torch.testing.assert_close(twin.forward_window(window), conv.forward_window(window))


def test_training_linear_through_onednn_has_the_gradients_of_f_linear():
    """A large training product (64 x 512 x 1024) runs through oneDNN's autograd product; its output and the
    gradients of x, g, v and b equal those of F.linear on the same weight."""
    layer = WeightNormLinear(512, 1024, std=0.05)
    x = torch.randn(4, 16, 512, requires_grad=True)
    grad = torch.randn(4, 16, 1024)
    out = layer(x)
    if torch.backends.mkldnn.is_available():
        assert out.grad_fn.next_functions[0][0].name().startswith("_OneDNNLinear")  # under the view
    params = (x, layer.weight_g, layer.weight_v, layer.bias)
    got = torch.autograd.grad(out, params, grad)
    expected_out = F.linear(x, layer.weight, layer.bias)
    expected = torch.autograd.grad(expected_out, params, grad)
    torch.testing.assert_close(out, expected_out, rtol=1e-4, atol=1e-4)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)


def test_after_make_generation_fast_weights_are_folded_once_for_good():
    """fairseq-generate's preparation freezes the model: the folded (and packed) weights outlive inference
    passes, and loading new weights still replaces them."""
    from utils import build_model, random_batch

    model = build_model("convs2s_iwslt_de_en", shrink=False, dropout=0.0)
    src = random_batch(model.encoder.dictionary, [7, 7], seed=1)
    layer = model.decoder.output_projection  # 256 x 20 here: folded and transposed (MKL path)
    with torch.no_grad():
        model.encoder(src)
        before = layer._derived("weight", layer._fold)
        model.encoder(src)  # a new pass re-folds while the model may still be trained
        assert layer._derived("weight", layer._fold) is not before
        model.make_generation_fast_(need_attn=False)
        folded = layer._derived("weight", layer._fold)
        model.encoder(src)
        assert layer._derived("weight", layer._fold) is folded  # no re-fold once prepared
        state = {k: v * 2 if k.endswith("weight_g") else v for k, v in model.state_dict().items()}
        model.load_state_dict(state)
        torch.testing.assert_close(layer._derived("weight", layer._fold), folded * 2)
    with pytest.raises(RuntimeError, match="cannot train"):
        model.train()


def test_make_generation_fast_folds_in_place_with_the_same_outputs_and_no_copy():
    """The preparation replaces v by the folded weight (and g by its norm): decoding gives bit for bit what it
    gave before, the products' MKL forms are views of ``weight_v`` (no folded copy beside it), the state dict
    still describes the same weights, and folding twice changes nothing."""
    from utils import build_model, full_log_probs, incremental_log_probs, random_batch

    from fairseq_convs2s.modules.weight_norm import _WeightNorm

    model = build_model("convs2s_iwslt_de_en", dropout=0.0).eval()
    src = random_batch(model.encoder.dictionary, [7, 5], seed=3)
    prev = random_batch(model.decoder.dictionary, [6, 6], seed=4, left_pad=False)
    with torch.no_grad():
        before = (incremental_log_probs(model, src, prev), full_log_probs(model, src, prev))
        folded = {name: m._fold().clone() for name, m in model.named_modules() if isinstance(m, _WeightNorm)}
        model.make_generation_fast_(need_attn=False)
        after = (incremental_log_probs(model, src, prev), full_log_probs(model, src, prev))
        for got, expected in zip(after, before):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
        layers = {name: m for name, m in model.named_modules() if isinstance(m, _WeightNorm)}
        assert layers and all(m._v_is_weight for m in layers.values())
        for name, layer in layers.items():
            assert torch.equal(layer.weight_v, folded[name])  # the weight, bit for bit
            for key, (_, form) in layer._inference_cache.items():
                if not form.is_mkldnn and key != "weight.t":  # on a CPU W^T is a contiguous copy for MKL
                    assert form.untyped_storage().data_ptr() == layer.weight_v.untyped_storage().data_ptr(), key
        assert any(key == "linearized.t" for m in layers.values() for key in m._inference_cache)  # views seen
        model.make_generation_fast_(need_attn=False)  # a second preparation: no re-fold
        for name, layer in layers.items():
            assert torch.equal(layer.weight_v, folded[name])
        fresh = build_model("convs2s_iwslt_de_en", dropout=0.0).eval()
        fresh.load_state_dict(model.state_dict())
        for name, layer in ((n, m) for n, m in fresh.named_modules() if isinstance(m, _WeightNorm)):
            assert not layer._v_is_weight
            torch.testing.assert_close(layer._fold(), folded[name], rtol=1e-6, atol=1e-7)


def test_the_transposed_product_weight_is_a_view_off_the_cpu():
    """MKL gets a contiguous W^T on a CPU; elsewhere (a GPU; checked here on the meta device) the transposed
    view, which a GPU's product takes as it is, so a folded-in-place layer holds no second copy."""
    layer = WeightNormLinear(6, 4, std=0.3)
    with torch.no_grad():
        layer.fold_in_place()
        on_cpu = layer._product_weight_t()
        assert on_cpu.is_contiguous() and on_cpu.data_ptr() != layer.weight_v.data_ptr()
        layer.to("meta")
        off_cpu = layer._product_weight_t()
        assert off_cpu.shape == (6, 4) and off_cpu._is_view() and off_cpu._base is layer.weight_v


needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


@pytest.fixture
def im2col_calls(monkeypatch):
    """A list that grows by one at every call of the im2col convolution (which still runs)."""
    from fairseq_convs2s.modules import weight_norm

    calls = []
    real = weight_norm._Im2colConvTBC.apply
    monkeypatch.setattr(weight_norm._Im2colConvTBC, "apply", lambda *args: calls.append(1) or real(*args))
    return calls


@needs_onednn
@pytest.mark.parametrize(
    "steps, kernel, left, right",
    [(9, 3, 1, 1), (9, 3, 2, 0), (9, 4, 1, 2), (9, 1, 0, 0), (2, 5, 4, 0), (1, 3, 1, 1)],
    ids=["encoder", "causal", "even-kernel", "kernel-1", "shorter-than-kernel", "one-step"],
)
def test_im2col_convolution_equals_conv_tbc_with_gradients(steps, kernel, left, right):
    """The training convolution as one oneDNN product over the shifted inputs gives conv_tbc's output and the
    same gradients for the input, the kernel and the bias, whatever the padding and however short the input."""
    from fairseq_convs2s.modules.weight_norm import _Im2colConvTBC

    torch.manual_seed(0)
    x = torch.randn(steps, 3, 8, requires_grad=True)  # T x B x in
    weight = torch.randn(kernel, 8, 6, requires_grad=True)  # k x in x out
    bias = torch.randn(6, requires_grad=True)
    expected = torch.conv_tbc(F.pad(x, (0, 0, 0, 0, left, right)), weight, bias, 0)  # T' x B x out
    grad = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, (x, weight, bias), grad)
    out = _Im2colConvTBC.apply(x, weight, bias, left, right)
    torch.testing.assert_close(out, expected)
    for got, want in zip(torch.autograd.grad(out, (x, weight, bias), grad), expected_grads):
        torch.testing.assert_close(got, want)


@needs_onednn
def test_training_convolution_takes_the_im2col_product_where_onednn_pays(im2col_calls):
    """In training a wide enough convolution runs as the im2col product (the same values as conv_tbc); with
    gradients off, or under the size thresholds, conv_tbc."""
    calls = im2col_calls
    conv = WeightNormConvTBC(256, 512, 3, std=0.05)
    x = torch.randn(26, 8, 256)  # 208 rows x 3 * 256 x 512 multiply-adds: over both thresholds
    out = conv(x, padding=(2, 0))
    assert calls == [1]
    with torch.no_grad():
        torch.testing.assert_close(out, conv(x, padding=(2, 0)), rtol=1e-4, atol=1e-4)  # conv_tbc, padded
    assert calls == [1]
    small = WeightNormConvTBC(8, 6, 3, std=0.5)
    small(torch.randn(5, 2, 8), padding=(1, 1))
    assert calls == [1]


@needs_onednn
def test_a_training_update_through_the_im2col_convolution_equals_conv_tbcs(monkeypatch, im2col_calls):
    """A tiny model with the oneDNN thresholds lowered trains through the im2col convolutions (encoder and causal
    decoder blocks): the same loss and parameter gradients as through conv_tbc."""
    from utils import build_model, make_dictionary, random_batch

    from fairseq_convs2s.modules import weight_norm

    dictionary = make_dictionary()
    src = random_batch(dictionary, [7, 5, 6])  # B x S, left-padded
    prev = random_batch(dictionary, [6, 6, 3], seed=1, left_pad=False)  # B x T, right-padded
    target = random_batch(dictionary, [6, 6, 3], seed=2, left_pad=False)

    def loss_and_grads(model):
        model.zero_grad()
        logits, _ = model(src, None, prev)  # B x T x V
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), target.view(-1))
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    model = build_model(dictionary=dictionary, dropout=0.0)
    expected_loss, expected = loss_and_grads(model)
    monkeypatch.setattr(weight_norm, "ONEDNN_MIN_WEIGHT", 0)
    monkeypatch.setattr(weight_norm, "ONEDNN_MIN_MACS", 0)
    loss, grads = loss_and_grads(model)
    assert len(im2col_calls) == len(model.encoder.blocks) + len(model.decoder.blocks)
    torch.testing.assert_close(loss, expected_loss)
    assert grads.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(grads[name], expected[name], rtol=1e-4, atol=1e-5, msg=name)


@needs_onednn
def test_im2col_convolution_in_bf16_follows_conv_tbc():
    """bf16 training (``--bf16`` on a CPU) takes the same product: within bf16 rounding of conv_tbc in fp32."""
    from fairseq_convs2s.modules.weight_norm import _Im2colConvTBC

    torch.manual_seed(0)
    x = torch.randn(9, 4, 32)
    weight = torch.randn(3, 32, 16) / 10
    bias = torch.randn(16)
    expected = torch.conv_tbc(F.pad(x, (0, 0, 0, 0, 2, 0)), weight, bias, 0)
    x16, w16, b16 = (t.bfloat16().requires_grad_() for t in (x, weight, bias))
    out = _Im2colConvTBC.apply(x16, w16, b16, 2, 0)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, rtol=0.05, atol=0.05)
    out.float().sum().backward()
    assert x16.grad.dtype == torch.bfloat16 and w16.grad.shape == (3, 32, 16)
    torch.testing.assert_close(b16.grad.float(), torch.full((16,), 9.0 * 4))
