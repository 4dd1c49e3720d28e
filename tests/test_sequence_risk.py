"""Tests of ``--criterion sequence_risk`` (``fairseq_convs2s/criterions``): the loss against a hand computation,
its gradient against finite differences, alpha = 1 against fairseq's label-smoothed cross-entropy, the candidate
sets, the costs, the start-up errors, and fairseq-train with the criterion, in one process and in two."""

import json
import math
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from cli_helpers import (
    MODEL_FLAGS,
    NO_PREFETCH,
    OPTIM_FLAGS,
    PLUGIN_DIR,
    load_checkpoint,
    make_splits,
    max_param_difference,
    preprocess,
    tail,
    train,
)
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.data import Dictionary, data_utils
from utils import build_model, make_dictionary, random_batch

from fairseq_convs2s.criterions import SequenceRiskCriterion, sequence_risk
from fairseq_convs2s.criterions.costs import COSTS, edit_cost, sentence_bleu_cost
from fairseq_convs2s.criterions.fused_label_smoothed import normalizes_by_log_softmax
from fairseq_convs2s.train import free_port

EPS = 0.1


def _task(dictionary):
    return SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)


def _criterion(dictionary, **overrides):
    args = dict(sentence_avg=False, risk_alpha=0.3, risk_candidates=3, risk_cost="edit", label_smoothing=EPS)
    args.update(overrides)
    return SequenceRiskCriterion(_task(dictionary), **args)


def _sample(dictionary, src_lengths=(5, 3, 6), tgt_lengths=(4, 6, 2)):
    """A translation batch as fairseq's LanguagePairDataset collates it: sources left-padded, targets right."""
    src = random_batch(dictionary, list(src_lengths), seed=1)
    tgt = random_batch(dictionary, list(tgt_lengths), seed=2, left_pad=False)
    rows = [t[t.ne(dictionary.pad())] for t in tgt]
    prev = data_utils.collate_tokens(rows, dictionary.pad(), dictionary.eos(), move_eos_to_beginning=True)
    net_input = {"src_tokens": src, "src_lengths": src.ne(dictionary.pad()).sum(1), "prev_output_tokens": prev}
    return {"net_input": net_input, "target": tgt, "ntokens": int(tgt.ne(dictionary.pad()).sum())}


def _seq(*tokens, eos=2):
    return torch.tensor([*tokens, eos])


# three sources; ragged sets, and a duplicate in the first (a set counts it once)
FIXED_CANDIDATES = [
    [_seq(4, 5), _seq(6), _seq(4, 5)],
    [_seq(7, 8, 9), _seq(10)],
    [_seq(11, 12, 13, 14), _seq(5, 5), _seq(12)],
]
FIXED_COSTS = torch.tensor(
    [
        [0.0, 0.2, 0.9, 0.5],
        [0.0, 0.7, 0.1, 0.0],  # the last column is filler (the set has 2 candidates): its cost must not matter
        [0.0, 0.4, 1.0, 0.3],
    ]
)


@pytest.fixture(params=["from-logits", "log-softmax"])
def tiny(request):
    """A tiny ConvS2S model in double precision (no dropout) and a batch of three sentence pairs, for each of the
    criterion's two ways to its token terms: from the logits in one fused pass (a model that normalizes by a
    plain log-softmax: ConvS2S), or through the model's ``get_normalized_probs`` (any other model).

    fairseq's ``get_normalized_probs`` computes the log-softmax in float32 whatever the model's precision (for
    fp16 training); the instance here keeps double precision end to end (the fused pass computes fp64 logits in
    fp64; for the other way the instance gets a log-softmax in fp64), so that the finite differences and the
    hand computation can be compared to 1e-9 rather than to float32 rounding.
    """
    torch.manual_seed(0)
    dictionary = make_dictionary(20)
    model = build_model(dictionary=dictionary, dropout=0.0).double()
    if request.param == "log-softmax":
        model.get_normalized_probs = _double_log_softmax
    assert normalizes_by_log_softmax(model) == (request.param == "from-logits")
    return SimpleNamespace(dictionary=dictionary, model=model, sample=_sample(dictionary))


def _sequence_log_prob(model, src_row, tokens, dictionary):
    """log p(tokens | source) scored alone (batch of one, no padding): an independent path from the criterion's."""
    src = src_row[src_row.ne(dictionary.pad())].unsqueeze(0)
    prev = torch.cat([tokens.new_tensor([dictionary.eos()]), tokens[:-1]]).unsqueeze(0)
    lprobs = F.log_softmax(model(src, None, prev)[0][0], dim=-1)  # T x V, in the model's (double) precision
    return lprobs, sum(lprobs[t, tok].item() for t, tok in enumerate(tokens.tolist()))


def _hand_loss(model, sample, dictionary, candidates, costs, alpha, include_reference):
    """alpha * TokLS + (1 - alpha) * Risk, summed over the batch, in plain Python arithmetic."""
    vocab = len(dictionary)
    total = 0.0
    for b, cands in enumerate(candidates):
        ref = sample["target"][b][sample["target"][b].ne(dictionary.pad())]
        src_row = sample["net_input"]["src_tokens"][b]
        ref_lprobs, ref_score = _sequence_log_prob(model, src_row, ref, dictionary)
        # label-smoothed token loss: (1 - eps - eps/(V-1)) * nll + eps/(V-1) * sum over the vocabulary of -log p
        eps_i = EPS / (vocab - 1)
        token_ls = sum(
            (1 - EPS - eps_i) * -ref_lprobs[t, tok].item() + eps_i * -ref_lprobs[t].sum().item()
            for t, tok in enumerate(ref.tolist())
        )
        members, seen = [], set()
        if include_reference:
            members.append((ref_score, 0.0))
            seen.add(tuple(ref.tolist()))
        for k, cand in enumerate(cands, start=1):
            if tuple(cand.tolist()) in seen:
                continue
            seen.add(tuple(cand.tolist()))
            members.append((_sequence_log_prob(model, src_row, cand, dictionary)[1], costs[b, k].item()))
        norm = sum(math.exp(s) for s, _ in members)
        risk = sum(c * math.exp(s) / norm for s, c in members)
        total += alpha * token_ls + (1 - alpha) * risk
    return total


# ---- the loss --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("include_reference", [False, True])
def test_loss_equals_hand_computed_expected_risk(tiny, include_reference):
    """On a fixed candidate set with given costs the criterion's loss is alpha * TokLS + (1 - alpha) * Risk with
    Risk = sum_u cost(u) p(u|x) / sum_u' p(u'|x), the probabilities scored one sentence at a time by hand;
    a duplicated candidate counts once, and the filler of a short set does not count."""
    crit = _criterion(tiny.dictionary, risk_alpha=0.3, risk_include_reference=include_reference)
    cset = crit.build_candidate_set(tiny.sample, FIXED_CANDIDATES, costs=FIXED_COSTS)
    loss, sample_size, log = crit.loss_on_candidates(tiny.model, tiny.sample, cset)
    expected = _hand_loss(
        tiny.model, tiny.sample, tiny.dictionary, FIXED_CANDIDATES, FIXED_COSTS, 0.3, include_reference
    )
    assert loss.item() == pytest.approx(expected, rel=1e-9)
    assert sample_size == tiny.sample["ntokens"] == log["ntokens"]

    # the risk alone (alpha = 0), and a sanity anchor: it is an average of the costs, so inside their range
    crit0 = _criterion(tiny.dictionary, risk_alpha=0.0, risk_include_reference=include_reference)
    risk = crit0.loss_on_candidates(tiny.model, tiny.sample, cset)[0].item()
    expected_risk = _hand_loss(
        tiny.model, tiny.sample, tiny.dictionary, FIXED_CANDIDATES, FIXED_COSTS, 0.0, include_reference
    )
    assert risk == pytest.approx(expected_risk, rel=1e-9)
    assert log["risk"].item() == pytest.approx(expected_risk, rel=1e-9)
    assert 0.0 < risk < 3 * 1.0


def test_length_normalized_scores(tiny):
    """--risk-length-normalize renormalizes exp(mean token log-probability) instead of p(u|x)."""
    crit = _criterion(tiny.dictionary, risk_alpha=0.0, risk_length_normalize=True)
    cset = crit.build_candidate_set(tiny.sample, FIXED_CANDIDATES, costs=FIXED_COSTS)
    loss = crit.loss_on_candidates(tiny.model, tiny.sample, cset)[0].item()
    expected = 0.0
    for b, cands in enumerate(FIXED_CANDIDATES):
        src_row = tiny.sample["net_input"]["src_tokens"][b]
        distinct = {tuple(c.tolist()): k for k, c in reversed(list(enumerate(cands, start=1)))}
        scored = [
            (_sequence_log_prob(tiny.model, src_row, torch.tensor(c), tiny.dictionary)[1] / len(c), FIXED_COSTS[b, k])
            for c, k in distinct.items()
        ]
        norm = sum(math.exp(s) for s, _ in scored)
        expected += sum(float(c) * math.exp(s) / norm for s, c in scored)
    assert loss == pytest.approx(expected, rel=1e-9)


# Parameters checked against finite differences: those downstream of the last attention softmax. The attention
# computes its softmax in float32 whatever the model's precision (modules/attention.py, meant for fp16 training),
# so a parameter upstream of it moves the loss in float32 steps and its central difference is rounding noise;
# downstream of it the forward pass is double precision end to end. These parameters feed every logit of every
# row, so the whole criterion (log-softmax, gathers, the softmax over candidates, the costs, alpha) is exercised.
_FD_PARAMETERS = (
    "decoder.blocks.2.attention.output_projection.",
    "decoder.out_embed_projection.",
    "decoder.output_projection.",
)


@pytest.mark.parametrize("alpha", [0.3, 0.0])
def test_gradient_matches_finite_differences(tiny, alpha):
    """The autograd gradient of the loss (combined, and risk alone) equals central differences, in double
    precision, at random entries of the attention output, the output embedding and the vocabulary projection."""
    crit = _criterion(tiny.dictionary, risk_alpha=alpha, risk_include_reference=True)
    cset = crit.build_candidate_set(tiny.sample, FIXED_CANDIDATES, costs=FIXED_COSTS)
    tiny.model.zero_grad()
    crit.loss_on_candidates(tiny.model, tiny.sample, cset)[0].backward()

    params = [(n, p) for n, p in tiny.model.named_parameters() if n.startswith(_FD_PARAMETERS)]
    assert len(params) == 9, [n for n, _ in params]
    gen = torch.Generator().manual_seed(3)
    for name, param in params:
        for _ in range(2):
            idx = tuple(torch.randint(s, (1,), generator=gen).item() for s in param.shape)
            analytic = param.grad[idx].item()
            h = 1e-6
            with torch.no_grad():
                param[idx] += h
            plus = crit.loss_on_candidates(tiny.model, tiny.sample, cset)[0].item()
            with torch.no_grad():
                param[idx] -= 2 * h
            minus = crit.loss_on_candidates(tiny.model, tiny.sample, cset)[0].item()
            with torch.no_grad():
                param[idx] += h
            numeric = (plus - minus) / (2 * h)
            assert analytic == pytest.approx(numeric, rel=1e-5, abs=1e-9), (name, idx, analytic, numeric)

    # the risk carries gradient into the whole network, the encoder included
    encoder_grad = sum(p.grad.abs().sum().item() for p in tiny.model.encoder.parameters() if p.grad is not None)
    assert encoder_grad > 1e-6


def test_one_encoding_per_source_equals_a_source_row_per_candidate(tiny, monkeypatch):
    """A ConvS2S model encodes each source once for its 1 + n decoder rows; other models get the source repeated
    for every row. Both give the same loss and the same gradient everywhere, the encoder's included."""
    crit = _criterion(tiny.dictionary, risk_include_reference=True)
    cset = crit.build_candidate_set(tiny.sample, FIXED_CANDIDATES, costs=FIXED_COSTS)
    encodings = []
    hook = tiny.model.encoder.register_forward_hook(lambda m, args, out: encodings.append(args[0].size(0)))

    def loss_and_grads():
        tiny.model.zero_grad()
        loss = crit.loss_on_candidates(tiny.model, tiny.sample, cset)[0]
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in tiny.model.named_parameters() if p.grad is not None}

    assert sequence_risk.reads_rows_per_source(tiny.model)
    shared_loss, shared_grads = loss_and_grads()
    monkeypatch.setattr(sequence_risk, "reads_rows_per_source", lambda model: False)
    repeated_loss, repeated_grads = loss_and_grads()
    hook.remove()
    assert encodings == [3, 3 * 4]  # three sources; then one row per reference and candidate (width 1 + 3)
    assert shared_loss == pytest.approx(repeated_loss, rel=1e-12)
    assert shared_grads.keys() == repeated_grads.keys()
    for name, grad in shared_grads.items():
        torch.testing.assert_close(grad, repeated_grads[name], rtol=1e-9, atol=1e-12, msg=name)


def test_only_the_non_padding_positions_are_projected(tiny, monkeypatch):
    """The candidates' rows are padded to the longest; a ConvS2S model projects only their non-padding positions
    to the vocabulary (where the terms come from the logits), with the same loss and gradient as projecting
    every position."""
    crit = _criterion(tiny.dictionary, risk_include_reference=True)
    cset = crit.build_candidate_set(tiny.sample, FIXED_CANDIDATES, costs=FIXED_COSTS)
    projected = []
    hook = tiny.model.decoder.output_projection.register_forward_pre_hook(
        lambda m, args: projected.append(args[0].shape[:-1])
    )

    def loss_and_grads():
        tiny.model.zero_grad()
        loss = crit.loss_on_candidates(tiny.model, tiny.sample, cset)[0]
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in tiny.model.named_parameters() if p.grad is not None}

    selected_loss, selected_grads = loss_and_grads()
    monkeypatch.setattr(sequence_risk, "projects_selected_rows", lambda model: False)
    full_loss, full_grads = loss_and_grads()
    hook.remove()
    rows = [len(seq) for row in cset.tokens for seq in row]  # 3 sources x (reference + 3 candidates), with EOS
    padded = (len(rows), max(rows))  # every row padded to the longest
    assert sum(rows) < len(rows) * max(rows)
    if normalizes_by_log_softmax(tiny.model):  # the fused pass: only the tokens' own positions
        assert projected == [(sum(rows),), padded]
    else:  # the model's own normalization needs the whole B x T x V
        assert projected == [padded, padded]
    assert selected_loss == pytest.approx(full_loss, rel=1e-12)
    assert selected_grads.keys() == full_grads.keys()
    for name, grad in selected_grads.items():
        torch.testing.assert_close(grad, full_grads[name], rtol=1e-9, atol=1e-12, msg=name)


def _double_log_softmax(net_output, log_probs=True, sample=None):
    return F.log_softmax(net_output[0], dim=-1)


def _lsce(model, sample, dictionary):
    """fairseq's label_smoothed_cross_entropy, through a log-softmax in the model's (double) precision."""
    crit = LabelSmoothedCrossEntropyCriterion(_task(dictionary), sentence_avg=False, label_smoothing=EPS)
    model.zero_grad()
    own = vars(model).get("get_normalized_probs")
    model.get_normalized_probs = _double_log_softmax
    try:
        loss, sample_size, log = crit(model, sample)
    finally:
        if own is None:
            del model.get_normalized_probs
        else:
            model.get_normalized_probs = own
    loss.backward()
    return loss.item(), sample_size, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_alpha_one_equals_label_smoothed_cross_entropy(tiny):
    """With --risk-alpha 1 the loss, the sample size and the gradient are fairseq's label_smoothed_cross_entropy's,
    both through forward (no candidates generated) and with candidate rows sharing the batched forward pass."""
    ref_loss, ref_size, ref_grads = _lsce(tiny.model, tiny.sample, tiny.dictionary)
    crit = _criterion(tiny.dictionary, risk_alpha=1.0)

    def check(loss, sample_size):
        assert loss.item() == pytest.approx(ref_loss, rel=1e-10)
        assert sample_size == ref_size
        tiny.model.zero_grad()
        loss.backward()
        for name, grad in ref_grads.items():
            got = dict(tiny.model.named_parameters())[name].grad
            torch.testing.assert_close(got, grad, rtol=1e-8, atol=1e-12, msg=name)

    loss, sample_size, log = crit(tiny.model, tiny.sample)
    assert "risk" not in log
    check(loss, sample_size)
    cset = crit.build_candidate_set(tiny.sample, FIXED_CANDIDATES, costs=FIXED_COSTS)
    loss, sample_size, log = crit.loss_on_candidates(tiny.model, tiny.sample, cset)
    check(loss, sample_size)
    assert log["token_loss"].item() == pytest.approx(ref_loss, rel=1e-10)


def test_sentence_avg_normalizes_by_sentences(tiny):
    """--sentence-avg (fairseq's flag) makes sample_size the number of sentences, as in label_smoothed_cross_entropy."""
    crit = _criterion(tiny.dictionary, sentence_avg=True)
    cset = crit.build_candidate_set(tiny.sample, FIXED_CANDIDATES, costs=FIXED_COSTS)
    assert crit.loss_on_candidates(tiny.model, tiny.sample, cset)[1] == 3


# ---- candidate sets -------------------------------------------------------------------------------------------


def test_generated_candidates_and_training_mode(tiny):
    """Generation returns n EOS-terminated candidates per source, from beam search or sampling, leaves the model
    in the mode it was in, and forward trains: a finite loss with a gradient."""
    tiny.model.float()
    sample = _sample(tiny.dictionary)
    for sampling in (False, True):
        crit = _criterion(tiny.dictionary, risk_candidates=4, risk_sampling=sampling, risk_cost="bleu")
        tiny.model.train()
        cands = crit.generate_candidates(tiny.model, sample)
        assert tiny.model.training
        assert [len(c) for c in cands] == [4, 4, 4]
        # the length limit is fairseq's: a * (the batch's source width) + b tokens, EOS excluded
        max_len = int(1.2 * sample["net_input"]["src_tokens"].size(1)) + 10
        for row in cands:
            for c in row:
                assert c[-1].item() == tiny.dictionary.eos() and c.ne(tiny.dictionary.eos())[:-1].all()
                assert len(c) <= max_len + 1
        tiny.model.eval()
        crit.generate_candidates(tiny.model, sample)
        assert not tiny.model.training

    tiny.model.train()
    tiny.model.zero_grad()
    loss, _, log = _criterion(tiny.dictionary, risk_candidates=4, risk_cost="bleu")(tiny.model, sample)
    loss.backward()
    assert math.isfinite(loss.item()) and 0.0 <= log["risk"].item() <= 3.0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in tiny.model.parameters())


def test_sampling_topk_above_the_vocabulary_samples_from_all_tokens(tiny):
    """--risk-sampling-topk larger than the target vocabulary samples from every token, as -1 does; it failed at
    the first update inside fairseq's search (RuntimeError: selected index k out of range)."""
    tiny.model.float()
    crit = _criterion(tiny.dictionary, risk_candidates=4, risk_sampling=True, risk_sampling_topk=100)
    torch.manual_seed(1)
    cands = crit.generate_candidates(tiny.model, tiny.sample)
    torch.manual_seed(1)
    everything = _criterion(tiny.dictionary, risk_candidates=4, risk_sampling=True).generate_candidates(
        tiny.model, tiny.sample
    )
    assert [[c.tolist() for c in row] for row in cands] == [[c.tolist() for c in row] for row in everything]


def test_include_reference_puts_the_reference_in_the_set(tiny):
    """With --risk-include-reference column 0 is the reference, in the set, with cost 0 from the cost function's
    side (a candidate equal to the reference is then a duplicate); without it the reference is out of the set and
    a candidate equal to it counts."""
    ref1 = tiny.sample["target"][1][tiny.sample["target"][1].ne(tiny.dictionary.pad())]
    candidates = [list(FIXED_CANDIDATES[0]), [ref1.clone(), _seq(10)], list(FIXED_CANDIDATES[2])]
    for cost in ("edit", "bleu"):
        with_ref = _criterion(tiny.dictionary, risk_include_reference=True, risk_cost=cost)
        cset = with_ref.build_candidate_set(tiny.sample, candidates)
        for b in range(3):
            ref = tiny.sample["target"][b][tiny.sample["target"][b].ne(tiny.dictionary.pad())]
            assert torch.equal(cset.tokens[b][0], ref)
            assert cset.in_set[b, 0] and cset.costs[b, 0] == 0.0
        # the candidate equal to the reference: its own cost is 0 too, and it is not counted twice
        assert cset.costs[1, 1] == pytest.approx(0.0, abs=1e-9)
        assert cset.in_set[1].tolist() == [True, False, True, False]

    without = _criterion(tiny.dictionary, risk_include_reference=False).build_candidate_set(tiny.sample, candidates)
    assert without.in_set[1].tolist() == [False, True, True, False]
    assert not without.in_set[:, 0].any()


def test_costs():
    """The costs lie in [0, 1], 0 for the reference itself; edit distance by hand; BLEU on detokenized text."""
    assert edit_cost([1, 2, 3], [1, 2, 3]) == 0.0
    assert edit_cost([1, 3], [1, 2, 3]) == pytest.approx(1 / 3)  # one deletion over length 3
    assert edit_cost([4, 5], [1, 2, 3]) == pytest.approx(1.0)
    assert edit_cost([], []) == 0.0
    assert sentence_bleu_cost("the cat sat on the mat", "the cat sat on the mat") == 0.0
    assert sentence_bleu_cost("dog", "the cat sat on the mat") == 1.0
    partial = sentence_bleu_cost("the cat sat on a mat", "the cat sat on the mat")
    assert 0.0 < partial < 1.0
    assert set(COSTS) == {"bleu", "chrf", "edit"}
    assert COSTS["bleu"].needs_text and COSTS["chrf"].needs_text and not COSTS["edit"].needs_text

    # sentencepiece pieces are joined before BLEU: '▁the ▁c at' is the text 'the cat'
    d = Dictionary()
    for s in ("\u2581the", "\u2581c", "at", "\u2581cat"):
        d.add_symbol(s)
    crit = _criterion(d, risk_cost="bleu", risk_post_process="sentencepiece")
    ref = torch.tensor([d.index("\u2581the"), d.index("\u2581cat"), d.eos()])
    pieces = torch.tensor([d.index("\u2581the"), d.index("\u2581c"), d.index("at"), d.eos()])
    costs = crit.candidate_costs([[ref, pieces]])
    assert costs.tolist() == [[0.0, 0.0]]


@pytest.mark.parametrize("cost", ["bleu", "chrf"])
def test_an_unk_earns_no_credit_against_an_unk_in_the_reference(cost):
    """An <unk> in a candidate scores as any wrong word against an <unk> in the reference. chrF compared the
    placeholder strings' characters (UNKNOWNTOKENINHYP against UNKNOWNTOKENINREF), so a candidate with <unk>
    where the reference had one cost 0.15 against 0.50 for a real word: --risk-cost chrf trained towards <unk>."""
    d = Dictionary()
    for s in ("a", "man", "rides", "down", "the", "street", "z"):
        d.add_symbol(s)
    crit = _criterion(d, risk_cost=cost)

    def ids(*words):
        return torch.tensor([d.unk() if w == "<unk>" else d.index(w) for w in words] + [d.eos()])

    ref = ids("a", "man", "rides", "<unk>", "down", "the", "street")
    with_unk = ids("a", "man", "rides", "<unk>", "down", "the", "street")
    wrong_word = ids("a", "man", "rides", "z", "down", "the", "street")  # "z": no character of the reference
    costs = crit.candidate_costs([[ref, with_unk, wrong_word]])[0]
    assert costs[1].item() == pytest.approx(costs[2].item()) and costs[1].item() > 0.0, costs.tolist()


# ---- start-up errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"risk_alpha": -0.1}, "--risk-alpha must lie in [0, 1]"),
        ({"risk_alpha": 1.5}, "--risk-alpha must lie in [0, 1]"),
        ({"risk_candidates": 0}, "--risk-candidates must be at least 1"),
        ({"risk_candidates": 1}, "no gradient"),
        ({"risk_post_process": "bpe"}, "--risk-post-process 'bpe'"),
        ({"label_smoothing": 1.0}, "--label-smoothing"),
        ({"risk_max_len_a": 0.0, "risk_max_len_b": 0}, "--risk-max-len-a"),
        ({"risk_max_len_a": 0.3, "risk_max_len_b": 0}, "--risk-max-len-b >= 1"),
        ({"risk_max_len_a": -0.5}, "--risk-max-len-a must be >= 0"),
        ({"risk_sampling_topk": 5}, "--risk-sampling-topk 5 applies to --risk-sampling only"),
    ],
)
def test_bad_config_raises_at_build_time(overrides, message):
    with pytest.raises(ValueError) as err:
        _criterion(make_dictionary(), **overrides)
    assert message in str(err.value)


def test_text_cost_on_subwords_needs_post_processing():
    """A sentencepiece- or BPE-coded target dictionary with a text cost and no post-processing is refused at
    build time, naming the flag to add; each way out is accepted."""
    spm = Dictionary()
    for s in ("\u2581the", "\u2581c", "at"):
        spm.add_symbol(s)
    with pytest.raises(ValueError, match="--risk-post-process sentencepiece"):
        _criterion(spm, risk_cost="bleu")
    with pytest.raises(ValueError, match="--risk-post-process sentencepiece"):
        _criterion(spm, risk_cost="chrf")
    assert _criterion(spm, risk_cost="bleu", risk_post_process="sentencepiece").post_process == "sentencepiece"
    assert _criterion(spm, risk_cost="bleu", risk_post_process="none").post_process is None
    assert _criterion(spm, risk_cost="edit").post_process is None  # token ids need no text
    bpe = Dictionary()
    for s in ("the", "c@@", "at"):
        bpe.add_symbol(s)
    with pytest.raises(ValueError, match="--risk-post-process subword_nmt"):
        _criterion(bpe, risk_cost="bleu")
    # the translation task's --eval-bleu-remove-bpe counts as configured
    task = SimpleNamespace(
        source_dictionary=bpe, target_dictionary=bpe, cfg=SimpleNamespace(eval_bleu_remove_bpe="@@ ")
    )
    crit = SequenceRiskCriterion(task, sentence_avg=False, risk_cost="bleu")
    assert crit.post_process == "@@ "
    assert _criterion(make_dictionary(), risk_cost="bleu").post_process is None  # word-level: nothing to join


# ---- fairseq-train ---------------------------------------------------------------------------------------------

RISK_FLAGS = [
    "--criterion", "sequence_risk",
    "--risk-candidates", "3",
    "--risk-alpha", "0.3",
    "--risk-include-reference",
    "--lr", "0.05",
    "--max-tokens", "200",
]  # fmt: skip
_RECORD = re.compile(r"\| (train_inner|train|valid) \| (\{.*\})\s*$", re.MULTILINE)


def _records(log: str, kind: str):
    """The JSON records of ``--log-format json``: 'train_inner' (one per update), 'train' or 'valid' (per epoch)."""
    return [json.loads(m.group(2)) for m in _RECORD.finditer(log) if m.group(1) == kind]


@pytest.fixture(scope="module")
def token_level(tmp_path_factory):
    """A token-level checkpoint of the CLI's small model: 1 epoch of label-smoothed training on 300 pairs."""
    folder = tmp_path_factory.mktemp("risk_cli")
    make_splits(folder, {"train": 300, "valid": 10})
    preprocess(folder, "bin", trainpref="train", validpref="valid")
    train(folder, "bin", "token", "--max-epoch", "1")
    return folder


# the fine-tuning flags both runs below share (cli_helpers.train adds the model and --cpu)
FINETUNE = [
    *RISK_FLAGS,
    "--finetune-from-model", "token/checkpoint_last.pt",
    "--max-update", "2",
    "--log-format", "json",
    "--log-interval", "1",
]  # fmt: skip


@pytest.fixture(scope="module")
def finetuned(token_level):
    """``fairseq-train --criterion sequence_risk --finetune-from-model token/checkpoint_last.pt --update-freq 2``
    for 2 updates, validating at the end of the run."""
    proc = train(token_level, "bin", "one", *FINETUNE, "--update-freq", "2")
    return SimpleNamespace(folder=token_level, log=proc.stdout + proc.stderr, proc=proc)


def test_fairseq_train_fine_tunes_with_sequence_risk(finetuned):
    """fairseq-train fine-tunes a token-level checkpoint with the criterion: it logs the combined loss, the token
    loss, the expected cost (risk) and the top candidate's cost for every update and for validation, and saves."""
    log = finetuned.log
    assert "SequenceRiskCriterion" in log, tail(finetuned.proc)
    assert "loading pretrained model from token/checkpoint_last.pt" in log, tail(finetuned.proc)
    updates, valid = _records(log, "train_inner"), _records(log, "valid")
    assert [r["num_updates"] for r in updates] == ["1", "2"], tail(finetuned.proc)
    assert len(valid) == 1, tail(finetuned.proc)
    for record in [*updates, *valid]:
        prefix = "valid_" if record in valid else ""
        value = {key: float(record[prefix + key]) for key in ("loss", "token_loss", "risk", "top_cost", "bsz", "wpb")}
        assert 0.0 <= value["risk"] <= 1.0 and 0.0 <= value["top_cost"] <= 1.0, record
        # loss = (alpha * token loss sum + (1 - alpha) * risk sum) / target tokens, in fairseq's base 2
        per_token_risk = value["risk"] * value["bsz"] / value["wpb"] / math.log(2)
        assert value["loss"] == pytest.approx(0.3 * value["token_loss"] + 0.7 * per_token_risk, abs=5e-3), record
    assert (finetuned.folder / "one" / "checkpoint_last.pt").is_file()


def test_bad_alpha_fails_at_start_up(token_level):
    """--risk-alpha 1.5 stops fairseq-train before any update, with the flag named, and writes no checkpoint."""
    args = [
        "bin", "--user-dir", PLUGIN_DIR, "--arch", "convs2s_iwslt_de_en", "--encoder-layers", "[(16, 3)]",
        "--decoder-layers", "[(16, 3)]", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--criterion", "sequence_risk", "--risk-alpha", "1.5", "--optimizer", "nag", "--lr", "0.1",
        "--max-tokens", "400", "--save-dir", "bad", "--cpu",
    ]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "fairseq_cli.train", *map(str, args)],
        cwd=token_level,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0, tail(proc)
    assert "--risk-alpha must lie in [0, 1]" in proc.stderr, tail(proc)
    assert "begin training epoch" not in proc.stdout + proc.stderr
    assert not (token_level / "bad" / "checkpoint_last.pt").exists()


def test_two_processes_equal_one_process_with_update_freq_two(finetuned):
    """Two fairseq-train processes (gloo, legacy_ddp, one per rank), each generating candidates for its own
    sentences, make the same updates as one process with --update-freq 2 (which sees the same two batches per
    update): the same logged loss, risk and sample size, and the same parameters afterwards. So the per-worker
    sample_size adds up to the right normalization of the gradient."""
    folder = finetuned.folder
    common = [
        "bin", "--user-dir", PLUGIN_DIR, *MODEL_FLAGS, *OPTIM_FLAGS, *FINETUNE, *NO_PREFETCH, "--cpu",
        "--no-epoch-checkpoints",
    ]  # fmt: skip
    distributed = [
        # each rank reads the checkpoint itself: fairseq otherwise broadcasts it from rank 0 through torch.load,
        # whose weights_only default (torch >= 2.6) refuses the DictConfig inside
        "--load-checkpoint-on-all-dp-ranks",
        "--ddp-backend", "legacy_ddp", "--distributed-backend", "gloo",
        "--distributed-init-method", f"tcp://127.0.0.1:{free_port()}", "--distributed-world-size", "2",
        "--distributed-no-spawn", "--save-dir", "two", "--disable-validation",
    ]  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "fairseq_cli.train", *map(str, common + distributed), "--distributed-rank", str(r)],
            cwd=folder,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in (0, 1)
    ]
    outputs = []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=300)[0])
        finally:
            if p.poll() is None:
                p.kill()
    logs = "".join(
        f"\n--- rank {r} (rc={p.returncode}) ---\n{out[-2500:]}" for r, (p, out) in enumerate(zip(procs, outputs))
    )
    assert all(p.returncode == 0 for p in procs), logs
    assert "distributed init (rank 0)" in outputs[0] and "distributed init (rank 1)" in outputs[1], logs

    two_records, one_records = _records(outputs[0], "train_inner"), _records(finetuned.log, "train_inner")
    assert [r["num_updates"] for r in two_records] == ["1", "2"], logs
    assert [r["num_updates"] for r in one_records] == ["1", "2"], finetuned.log[-3000:]
    for a, b in zip(two_records, one_records):
        for key in ("bsz", "wpb"):
            assert a[key] == b[key], (key, a, b)
        # logged to 3 decimals: values 1e-7 apart (another order of adding) can round one unit apart
        for key in ("loss", "token_loss", "risk", "top_cost"):
            assert float(a[key]) == pytest.approx(float(b[key]), abs=1.001e-3), (key, a, b)
    two, one = load_checkpoint(folder / "two/checkpoint_last.pt"), load_checkpoint(folder / "one/checkpoint_last.pt")
    moved = max_param_difference(two, load_checkpoint(folder / "token/checkpoint_last.pt"))
    differ = max_param_difference(two, one)
    print(
        f"[figure] sequence_risk, 2 gloo ranks vs --update-freq 2: max |param difference| {differ:.1e}, "
        f"moved {moved:.1e}"
    )
    assert moved > 1e-4 and differ < 1e-6, (moved, differ)
