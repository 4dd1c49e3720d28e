"""The products of inference (``convs2s_runtime.products``) and of training on a CPU (oneDNN linears, the im2col
convolution): the same values and gradients as the plain torch ops."""

import pytest
import torch
import torch.nn.functional as F

from convs2s_runtime import products
from convs2s_runtime.products import ONEDNN_MIN_MACS, Product
from fairseq_convs2s.modules.training_products import Im2colConvTBC, im2col_pays
from fairseq_convs2s.modules.weight_norm import WeightNormConvTBC, WeightNormLinear


@pytest.mark.parametrize("rows", [1, 64])
def test_a_product_equals_f_linear_in_either_form(rows):
    """A product goes through oneDNN with a packed weight (64 rows: 64 x 512 x 1024 multiply-adds, over
    ONEDNN_MIN_MACS) or through MKL on W^T (1 row: under); both give x W^T + b, and each form is made once."""
    weight, bias = torch.randn(1024, 512) / 20, torch.randn(1024)
    made = []
    product = Product(
        lambda onednn: made.append(onednn) or Product.of_weight(weight, bias)._form(onednn), bias, 512 * 1024
    )
    x = torch.randn(rows, 512)
    with torch.no_grad():
        torch.testing.assert_close(product(x), F.linear(x, weight, bias), rtol=1e-4, atol=1e-4)
        product(x)
    packed = rows * 512 * 1024 >= ONEDNN_MIN_MACS and torch.backends.mkldnn.is_available()
    assert made == [packed]


def test_a_bf16_product_works_on_any_cpu():
    """In bf16 a large product goes through oneDNN only where oneDNN has the instructions for it (AVX512BW/VL/DQ or
    AVX-NE-CONVERT); on a CPU without them (AMD Zen 3) packing the weight raised "mkldnn_reorder_linear_weight: bf16
    path needs the cpu support ...", ending fairseq-generate --bf16. Elsewhere MKL's product serves."""
    torch.manual_seed(0)
    weight, bias = (torch.randn(1024, 512) / 20).bfloat16(), torch.randn(1024).bfloat16()
    x = torch.randn(64, 512).bfloat16()
    with torch.no_grad():
        out = Product.of_weight(weight, bias)(x)
    torch.testing.assert_close(out.float(), F.linear(x.float(), weight.float(), bias.float()), rtol=2e-2, atol=2e-2)
    onednn = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert products.onednn_pays(x, 512 * 1024) == onednn
    steps = torch.randn(64, 4, 128).bfloat16()  # (the training convolution's choice follows: 3 x 128 x 1024 weight)
    assert im2col_pays(steps, torch.randn(3, 128, 1024).bfloat16()) == onednn
    assert im2col_pays(steps.float(), torch.randn(3, 128, 1024)) == torch.backends.mkldnn.is_available()


def test_training_linear_through_onednn_has_the_gradients_of_f_linear():
    """A large training product (64 x 512 x 1024) runs through oneDNN's autograd product; its output and the
    gradients of x, g, v and b equal those of F.linear on the same weight."""
    layer = WeightNormLinear(512, 1024, std=0.05)
    x = torch.randn(4, 16, 512, requires_grad=True)
    grad = torch.randn(4, 16, 1024)
    out = layer(x)
    if torch.backends.mkldnn.is_available():
        assert out.grad_fn.next_functions[0][0].name().startswith("OneDNNLinear")  # under the view
    params = (x, layer.weight_g, layer.weight_v, layer.bias)
    got = torch.autograd.grad(out, params, grad)
    expected_out = F.linear(x, layer.weight, layer.bias)
    expected = torch.autograd.grad(expected_out, params, grad)
    torch.testing.assert_close(out, expected_out, rtol=1e-4, atol=1e-4)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)


needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


@pytest.fixture
def im2col_calls(monkeypatch):
    """A list that grows by one at every call of the im2col convolution (which still runs)."""
    calls = []
    real = Im2colConvTBC.apply
    monkeypatch.setattr(Im2colConvTBC, "apply", lambda *args: calls.append(1) or real(*args))
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
    torch.manual_seed(0)
    x = torch.randn(steps, 3, 8, requires_grad=True)  # T x B x in
    weight = torch.randn(kernel, 8, 6, requires_grad=True)  # k x in x out
    bias = torch.randn(6, requires_grad=True)
    expected = torch.conv_tbc(F.pad(x, (0, 0, 0, 0, left, right)), weight, bias, 0)  # T' x B x out
    grad = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, (x, weight, bias), grad)
    out = Im2colConvTBC.apply(x, weight, bias, left, right)
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
    monkeypatch.setattr(products, "ONEDNN_MIN_WEIGHT", 0)
    monkeypatch.setattr(products, "ONEDNN_MIN_MACS", 0)
    loss, grads = loss_and_grads(model)
    assert len(im2col_calls) == len(model.encoder.blocks) + len(model.decoder.blocks)
    torch.testing.assert_close(loss, expected_loss)
    assert grads.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(grads[name], expected[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="oneDNN has no bf16 product on this CPU (im2col_pays is False there: test_a_bf16_product_works_on_any_cpu)",
)
def test_im2col_convolution_in_bf16_follows_conv_tbc():
    """bf16 training (``--bf16`` on a CPU) takes the same product: within bf16 rounding of conv_tbc in fp32."""
    torch.manual_seed(0)
    x = torch.randn(9, 4, 32)
    weight = torch.randn(3, 32, 16) / 10
    bias = torch.randn(16)
    expected = torch.conv_tbc(F.pad(x, (0, 0, 0, 0, 2, 0)), weight, bias, 0)
    x16, w16, b16 = (t.bfloat16().requires_grad_() for t in (x, weight, bias))
    out = Im2colConvTBC.apply(x16, w16, b16, 2, 0)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, rtol=0.05, atol=0.05)
    out.float().sum().backward()
    assert x16.grad.dtype == torch.bfloat16 and w16.grad.shape == (3, 32, 16)
    torch.testing.assert_close(b16.grad.float(), torch.full((16,), 9.0 * 4))
