"""fairseq's batching leaves sentences out without a word; with the plugin imported it says so
(``fairseq_convs2s.batching_compat``), and the batches stay as fairseq makes them."""

import logging

import numpy as np
import pytest
import torch
from fairseq.data import LanguagePairDataset, data_utils
from utils import make_dictionary

import fairseq_convs2s  # noqa: F401  (wraps data_utils.batch_by_size)

WARNING = "fairseq left the last 4 of 52 sentences out of the batches"


@pytest.fixture
def dataset():
    """52 sentence pairs of lengths 3 to 9: batches of 16 make 16, 16, 16 and 4."""
    dictionary = make_dictionary(25)
    rng = np.random.default_rng(0)
    sentences = [torch.tensor(rng.integers(4, 25, size=3 + i % 7).tolist() + [dictionary.eos()]) for i in range(52)]
    sizes = np.array([len(s) for s in sentences])
    return LanguagePairDataset(sentences, sizes, dictionary, sentences, sizes, dictionary)


def test_a_dropped_remainder_is_named_with_the_flag_that_keeps_it(dataset, caplog):
    indices = dataset.ordered_indices()
    with caplog.at_level(logging.WARNING):
        batches = dataset.batch_by_size(indices, max_sentences=16, required_batch_size_multiple=8)
    assert [len(b) for b in batches] == [16, 16, 16]  # as fairseq makes them: the last 4 left out
    unwrapped = data_utils.batch_by_size.__wrapped__(
        indices, dataset.num_tokens, dataset.num_tokens_vec(indices), None, 16, 8
    )
    assert [b.tolist() for b in batches] == [b.tolist() for b in unwrapped]
    assert WARNING in caplog.text and "--required-batch-size-multiple 1" in caplog.text


def test_no_warning_when_every_sentence_is_batched(dataset, caplog):
    indices = dataset.ordered_indices()
    with caplog.at_level(logging.WARNING):
        batches = dataset.batch_by_size(indices, max_sentences=16, required_batch_size_multiple=1)
        also = dataset.batch_by_size(indices[:48], max_sentences=16, required_batch_size_multiple=8)
    assert sum(len(b) for b in batches) == 52 and sum(len(b) for b in also) == 48
    assert "left the last" not in caplog.text


def test_no_sentence_left_to_batch_is_named_not_an_index_error(dataset):
    """Every sentence filtered out (here none given): fairseq's own code fails reading the last of no batches."""
    none = dataset.ordered_indices()[:0]
    with pytest.raises(IndexError):
        data_utils.batch_by_size.__wrapped__(none, dataset.num_tokens, None, None, 16, 8)
    with pytest.raises(ValueError, match=r"no sentences to batch: the split is empty, or .* \(--max-source-positions"):
        dataset.batch_by_size(none, max_sentences=16, required_batch_size_multiple=8)
    assert dataset.batch_by_size(none, max_sentences=16, required_batch_size_multiple=1) == []
