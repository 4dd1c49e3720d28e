"""Weight normalization, its folding in place for inference, and the forms its inference products take."""

import copy

import pytest
import torch
import torch.nn.functional as F

from fairseq_convs2s.modules.weight_norm import WeightNorm, WeightNormConvTBC, WeightNormLinear


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


def test_linearized_conv_step_equals_convolution():
    """The kernel flattened to out x (k * in) applied to a window equals conv_tbc at that position."""
    conv = WeightNormConvTBC(3, 4, 3, std=0.5)
    x = torch.randn(5, 2, 3)  # T x B x C
    with torch.no_grad():
        full = conv(x)  # (T - 2) x B x 4
        window = x[1:4].transpose(0, 1).reshape(2, -1)  # B x (k * in), time-major
        assert conv.product_weight().shape == (4, 9)
        torch.testing.assert_close(conv.forward_window(window), full[1])


def test_a_layer_not_folded_in_place_sees_every_update_even_through_param_data():
    """Until it is folded in place a layer folds at every call: fairseq's NAG writes through p.data, which bumps
    no version counter, and an optimizer step or a load in place are seen at once; it keeps no inference form."""
    conv = WeightNormConvTBC(3, 4, 3, std=0.5)
    window = torch.randn(2, 9)
    with torch.no_grad():
        before = conv.weight
        conv.weight_g.data.mul_(2.0)
        torch.testing.assert_close(conv.weight, before * 2.0)
        first = conv.forward_window(window)
        conv.weight_g.mul_(2.0)
        torch.testing.assert_close(conv.forward_window(window), 2 * first - conv.bias)
        conv.load_state_dict({k: v * 3 for k, v in conv.state_dict().items()})
        torch.testing.assert_close(conv.weight, before * 12.0)
        assert conv._inference_forms == {}


def test_a_layer_folded_in_place_keeps_its_forms_sees_in_place_edits_and_copies_without_them():
    """Folded in place, the packed (or transposed) kernel is made once and kept; an in-place edit of the weight
    makes it again; a deep copy (EMA) leaves the kept forms behind and multiplies the same."""
    conv = WeightNormConvTBC(256, 512, 3, std=0.05)
    window = torch.randn(8, 3 * 256)  # 8 x 768 x 512 multiply-adds: the oneDNN path where there is one
    onednn = torch.backends.mkldnn.is_available()
    with torch.no_grad():
        conv.bias.normal_()
        expected = F.linear(window, conv.product_weight(), conv.bias)
        conv.fold_in_place()
        first = conv.forward_window(window)
        torch.testing.assert_close(first, expected, rtol=1e-4, atol=1e-4)
        assert set(conv._inference_forms) == {onednn}
        kept = conv._inference_forms[onednn][1]
        conv.forward_window(window)
        assert conv._inference_forms[onednn][1] is kept
        conv.weight_v.mul_(2.0)
        torch.testing.assert_close(conv.forward_window(window), 2 * first - conv.bias, rtol=1e-4, atol=1e-4)
        twin = copy.deepcopy(conv)
        assert twin._inference_forms == {}
        torch.testing.assert_close(twin.forward_window(window), conv.forward_window(window))


def test_after_make_generation_fast_weights_are_folded_once_for_good():
    """fairseq-generate's preparation folds the model in place: its inference forms outlive batches, and loading
    new weights still replaces them."""
    from utils import build_model, random_batch

    model = build_model("convs2s_iwslt_de_en", shrink=False, dropout=0.0)
    src = random_batch(model.encoder.dictionary, [7, 7], seed=1)
    layer = model.decoder.output_projection  # 256 x 20 here: transposed (the MKL path)
    with torch.no_grad():
        model.make_generation_fast_(need_attn=False)
        form = layer.inference_form(False)
        model.encoder(src)
        assert layer.inference_form(False) is form  # no re-fold once prepared
        state = {k: v * 2 if k.endswith("weight_g") else v for k, v in model.state_dict().items()}
        model.load_state_dict(state)
        torch.testing.assert_close(layer.inference_form(False), form * 2)
    with pytest.raises(RuntimeError, match="cannot train"):
        model.train()


def test_make_generation_fast_folds_in_place_with_the_same_outputs_and_no_copy():
    """The preparation replaces v by the folded weight (and g by its norm): decoding gives bit for bit what it
    gave before, the convolutions' MKL forms are views of ``weight_v`` (no folded copy beside it), the state
    dict still describes the same weights, and folding twice changes nothing."""
    from utils import build_model, full_log_probs, incremental_log_probs, random_batch

    model = build_model("convs2s_iwslt_de_en", dropout=0.0).eval()
    src = random_batch(model.encoder.dictionary, [7, 5], seed=3)
    prev = random_batch(model.decoder.dictionary, [6, 6], seed=4, left_pad=False)
    with torch.no_grad():
        before = (incremental_log_probs(model, src, prev), full_log_probs(model, src, prev))
        folded = {name: m._fold().clone() for name, m in model.named_modules() if isinstance(m, WeightNorm)}
        model.make_generation_fast_(need_attn=False)
        after = (incremental_log_probs(model, src, prev), full_log_probs(model, src, prev))
        for got, expected in zip(after, before):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
        layers = {name: m for name, m in model.named_modules() if isinstance(m, WeightNorm)}
        assert layers and all(m.folded_in_place for m in layers.values())
        views = 0
        for name, layer in layers.items():
            assert torch.equal(layer.weight_v, folded[name])  # the weight, bit for bit
            if isinstance(layer, WeightNormConvTBC) and False in layer._inference_forms:
                form = layer._inference_forms[False][1]
                assert form.untyped_storage().data_ptr() == layer.weight_v.untyped_storage().data_ptr(), name
                views += 1
        assert views  # (some convolution took the MKL form)
        model.make_generation_fast_(need_attn=False)  # a second preparation: no re-fold
        for name, layer in layers.items():
            assert torch.equal(layer.weight_v, folded[name])
        fresh = build_model("convs2s_iwslt_de_en", dropout=0.0).eval()
        fresh.load_state_dict(model.state_dict())
        for name, layer in ((n, m) for n, m in fresh.named_modules() if isinstance(m, WeightNorm)):
            assert not layer.folded_in_place
            torch.testing.assert_close(layer._fold(), folded[name], rtol=1e-6, atol=1e-7)


def test_the_transposed_product_weight_is_a_view_off_the_cpu():
    """MKL gets a contiguous W^T on a CPU; elsewhere (a GPU; checked here on the meta device) the transposed
    view, which a GPU's product takes as it is, so a folded-in-place layer holds no second copy."""
    layer = WeightNormLinear(6, 4, std=0.3)
    with torch.no_grad():
        layer.fold_in_place()
        on_cpu = layer.product_weight_t()
        assert on_cpu.is_contiguous() and on_cpu.data_ptr() != layer.weight_v.data_ptr()
        layer.to("meta")
        off_cpu = layer.product_weight_t()
        assert off_cpu.shape == (6, 4) and off_cpu._is_view() and off_cpu._base is layer.weight_v
