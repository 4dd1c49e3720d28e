"""fairseq's batching leaves sentences out without a word; with the plugin imported it says so
(``fairseq_convs2s.compat.batching``), and the batches stay as fairseq makes them."""

import gc
import logging

import numpy as np
import pytest
import torch
from fairseq.data import LanguagePairDataset, data_utils, indexed_dataset
from utils import make_dictionary

import fairseq_convs2s  # noqa: F401  (wraps data_utils.batch_by_size and indexed_dataset.make_dataset)

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
    with pytest.raises(
        ValueError,
        match=r"no sentences to batch: .* \(--max-source-positions, --max-target-positions, and --max-tokens",
    ):
        dataset.batch_by_size(none, max_sentences=16, required_batch_size_multiple=8)
    assert dataset.batch_by_size(none, max_sentences=16, required_batch_size_multiple=1) == []


def binarize(prefix, sentences):
    """A memory-mapped split as fairseq-preprocess writes it: ``prefix.bin`` and ``prefix.idx``."""
    builder = indexed_dataset.make_builder(indexed_dataset.data_file_path(prefix), "mmap", vocab_size=25)
    for sentence in sentences:
        builder.add_item(torch.tensor(sentence))
    builder.finalize(indexed_dataset.index_file_path(prefix))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # fairseq's half-built dataset
def test_an_empty_binarized_split_is_named_not_an_unnamed_mmap_error(tmp_path):
    """fairseq-preprocess given empty files writes a .bin of no bytes; fairseq's loader fails on it naming no
    file (numpy's mmap error, then a second traceback from ``__del__``). The plugin names the file first."""
    empty, one = str(tmp_path / "test.src-tgt.src"), str(tmp_path / "valid.src-tgt.src")
    binarize(empty, [])
    binarize(one, [[5, 6, 2]])
    assert (tmp_path / "test.src-tgt.src.bin").stat().st_size == 0
    with pytest.raises(ValueError, match="cannot mmap an empty file"):
        indexed_dataset.make_dataset.__wrapped__(empty, "mmap")
    gc.collect()
    with pytest.raises(ValueError, match=r"test\.src-tgt\.src\.bin is empty: the split has no sentences"):
        data_utils.load_indexed_dataset(empty, None, "mmap")
    loaded = data_utils.load_indexed_dataset(one, None, "mmap")  # a split with a sentence loads as before
    assert len(loaded) == 1 and loaded[0].tolist() == [5, 6, 2]
