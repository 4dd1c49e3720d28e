"""fairseq's batching leaves sentences out without a word; with the plugin imported
(``fairseq_convs2s.compat.batching``) batches for inference keep them, and training batches stay as fairseq makes
them, with a warning."""

import gc
import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fairseq.data import LanguagePairDataset, data_utils, indexed_dataset
from fairseq.tasks import FairseqTask
from fairseq.trainer import Trainer
from utils import make_dictionary

import fairseq_convs2s  # noqa: F401  (wraps data_utils.batch_by_size and indexed_dataset.make_dataset)

WARNING = "fairseq left the last 4 of 52 sentences out of the batches"


def make_dataset(count=52):
    """``count`` sentence pairs of lengths 3 to 9."""
    dictionary = make_dictionary(25)
    rng = np.random.default_rng(0)
    sentences = [torch.tensor(rng.integers(4, 25, size=3 + i % 7).tolist() + [dictionary.eos()]) for i in range(count)]
    sizes = np.array([len(s) for s in sentences])
    return LanguagePairDataset(sentences, sizes, dictionary, sentences, sizes, dictionary)


@pytest.fixture
def dataset():
    """52 sentence pairs of lengths 3 to 9: batches of 16 make 16, 16, 16 and 4."""
    return make_dataset()


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


def _trainer(task):
    """What ``Trainer.get_train_iterator`` and ``get_valid_iterator`` read of a trainer: batches of up to 16
    sentences, fairseq's default --required-batch-size-multiple (8), one process."""
    dataset_cfg = SimpleNamespace(
        train_subset="train", max_tokens=None, batch_size=16, max_tokens_valid=None, batch_size_valid=16,
        required_batch_size_multiple=8, update_ordered_indices_seed=False, num_workers=0, data_buffer_size=0,
        grouped_shuffling=False, update_epoch_batch_itr=False, skip_invalid_size_inputs_valid_test=False,
    )  # fmt: skip
    cfg = SimpleNamespace(dataset=dataset_cfg, common=SimpleNamespace(seed=1), optimization=SimpleNamespace(
        skip_remainder_batch=False))  # fmt: skip
    model = SimpleNamespace(max_positions=lambda: None)
    return SimpleNamespace(task=task, cfg=cfg, model=model, tpu=False, data_parallel_world_size=1,
                           data_parallel_rank=0, reset_dummy_batch=lambda batch: None)  # fmt: skip


@pytest.mark.parametrize("count", [52, 61])
def test_inference_batches_keep_every_sentence_training_batches_stay_fairseqs(count, caplog):
    """The same odd-sized split (52 or 61 sentences, batches of 16, multiple 8) batched as fairseq-train's trainer
    batches its training set (``Trainer.get_train_iterator``), its validation (``get_valid_iterator``: the loss
    and --eval-bleu) and as fairseq-generate / fairseq-validate / fairseq-interactive do
    (``FairseqTask.get_batch_iterator``): training gets exactly fairseq's batches, with the warning; every other
    path gets them too, followed by one smaller batch of the sentences fairseq left out, and no warning."""
    task = FairseqTask(None)
    task.datasets.update(train=make_dataset(count), valid=make_dataset(count), test=make_dataset(count))
    trainer = _trainer(task)
    with data_utils.numpy_seed(1 + 1):  # the order fairseq shuffles sentences of a length in (seed + epoch)
        indices = task.datasets["train"].ordered_indices()
    stock = data_utils.batch_by_size.__wrapped__(indices, None, task.datasets["train"].num_tokens_vec(indices), None,
                                                 16, 8)  # fmt: skip
    kept = sum(len(b) for b in stock)
    assert kept < count  # fairseq leaves some out

    with caplog.at_level(logging.WARNING):
        training = Trainer.get_train_iterator(trainer, epoch=1, load_dataset=False).frozen_batches
    assert [b.tolist() for b in training] == [b.tolist() for b in stock]
    assert f"fairseq left the last {count - kept} of {count} sentences out of the batches" in caplog.text
    caplog.clear()

    with caplog.at_level(logging.WARNING):
        valid = Trainer.get_valid_iterator(trainer, "valid").frozen_batches
        test = task.get_batch_iterator(task.datasets["test"], max_sentences=16, required_batch_size_multiple=8)
    for batches in (valid, test.frozen_batches):
        assert [b.tolist() for b in batches[: len(stock)]] == [b.tolist() for b in stock]
        assert len(batches) == len(stock) + 1 and len(batches[-1]) == count - kept
        assert sorted(i for b in batches for i in b.tolist()) == list(range(count))
    assert "left the last" not in caplog.text
    # an iterator over them yields every sentence once
    ids = [i for sample in test.next_epoch_itr(shuffle=False) for i in sample["id"].tolist()]
    assert sorted(ids) == list(range(count))


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
