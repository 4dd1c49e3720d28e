"""Say so when fairseq leaves sentences out of a split's batches.

fairseq 0.12's ``data_utils.batch_by_size`` drops the last batch when its size is not a multiple of
``--required-batch-size-multiple`` (8 by default; fairseq issue 5036): ``fairseq-generate`` then translates and
scores, and ``fairseq-validate`` and validation during training average over, up to 7 sentences fewer than the
split holds, without a word (the quickstart's 500 test sentences came back as 496). Changing the batches would
change every training run's batches and random stream, so they are left as fairseq makes them; importing the
plugin wraps the function to log a warning with the count and the flag that keeps every sentence. Where no
sentence is left to batch at all, fairseq fails with a bare ``IndexError: list index out of range``; the
wrapper says why instead.

A split binarized from empty files (``fairseq-preprocess`` writes a ``.bin`` of no bytes) never gets that far:
fairseq's memory-mapped loader stops on it with numpy's ``ValueError: cannot mmap an empty file``, naming no file,
then a second traceback from the half-built dataset's ``__del__``. ``refuse_empty_splits`` names the file instead,
before the loader opens it.
"""

import inspect
import logging
import os

from fairseq.data import data_utils, indexed_dataset

from fairseq_convs2s_autoload import is_replaced, replace

logger = logging.getLogger(__name__)

NO_SENTENCES = (
    "no sentences to batch: the split is empty, or fairseq left out every sentence as longer than the model's "
    "max positions (--max-source-positions, --max-target-positions, and --max-tokens, which caps both; in "
    "training and with --skip-invalid-size-inputs-valid-test it skips them, with a warning saying how many)"
)


def warn_on_dropped_sentences() -> None:
    """Wrap ``data_utils.batch_by_size`` (what every fairseq dataset batches with) to warn when the batches it
    returns hold fewer sentences than the indices it was given (idempotent)."""
    batch_by_size = data_utils.batch_by_size
    if is_replaced(batch_by_size):
        return

    signature = inspect.signature(batch_by_size)

    def batch_by_size_and_warn(*args, **kwargs):
        call = signature.bind(*args, **kwargs)
        call.apply_defaults()
        indices, multiple = call.arguments["indices"], call.arguments["required_batch_size_multiple"]
        try:
            batches = batch_by_size(*args, **kwargs)
        except IndexError:
            if len(indices):
                raise
            # fairseq reads the last batch of none (with a --required-batch-size-multiple above 1)
            raise ValueError(NO_SENTENCES) from None
        left_out = len(indices) - sum(len(batch) for batch in batches)
        if left_out > 0 and call.arguments.get("fixed_shapes") is None:
            logger.warning(
                f"fairseq left the last {left_out} of {len(indices)} sentences out of the batches: the last batch "
                f"was not a multiple of --required-batch-size-multiple ({multiple}); pass "
                "--required-batch-size-multiple 1 to keep every sentence"
            )
        return batches

    replace(data_utils, "batch_by_size", batch_by_size_and_warn)


def refuse_empty_splits() -> None:
    """Wrap ``indexed_dataset.make_dataset`` (what fairseq's tasks load a binarized split with) to raise a
    ``ValueError`` naming an empty memory-mapped ``.bin`` file, where fairseq fails on it unnamed (idempotent)."""
    make_dataset = indexed_dataset.make_dataset
    if is_replaced(make_dataset):
        return

    def make_dataset_or_refuse_empty(path, impl, *args, **kwargs):
        data_file = indexed_dataset.data_file_path(path)
        if impl == "mmap" and indexed_dataset.MMapIndexedDataset.exists(path) and os.path.getsize(data_file) == 0:
            raise ValueError(
                f"{data_file} is empty: the split has no sentences (fairseq-preprocess was given empty files); "
                "binarize at least one sentence, or leave the split out (a valid split: fairseq-train "
                "--disable-validation)"
            )
        return make_dataset(path, impl, *args, **kwargs)

    replace(indexed_dataset, "make_dataset", make_dataset_or_refuse_empty)
