"""Layer specs: fconv's syntax parsed without eval, and clear errors for anything else."""

import pytest

from fairseq_convs2s.models.layer_spec import ConvLayer, LayerSpecError, parse_attention_spec, parse_layer_spec


def test_fconv_spec_strings_parse():
    layers = parse_layer_spec("[(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2")
    assert len(layers) == 15
    assert layers[0] == ConvLayer(512, 3, 1) and layers[9] == ConvLayer(1024, 3, 1) and layers[-1] == (2048, 1, 1)


def test_residual_lookback_and_single_tuple():
    assert parse_layer_spec("[(256, 3), (256, 3, 2), (128, 5, 0)]") == [(256, 3, 1), (256, 3, 2), (128, 5, 0)]
    assert parse_layer_spec("(64, 3)") == [(64, 3, 1)]
    assert parse_layer_spec("2 * [(8, 1)]") == [(8, 1, 1)] * 2


@pytest.mark.parametrize(
    "spec, message",
    [
        ("[(512, 3)", "cannot parse"),
        ("", "empty spec"),
        ("[]", "describes no layers"),
        ("[(512,)]", "layer 0"),
        ("[(512, 3, 1, 1)]", "layer 0"),
        ("[(512, 0)]", "kernel >= 1"),
        ("[(512, 3.5)]", "unsupported expression"),
        ("[(512, 3, 2)]", "residual lookback 2"),
        ("[(True, 3)]", "layer 0"),
        ("__import__('os').system('echo pwned')", "unsupported expression"),
        ("[(512, 3)] * 10 ** 9", "unsupported expression"),
        ("[(16, 3)] * 10000 * 10000", "has 100000000 entries, more than 10000"),
        ("[(16, 3)] * 5000 + [(16, 3)] * 5001", "has 10001 entries"),
        ("3 * [(16, 3)] * 4000", "has 12000 entries"),
        ("[(16, 3)] * 20000", "has 20000 entries, more than 10000"),  # (one count past the limit)
        ("20000 * [(16, 3)]", "has 20000 entries, more than 10000"),
    ],
)
def test_malformed_specs_name_the_flag_and_the_problem(spec, message):
    with pytest.raises(LayerSpecError) as err:
        parse_layer_spec(spec, "--decoder-layers")
    assert "--decoder-layers" in str(err.value) and message in str(err.value)


def test_attention_spec():
    assert parse_attention_spec("True", 3) == [True, True, True]
    assert parse_attention_spec("[False] * 2 + [True]", 3) == [False, False, True]
    with pytest.raises(LayerSpecError, match="2 entries for 3 decoder layers"):
        parse_attention_spec("[True, False]", 3)
    with pytest.raises(LayerSpecError, match="at least one decoder layer"):
        parse_attention_spec("False", 3)
    with pytest.raises(LayerSpecError, match="list of booleans"):
        parse_attention_spec("[1, 0, 1]", 3)
    with pytest.raises(LayerSpecError, match=r"--decoder-attention: cannot parse .*list of booleans") as err:
        parse_attention_spec("[True", 3)
    assert "width, kernel" not in str(err.value)
