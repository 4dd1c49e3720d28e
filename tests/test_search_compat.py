"""fairseq's diverse beam search decodes any batch once the plugin is imported, and a beam or n-best of none is
refused before decoding (``fairseq_convs2s.compat.search``; the options the tools cannot print: test_cli.py)."""

import inspect
import re

import pytest
import torch
from fairseq import search
from fairseq.dataclass.configs import GenerationConfig
from fairseq.tasks import FairseqTask
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from utils import beam_search, build_model, make_dictionary, random_batch, seed_all

from fairseq_convs2s.compat.search import positions_in_batch

LENGTHS = [9, 5, 7, 3, 6, 8, 4, 9, 2, 7]
IDS = [412, 7, 1000, 93, 15, 600, 11, 250, 3, 58]  # dataset ids, most past the batch's size


def diverse_search(model, dictionary, src, ids, strength=2.0):
    """Beam 4 in 2 diversity groups over ``src``, whose sentences carry dataset ``ids``: per sentence, every
    hypothesis's tokens and score."""
    strategy = search.DiverseBeamSearch(dictionary, num_groups=2, diversity_strength=strength)
    hypos = beam_search([model], dictionary, src, ids, beam_size=4, search_strategy=strategy)
    return [[(tokens, score) for tokens, score, _ in beam] for beam in hypos]


@pytest.fixture(scope="module")
def setup():
    seed_all(0)
    dictionary = make_dictionary(25)
    model = build_model(dictionary=dictionary).eval()
    return model, dictionary, random_batch(dictionary, LENGTHS, seed=11)


def fairseqs_build_generator(task, *args):
    """fairseq's own ``FairseqTask.build_generator``, under the plugin's wrappers of it."""
    return inspect.unwrap(FairseqTask.build_generator)(task, *args)


def test_a_batch_of_any_ids_decodes_as_each_sentence_alone(setup):
    """Dataset ids past the batch's size (every fairseq-generate batch but the first) decode as each sentence
    alone; the diversity penalty is at work (other hypotheses than with strength 0)."""
    model, dictionary, src = setup
    batch = diverse_search(model, dictionary, src, IDS)
    alone = [diverse_search(model, dictionary, src[i : i + 1, -n:], [IDS[i]])[0] for i, n in enumerate(LENGTHS)]
    assert [[h[0] for h in beam] for beam in batch] == [[h[0] for h in beam] for beam in alone]
    for beam, alone_beam in zip(batch, alone):
        assert [h[1] for h in beam] == pytest.approx([h[1] for h in alone_beam], abs=1e-5)
    plain = diverse_search(model, dictionary, src, IDS, strength=0.0)
    changed = sum([h[0] for h in b] != [h[0] for h in p] for b, p in zip(batch, plain))
    assert changed >= len(LENGTHS) // 2, f"the groups' penalty changed the hypotheses of {changed} sentences"


def test_fairseqs_own_step_fails_on_such_a_batch(setup, monkeypatch):
    """What the fix is for: fairseq's step indexes the overlap rows by dataset id."""
    model, dictionary, src = setup
    monkeypatch.setattr(search.DiverseBeamSearch, "step", search.DiverseBeamSearch.step.__wrapped__)
    with pytest.raises(IndexError, match="out of bounds"):
        diverse_search(model, dictionary, src, IDS)


def test_positions_in_batch():
    ids_at_start = torch.tensor([412, 7, 1000, 93, 15])
    assert positions_in_batch(ids_at_start, ids_at_start).tolist() == [0, 1, 2, 3, 4]
    assert positions_in_batch(ids_at_start, torch.tensor([7, 93, 15])).tolist() == [1, 3, 4]


@pytest.mark.parametrize("flag, count", [("beam", 0), ("beam", -1), ("nbest", 0)])
def test_a_beam_or_nbest_of_none_is_refused_naming_the_flag(setup, flag, count):
    model, dictionary, src = setup
    task = TranslationTask(TranslationConfig(), dictionary, dictionary)
    with pytest.raises(ValueError, match=f"--{flag} must be at least 1, got {count}"):
        task.build_generator([model], GenerationConfig(**{flag: count}))
    assert task.build_generator([model], GenerationConfig(beam=2, nbest=2)).beam_size == 2


def test_an_nbest_above_the_beam_is_refused(setup):
    """fairseq keeps at most --beam hypotheses a sentence: --nbest 3 with --beam 2 printed two, saying nothing."""
    model, dictionary, src = setup
    task = TranslationTask(TranslationConfig(), dictionary, dictionary)
    with pytest.raises(ValueError, match="--nbest 3 asks for more hypotheses than --beam 2 keeps"):
        task.build_generator([model], GenerationConfig(beam=2, nbest=3))
    generator = fairseqs_build_generator(task, [model], GenerationConfig(beam=2, nbest=3))
    sample = {"net_input": {"src_tokens": src, "src_lengths": src.ne(dictionary.pad()).sum(1)}}
    with torch.no_grad():
        assert {len(hypotheses) for hypotheses in generator.generate([model], sample)} == {2}


def test_fairseqs_generator_fails_inside_decoding_with_a_beam_of_none(setup):
    """What the check is for: fairseq builds the generator and fails at the first step, inside the model."""
    model, dictionary, src = setup
    task = TranslationTask(TranslationConfig(), dictionary, dictionary)
    generator = fairseqs_build_generator(task, [model], GenerationConfig(beam=0))
    sample = {"net_input": {"src_tokens": src, "src_lengths": src.ne(dictionary.pad()).sum(1)}}
    with torch.no_grad(), pytest.raises(RuntimeError, match="0 elements"):
        generator.generate([model], sample)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"max_len_b": 0}, "--max-len-b 0 (with --max-len-a 0) leaves no room for a hypothesis of --min-len 1"),
        ({"max_len_b": 3, "min_len": 5}, "--max-len-b 3 (with --max-len-a 0) leaves no room for a hypothesis of "),
        ({"max_len_b": 5000, "min_len": 2000}, "the model's 1023 target positions (with --max-len-a 0) leaves no"),
    ],
)
def test_a_maximum_length_below_min_len_is_refused_naming_the_flags(setup, options, message):
    """fairseq's generator asserted at every batch (``min_len cannot be larger than max_len``), naming no flag;
    a maximum that grows with the source (``--max-len-a``) or is the source's (``--match-source-len``) is let be."""
    model, dictionary, src = setup
    task = TranslationTask(TranslationConfig(), dictionary, dictionary)
    with pytest.raises(ValueError, match=re.escape(message)):
        task.build_generator([model], GenerationConfig(**options))
    for allowed in ({"max_len_b": 0, "max_len_a": 1.0}, {"max_len_b": 0, "match_source_len": True}, {"min_len": 3}):
        task.build_generator([model], GenerationConfig(**allowed))
    generator = fairseqs_build_generator(task, [model], GenerationConfig(**options))
    sample = {"net_input": {"src_tokens": src, "src_lengths": src.ne(dictionary.pad()).sum(1)}}
    with torch.no_grad(), pytest.raises(AssertionError, match="min_len cannot be larger than max_len"):
        generator.generate([model], sample)
