"""The model as the paper states it: incremental decoding, causality, padding, scaling, initialization."""

import argparse
import math

import pytest
import torch
from fairseq import utils as fairseq_utils
from utils import (
    PRESETS,
    beam_search,
    build_model,
    full_log_probs,
    incremental_log_probs,
    make_dictionary,
    random_batch,
    seed_all,
)

from fairseq_convs2s.models.convs2s import _load_embedding_file


@pytest.mark.parametrize("arch", PRESETS)
def test_incremental_decoding_equals_full_forward(arch):
    """Step-by-step decoding with cached conv windows gives the full pass's log-probs, for every preset."""
    seed_all(0)
    model = build_model(arch, dropout=0.2).eval()
    d = model.encoder.dictionary
    src = random_batch(d, [5, 11, 8], seed=1)
    prev = random_batch(d, [9, 9, 9], seed=2, left_pad=False)
    with torch.no_grad():
        full = full_log_probs(model, src, prev)
        steps = incremental_log_probs(model, src, prev)
    assert full.shape == (3, 9, len(d))
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


def test_incremental_state_follows_beam_reordering():
    """After reorder_incremental_state, each row continues the hypothesis it was given, as in beam search."""
    seed_all(0)
    model = build_model("convs2s_wmt_en_de").eval()
    d = model.encoder.dictionary
    src = random_batch(d, [6, 6, 6], seed=3)
    prev = random_batch(d, [8, 8, 8], seed=4, left_pad=False)
    order = torch.tensor([2, 0, 0])
    with torch.no_grad():
        encoder_out = model.encoder(src)
        state: dict = {}
        for t in range(4):
            model.decoder(prev[:, : t + 1], encoder_out, incremental_state=state)
        model.decoder.reorder_incremental_state_scripting(state, order)
        encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
        prev = prev.index_select(0, order)
        steps = []
        for t in range(4, 8):
            logits, _ = model.decoder(prev[:, : t + 1], encoder_out, incremental_state=state)
            steps.append(model.get_normalized_probs((logits, None), log_probs=True))
        full = full_log_probs(model, src.index_select(0, order), prev)
    torch.testing.assert_close(torch.cat(steps, 1), full[:, 4:], atol=1e-5, rtol=1e-5)


def test_beam_orders_keep_one_encoder_row_per_source():
    """Beam search's orders (expand each source to a run of hypotheses, reorder within runs, drop finished
    sentences) keep keys and values one row per source, and decoding reads the same source as with the rows
    copied per hypothesis; an order that is not runs falls back to one row per hypothesis."""
    seed_all(0)
    model = build_model("convs2s_iwslt_de_en").eval()
    d = model.encoder.dictionary
    src = random_batch(d, [6, 9, 4], seed=3)
    prev = random_batch(d, [7] * 9, seed=4, left_pad=False)
    orders = [
        torch.arange(3).repeat_interleave(3),  # expand: 3 hypotheses per sentence
        torch.tensor([1, 1, 0, 5, 3, 3, 8, 6, 7]),  # beam search reorders within each sentence
        torch.tensor([3, 5, 5, 6, 6, 8]),  # sentence 0 finishes
        torch.tensor([0, 2, 4]),  # not runs: one row per hypothesis
    ]
    prev[:, 0] = d.eos()  # every hypothesis starts from EOS, so the 3 first steps serve the 9 rows
    expected_rows = {1: (3, 3), 2: (3, 3), 3: (2, 3), 4: (3, 1)}  # step: (encoder rows, hypotheses per source)
    with torch.no_grad():
        encoder_out, state = model.encoder(src), {}
        sources = torch.arange(3)  # the source of each decoder row, followed by hand
        model.decoder(prev[:3, :1], encoder_out, incremental_state=state)
        for t, order in enumerate(orders, start=1):
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
            model.decoder.reorder_incremental_state_scripting(state, order)
            sources = sources.index_select(0, order)
            prev = prev.index_select(0, order if t > 1 else torch.arange(9))
            assert (encoder_out.keys.size(0), encoder_out.hypotheses_per_source) == expected_rows[t]
            logits, _ = model.decoder(prev[:, : t + 1], encoder_out, incremental_state=state)
        full = full_log_probs(model, src.index_select(0, sources), prev[:, : len(orders) + 1])
    last = model.get_normalized_probs((logits, None), log_probs=True)
    torch.testing.assert_close(last, full[:, -1:], atol=1e-5, rtol=1e-5)


@pytest.fixture
def fast_step_rows(monkeypatch):
    """A list of the rows of every decoding step taken on the fast path (``convs2s_runtime.step.decoder_step``)."""
    from fairseq_convs2s.models import decoder as decoder_module

    rows, step = [], decoder_module.decoder_step
    monkeypatch.setattr(decoder_module, "decoder_step", lambda w, g, *a: rows.append(g.size(0)) or step(w, g, *a))
    return rows


@pytest.mark.parametrize("arch", ["convs2s_iwslt_de_en", "convs2s_wmt_en_de"])
def test_the_first_step_of_beam_search_runs_once_per_source(arch, fast_step_rows):
    """Beam search starts each source with G copies of EOS: the fast path's first step computes one row per
    source and repeats its logits, attention and conv windows, decoding as the modules do with every row (the
    same hypotheses and alignments, scores to float rounding); later steps, and first rows that differ, take
    every row; a dropout retained at inference (fairseq's --retain-dropout) leaves the fast path."""
    from fairseq.modules import FairseqDropout

    seed_all(0)
    model = build_model(arch, dictionary=make_dictionary(25)).eval()
    d = model.encoder.dictionary
    src = random_batch(d, [9, 5, 7, 3, 6, 8], seed=7)
    fast = beam_search([model], d, src)
    assert fast_step_rows[:2] == [6, 6 * 5] and len(fast_step_rows) > 2  # the sentences once, then every hypothesis
    model.decoder.fast_path = False
    fast_step_rows.clear()
    through_modules = beam_search([model], d, src)
    assert fast_step_rows == []
    model.decoder.fast_path = True
    for beam, module_beam in zip(fast, through_modules):
        assert [h[0] for h in beam] == [h[0] for h in module_beam]
        for (_, score, attention), (_, module_score, module_attention) in zip(beam, module_beam):
            assert score == pytest.approx(module_score, abs=1e-5)
            torch.testing.assert_close(attention, module_attention, atol=1e-5, rtol=1e-5)

    expand = torch.arange(6).repeat_interleave(2)
    with torch.no_grad():
        encoder_out = model.encoder.reorder_encoder_out(model.encoder(src), expand)
        first = torch.full((12, 1), d.eos())
        fast_step_rows.clear()
        model.decoder(first, encoder_out, incremental_state={})
        first[1, 0] = d.unk()  # one source's two rows differ
        model.decoder(first, encoder_out, incremental_state={})
        assert fast_step_rows == [6, 12]
        for m in model.modules():
            if isinstance(m, FairseqDropout):
                m.apply_during_inference = True
        encoder_out = model.encoder.reorder_encoder_out(model.encoder(src), expand)  # a new batch sees the dropout
        model.decoder(torch.full((12, 1), d.eos()), encoder_out, incremental_state={})
    assert fast_step_rows == [6, 12]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_fast_path_decodes_as_the_modules(dtype, monkeypatch):
    """At inference a decoding step takes the fast path (folded products, the attention moved to the sources), not
    the decoder's modules, and decodes as the modules do through beam search's expand and reorder (oneDNN and MKL
    products both: full widths; fp32, and bf16 and fp16 as fairseq-generate --bf16 and --fp16 run it), to the
    rounding of the attention's W_d and W_c moved to the sources; past the folded sources' budget the steps take
    W_d and W_c as products; with gradients on or a dropout retained (fairseq's --retain-dropout) they go through
    the modules; a copy of a model that decoded decodes exactly the same."""
    import copy

    from fairseq.modules import FairseqDropout

    from convs2s_runtime import step

    seed_all(0)
    model = build_model("convs2s_iwslt_de_en", shrink=False, dropout=0.1).eval().to(dtype)
    d = model.encoder.dictionary
    src = random_batch(d, [6, 9, 4], seed=3)
    prev = random_batch(d, [6] * 6, seed=4, left_pad=False)
    expand, reorder = torch.arange(3).repeat_interleave(2), torch.tensor([1, 0, 3, 3, 5, 4])
    module_calls = []
    model.decoder.blocks[0].attention.query_projection.register_forward_hook(lambda *_: module_calls.append(1))

    def decode(m, steps=6):
        encoder_out, state, rows, out = m.encoder.reorder_encoder_out(m.encoder(src), expand), {}, prev, []
        for t in range(steps):
            if t == 3:
                encoder_out = m.encoder.reorder_encoder_out(encoder_out, reorder)
                m.decoder.reorder_incremental_state_scripting(state, reorder)
                rows = rows.index_select(0, reorder)
            out.append(m.decoder(rows[:, : t + 1], encoder_out, incremental_state=state)[0])
        return torch.cat(out, 1)  # 6 x steps x V

    with torch.no_grad():
        fast = decode(model)
        assert not module_calls
        model.decoder.fast_path = False
        through_modules = decode(model)
        assert len(module_calls) == 6
        model.decoder.fast_path = True
        # float rounding, logits under 0.5: 1e-6 in fp32, about one step in bf16 (2^-9) and a few in fp16 (2^-12)
        atol = {torch.float32: 1e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
        torch.testing.assert_close(fast, through_modules, rtol=1e-5, atol=atol)
        # the attention's tensors moved to the sources: B' x S x (2 d per attending layer + f), in bytes
        keys = model.encoder(src).keys
        budget = keys.size(0) * keys.size(1) * (2 * 3 * 256 + 256) * keys.element_size()
        monkeypatch.setattr(step, "FOLDED_SOURCES_BUDGET", budget - 1)  # a byte short: W_d and W_c at every step
        torch.testing.assert_close(decode(model), through_modules, rtol=0, atol=0)
        assert len(module_calls) == 6  # (as products, not through the modules)
        monkeypatch.setattr(step, "FOLDED_SOURCES_BUDGET", budget)
        torch.testing.assert_close(decode(model), fast, rtol=0, atol=0)
        torch.testing.assert_close(decode(copy.deepcopy(model)), fast, rtol=0, atol=0)
        for m in model.modules():
            if isinstance(m, FairseqDropout):
                m.apply_during_inference = True
        module_calls.clear()
        decode(model, steps=2)
        assert len(module_calls) == 2
    module_calls.clear()
    for m in model.modules():
        if isinstance(m, FairseqDropout):
            m.apply_during_inference = False
    decode(model, steps=2)  # gradients on
    assert len(module_calls) == 2


def test_decoder_is_causal():
    """Changing target token t changes no output before t (and does change the output at t)."""
    seed_all(0)
    model = build_model("convs2s_wmt_en_fr").eval()  # kernel-1 and kernel-3 blocks, mixed widths
    d = model.encoder.dictionary
    src = random_batch(d, [7], seed=5)
    prev = random_batch(d, [10], seed=6, left_pad=False)
    with torch.no_grad():
        base = full_log_probs(model, src, prev)
        for t in (1, 5, 9):
            changed = prev.clone()
            changed[0, t] = d.nspecial + (changed[0, t] - d.nspecial + 1) % (len(d) - d.nspecial)
            out = full_log_probs(model, src, changed)
            torch.testing.assert_close(out[:, :t], base[:, :t], atol=0, rtol=0)
            assert (out[:, t] - base[:, t]).abs().max() > 1e-4


@pytest.mark.parametrize("arch", ["convs2s_iwslt_de_en", "convs2s_wmt_en_de"])
@pytest.mark.parametrize("left_pad_source", [True, False])
def test_sentence_scores_the_same_alone_and_in_a_padded_batch(arch, left_pad_source):
    """Padded sources (on the left, fairseq's default, or on the right: --left-pad-source False) and right-padded
    targets leave every real position's log-probs unchanged."""
    seed_all(0)
    model = build_model(arch).eval()
    d = model.encoder.dictionary
    src = random_batch(d, [4, 12, 9], seed=7, left_pad=left_pad_source)  # sentence 0 has 8 pads
    prev = random_batch(d, [5, 11, 7], seed=8, left_pad=False)  # and 6 on the right
    with torch.no_grad():
        batch = full_log_probs(model, src, prev)
        alone = full_log_probs(model, src[:1, -4:] if left_pad_source else src[:1, :4], prev[:1, :5])
    torch.testing.assert_close(batch[:1, :5], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("training", [True, False])
def test_output_rows_give_the_logits_of_the_selected_positions(training, share):
    """``output_rows`` (B x T bool): the logits of exactly those positions, in row-major order, equal to the full
    pass's (in training with dropout too: its mask is still drawn over every position); the vocabulary
    projection sees those rows alone."""
    seed_all(0)
    model = build_model(dropout=0.3, share_input_output_embed=share).train(training)
    d = model.encoder.dictionary
    src = random_batch(d, [4, 9, 7], seed=7)
    prev = random_batch(d, [6, 3, 8], seed=8, left_pad=False)
    rows = prev.ne(d.pad())  # B x T: 17 of 24 positions
    projected = []
    hook = model.decoder.output_projection.register_forward_pre_hook(lambda m, a: projected.append(a[0].shape))
    with torch.set_grad_enabled(training):
        seed_all(5)
        full = model(src, None, prev)[0]  # B x T x V
        seed_all(5)
        selected = model(src, None, prev, output_rows=rows)[0]  # N x V
    hook.remove()
    assert selected.shape == (17, len(d))
    torch.testing.assert_close(selected, full[rows])
    width = model.decoder.output_projection.in_features
    assert [tuple(s) for s in projected] == [(3, 8, width), (17, width)]  # (at inference: its product)
    if training:
        assert not torch.equal(full, model(src, None, prev)[0])  # dropout was on: the seeds made the masks equal


def test_output_rows_must_match_a_full_pass():
    model = build_model().eval()
    d = model.encoder.dictionary
    src = random_batch(d, [4, 5], seed=1)
    prev = random_batch(d, [3, 2], seed=2, left_pad=False)
    with pytest.raises(ValueError, match="output_rows"):
        model(src, None, prev, output_rows=prev.ne(d.pad())[:, :-1])
    encoder_out = model.encoder(src)
    with pytest.raises(ValueError, match="incremental"):
        model.decoder(prev[:, :1], encoder_out, incremental_state={}, output_rows=prev[:, :1].ne(d.pad()))


def test_attention_ignores_source_padding_and_is_a_distribution():
    """The averaged attention returned for alignments puts no weight on pads and sums to one per target step."""
    seed_all(0)
    model = build_model("convs2s_iwslt_de_en").eval()
    model.decoder.make_generation_fast_(need_attn=True)
    d = model.encoder.dictionary
    src = random_batch(d, [3, 7], seed=9)
    prev = random_batch(d, [4, 4], seed=10, left_pad=False)
    with torch.no_grad():
        _, attn = model(src, None, prev)
    assert attn.shape == (2, 4, 7)
    assert attn[0, :, :4].abs().max() == 0  # 4 pads on the left of sentence 0
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 4))


def test_encoder_gradient_is_scaled_by_number_of_attention_layers():
    """Gradients into the encoder output are scaled by 1/(2 * attention layers); the decoder's are not (3.4)."""
    model = build_model("convs2s_iwslt_de_en", dropout=0.0, decoder_attention="[True, False, True]")
    assert model.decoder.num_attention_layers == 2
    assert model.encoder.grad_scale == pytest.approx(1 / 4)
    d = model.encoder.dictionary
    src = random_batch(d, [6, 6], seed=11)
    prev = random_batch(d, [5, 5], seed=12, left_pad=False)

    def grads(scale):
        model.zero_grad()
        model.encoder.grad_scale = scale
        logits, _ = model(src, None, prev)
        logits.float().log_softmax(-1).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    scaled, unscaled = grads(0.25), grads(1.0)
    for name in ("encoder.output_projection.weight_v", "encoder.blocks.0.conv.weight_v"):
        torch.testing.assert_close(scaled[name], unscaled[name] * 0.25, atol=1e-7, rtol=1e-4)
    torch.testing.assert_close(scaled["decoder.blocks.1.conv.weight_v"], unscaled["decoder.blocks.1.conv.weight_v"])
    # the token embeddings also reach the attention values directly, a path the scaling leaves alone
    emb_s, emb_u = scaled["encoder.embed_tokens.weight"], unscaled["encoder.embed_tokens.weight"]
    assert not torch.allclose(emb_s, emb_u * 0.25, atol=1e-6)


def _std(t):
    return t.float().std().item()


def test_initialization_follows_the_paper():
    """N(0, 0.1) embeddings, sqrt(4p/n) before a GLU, sqrt(p/n) elsewhere, zero biases, w == v at start (3.5)."""
    torch.manual_seed(0)
    dropout = 0.2
    p = 1 - dropout
    model = build_model(
        "convs2s",
        dictionary=make_dictionary(2000),
        shrink=False,
        dropout=dropout,
        encoder_layers="[(256, 3)] * 2 + [(512, 1)]",
        decoder_layers="[(256, 3)] * 2",
        encoder_embed_dim=128,
        decoder_embed_dim=128,
        decoder_out_embed_dim=128,
    )
    enc, dec = model.encoder, model.decoder
    assert _std(enc.embed_tokens.weight[enc.dictionary.nspecial :]) == pytest.approx(0.1, rel=0.05)
    assert enc.embed_tokens.weight[enc.padding_idx].abs().max() == 0
    assert _std(enc.embed_positions.weight[enc.padding_idx + 1 :]) == pytest.approx(0.1, rel=0.05)
    conv = enc.blocks[1].conv  # input width 256, kernel 3, feeds a GLU, input dropped out
    assert _std(conv.weight_v) == pytest.approx(math.sqrt(4 * p / (3 * 256)), rel=0.05)
    kernel1 = enc.blocks[2].conv
    assert _std(kernel1.weight_v) == pytest.approx(math.sqrt(4 * p / 256), rel=0.05)
    assert _std(enc.input_projection.weight_v) == pytest.approx(math.sqrt(p / 128), rel=0.05)
    assert _std(enc.blocks[2].residual_projection.weight_v) == pytest.approx(math.sqrt(1 / 256), rel=0.05)
    assert _std(enc.output_projection.weight_v) == pytest.approx(math.sqrt(1 / 512), rel=0.05)
    attention = dec.blocks[0].attention
    assert _std(attention.query_projection.weight_v) == pytest.approx(math.sqrt(1 / 256), rel=0.05)
    assert _std(dec.output_projection.weight_v) == pytest.approx(math.sqrt(p / 128), rel=0.05)
    for name, param in model.named_parameters():
        if name.endswith("bias"):
            assert param.abs().max() == 0, name
    for module in model.modules():
        if hasattr(module, "weight_v"):
            torch.testing.assert_close(module.weight, module.weight_v)  # g starts at ||v||


def test_every_layer_but_the_lookup_tables_is_weight_normalized():
    """Every weight matrix is derived from (g, v), except the token and position tables."""
    model = build_model("convs2s_wmt_en_de")
    plain = [n for n, p in model.named_parameters() if n.endswith("weight") and p.dim() > 1]
    assert sorted(plain) == sorted(
        [f"{side}.{table}.weight" for side in ("encoder", "decoder") for table in ("embed_tokens", "embed_positions")]
    )


def test_shared_input_output_embeddings():
    """--share-input-output-embed ties the decoder's output matrix to its input lookup table."""
    model = build_model("convs2s_iwslt_de_en", share_input_output_embed=True)
    assert model.decoder.output_projection.weight is model.decoder.embed_tokens.weight
    with pytest.raises(ValueError, match="decoder-out-embed-dim"):
        build_model("convs2s_iwslt_de_en", share_input_output_embed=True, decoder_out_embed_dim=7)


def test_all_embeddings_shared():
    """--share-all-embeddings: one table (one parameter) for the source tokens, the target tokens and the output
    projection; the model decodes step by step as in a full pass."""
    seed_all(0)
    model = build_model("convs2s_iwslt_de_en", share_all_embeddings=True)
    table = model.encoder.embed_tokens.weight
    assert model.decoder.embed_tokens.weight is table and model.decoder.output_projection.weight is table
    separate = build_model("convs2s_iwslt_de_en", share_input_output_embed=True)
    counts = [sum(p.numel() for p in m.parameters()) for m in (model, separate)]
    assert counts[1] - counts[0] == table.numel()
    d = model.encoder.dictionary
    src = random_batch(d, [5, 7], seed=1)
    prev = random_batch(d, [6, 6], seed=2, left_pad=False)
    model.eval()
    with torch.no_grad():
        steps, full = incremental_log_probs(model, src, prev), full_log_probs(model, src, prev)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"decoder_out_embed_dim": 7}, r"--share-all-embeddings needs --decoder-out-embed-dim \(7\)"),
        ({"decoder_embed_path": "vectors.txt"}, "reads pre-trained vectors from --encoder-embed-path only"),
    ],
)
def test_sharing_all_embeddings_refuses_what_two_tables_would_need(flags, message):
    with pytest.raises(ValueError, match=message):
        build_model("convs2s_iwslt_de_en", share_all_embeddings=True, **flags)


def test_sharing_all_embeddings_needs_a_joined_dictionary():
    from types import SimpleNamespace

    from fairseq_convs2s.models.convs2s import ConvS2SModel

    args = argparse.Namespace(share_all_embeddings=True, encoder_layers="[(8, 3)]", decoder_layers="[(8, 3)]")
    args.encoder_embed_dim = args.decoder_embed_dim = args.decoder_out_embed_dim = 8
    task = SimpleNamespace(source_dictionary=make_dictionary(20), target_dictionary=make_dictionary(21))
    with pytest.raises(ValueError, match="one dictionary for both languages.*--joined-dictionary"):
        ConvS2SModel.build_model(args, task)


def test_a_checkpoint_with_two_tables_does_not_load_into_one():
    """Two different tables loaded into a model of one would overwrite each other; equal ones load."""
    seed_all(0)
    separate = build_model("convs2s_iwslt_de_en", share_input_output_embed=True)
    shared = build_model("convs2s_iwslt_de_en", share_all_embeddings=True)
    with pytest.raises(ValueError, match="separate source and target embeddings.*without the flag"):
        shared.load_state_dict(separate.state_dict())
    seed_all(1)
    again = build_model("convs2s_iwslt_de_en", share_all_embeddings=True)
    again.load_state_dict(shared.state_dict())
    assert torch.equal(again.encoder.embed_tokens.weight, shared.decoder.output_projection.weight)


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"dropout": 1.5}, r"--dropout must lie in \[0, 1\).*got 1.5"),  # fconv: math domain error
        ({"dropout": 1.0}, r"--dropout must lie in \[0, 1\).*got 1.0"),  # fconv: NaN gradients
        ({"dropout": -0.1}, r"--dropout must lie in \[0, 1\).*got -0.1"),  # fconv: trains on
        ({"encoder_embed_dim": 0, "decoder_embed_dim": 0}, "--encoder-embed-dim must be at least 1, got 0"),
        ({"decoder_out_embed_dim": 0}, "--decoder-out-embed-dim must be at least 1, got 0"),
        ({"max_source_positions": 0}, "--max-source-positions must be at least 1, got 0"),
        ({"max_target_positions": -3}, "--max-target-positions must be at least 1, got -3"),
    ],
)
def test_impossible_sizes_are_refused_naming_the_flag(flags, message):
    with pytest.raises(ValueError, match=message):
        build_model("convs2s_iwslt_de_en", **flags)


def test_the_edges_of_the_sizes_build():
    model = build_model("convs2s_iwslt_de_en", dropout=0.0, max_source_positions=1, max_target_positions=1)
    assert model.encoder.max_positions() == 1 and model.decoder.max_positions() == 1


def test_attention_scaling_variants():
    """'paper' drops fconv's two sqrt(0.5) factors: same weights, different outputs."""
    seed_all(0)
    fconv_style = build_model("convs2s_iwslt_de_en").eval()
    paper = build_model("convs2s_iwslt_de_en", attention_scaling="paper").eval()
    paper.load_state_dict(fconv_style.state_dict())
    d = fconv_style.encoder.dictionary
    src, prev = random_batch(d, [6], seed=1), random_batch(d, [5], seed=2, left_pad=False)
    with torch.no_grad():
        a, b = full_log_probs(fconv_style, src, prev), full_log_probs(paper, src, prev)
    assert paper.encoder.value_scale == 1.0 and fconv_style.encoder.value_scale == pytest.approx(math.sqrt(0.5))
    assert (a - b).abs().max() > 1e-4


def test_source_longer_than_the_position_table_is_a_clear_error():
    """A too-long source names the limit and the flags to change, instead of an index error inside torch."""
    model = build_model("convs2s_iwslt_de_en", max_source_positions=8).eval()
    src = random_batch(model.encoder.dictionary, [9], seed=0)
    with pytest.raises(ValueError, match=r"9 tokens is longer than the model's 8 positions.*--truncate-source"):
        model.encoder(src)
    model.encoder(src[:, 1:])  # 8 tokens fit


def test_max_positions_counts_tokens():
    """--max-source-positions N lets N tokens in (fconv's table held N - pad - 1)."""
    model = build_model("convs2s_iwslt_de_en", max_source_positions=20, max_target_positions=30)
    assert model.max_positions() == (20, 30)
    assert model.encoder.embed_positions.weight.size(0) == 20 + model.encoder.padding_idx + 1


def test_validation_after_optimizer_steps_uses_the_updated_weights():
    """Train steps with fairseq's NAG (updates via p.data), then eval: the output is that of the new weights."""
    import copy
    from types import SimpleNamespace

    from fairseq.optim.nag import FairseqNAG

    seed_all(0)
    model = build_model("convs2s_iwslt_de_en", dropout=0.0)
    d = model.encoder.dictionary
    src, prev = random_batch(d, [6, 6], seed=1), random_batch(d, [5, 5], seed=2, left_pad=False)
    optimizer = FairseqNAG(SimpleNamespace(lr=[0.5], momentum=0.99, weight_decay=0.0), list(model.parameters()))
    for _ in range(3):
        model.eval()
        with torch.no_grad():
            cached = full_log_probs(model, src, prev)
        fresh_model = copy.deepcopy(model)
        with torch.no_grad():
            fresh = full_log_probs(fresh_model, src, prev)  # folds afresh
        torch.testing.assert_close(cached, fresh)
        model.train()
        optimizer.zero_grad()
        full_log_probs(model, src, prev).sum().neg().backward()
        optimizer.step()


def test_pretrained_embeddings_are_loaded_from_a_file(tmp_path):
    """--encoder-embed-path reads fairseq's text format (a header line, then 'word v1 v2 ...')."""
    d = make_dictionary()
    path = tmp_path / "emb.txt"
    path.write_text("2 12\nw3 " + " ".join(["0.5"] * 12) + "\n\nnot_in_dict " + " ".join(["9"] * 12) + " \n\n")
    model = build_model("convs2s_iwslt_de_en", dictionary=d, encoder_embed_path=str(path))
    torch.testing.assert_close(model.encoder.embed_tokens.weight[d.index("w3")], torch.full((12,), 0.5))
    assert not torch.allclose(model.decoder.embed_tokens.weight[d.index("w3")], torch.full((12,), 0.5))
    ours, fairseqs = _load_embedding_file(str(path), d, 12, "encoder"), fairseq_utils.parse_embedding(str(path))
    assert ours.keys() == fairseqs.keys() - {""}  # fairseq's reader files each blank line under ''
    assert all(torch.equal(ours[w], fairseqs[w]) and ours[w].dtype == fairseqs[w].dtype for w in ours)


@pytest.mark.parametrize(
    "lines, message",
    [
        (["w3 " + " ".join(["0.5"] * 8)], r"emb.txt, line 2: 'w3' has 8 numbers, the model's decoder embeddings 12 "),
        (["w3 " + " ".join(["0.5"] * 12), "w4 0.5 abc"], r"emb.txt, line 3: 'w4' is not followed by numbers"),
        (["", "w3 " + " ".join(["0.5"] * 12), "", "w4"], r"line 5: 'w4' has 0 numbers"),  # blank lines skipped
    ],
)
def test_a_malformed_embedding_file_names_the_flag_file_line_and_word(tmp_path, lines, message):
    """fconv stops with torch's 'expanded size ... must match' or 'could not convert string to float'."""
    path = tmp_path / "emb.txt"
    path.write_text("2 12\n" + "\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="--decoder-embed-path .*" + message):
        build_model("convs2s_iwslt_de_en", decoder_embed_path=str(path))
