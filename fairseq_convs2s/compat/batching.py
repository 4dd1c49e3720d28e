"""Every sentence batched at inference; say so when fairseq leaves training sentences out of a split's batches.

fairseq 0.12's ``data_utils.batch_by_size`` drops the last batch when its size is not a multiple of
``--required-batch-size-multiple`` (8 by default; fairseq issue 5036): ``fairseq-generate`` then translated and
scored, and ``fairseq-validate`` and validation during training (its loss and ``--eval-bleu``) averaged over, up to
7 sentences fewer than the split holds, without a word (a 61-sentence test set at ``--batch-size 16`` gave 56
hypotheses). With the plugin imported, batches built for inference keep that remainder as a last, smaller batch:
those built by ``FairseqTask.get_batch_iterator`` anywhere but inside ``Trainer.get_train_iterator`` (generate,
validate, the trainer's validation, interactive, the hub). Training batches stay exactly as fairseq makes them (the
same batches, so the same random stream); where fairseq leaves training sentences out, a warning gives the count and
the flag that keeps every sentence. Where no sentence is left to batch at all, fairseq fails with a bare
``IndexError: list index out of range``; the wrapper says why instead.

A sentence longer than ``--max-tokens`` cannot be batched: fairseq's training iterator caps the positions it
filters by at ``--max-tokens`` and skips such sentences with a warning, but its inference iterators do not, and
the batcher then stops with a bare ``AssertionError: Sentences lengths should not exceed max_tokens`` (generate,
validate, interactive, and validation in training), even with ``--skip-invalid-size-inputs-valid-test``. Batches
for inference are filtered the same way as training's: skipped, with fairseq's warning, under that flag, and
otherwise fairseq's error for a sentence too long, saying that ``--max-tokens`` is what caps it.

A split binarized from empty files (``fairseq-preprocess`` writes a ``.bin`` of no bytes) never gets that far:
fairseq's memory-mapped loader stops on it with numpy's ``ValueError: cannot mmap an empty file``, naming no file,
then a second traceback from the half-built dataset's ``__del__``. ``refuse_empty_splits`` names the file instead,
before the loader opens it.
"""

import contextlib
import contextvars
import inspect
import logging
import os

import numpy as np
import torch
from fairseq import utils
from fairseq.data import data_utils, indexed_dataset
from fairseq.tasks import FairseqTask

from fairseq_convs2s_autoload import is_replaced, replace

from ..errors import InputError

logger = logging.getLogger(__name__)

NO_SENTENCES = (
    "no sentences to batch: the split is empty, or fairseq left out every sentence as longer than the model's "
    "max positions (--max-source-positions, --max-target-positions, and --max-tokens, which caps both; in "
    "training and with --skip-invalid-size-inputs-valid-test it skips them, with a warning saying how many)"
)

# what the batches being built are for: "training" (inside Trainer.get_train_iterator), "inference" (any other call
# of FairseqTask.get_batch_iterator) or None (batch_by_size called on its own, or later: fairseq's rule)
_BATCHES_FOR: contextvars.ContextVar = contextvars.ContextVar("convs2s_batches_for", default=None)


@contextlib.contextmanager
def _batches_for(purpose: str):
    token = _BATCHES_FOR.set(purpose)
    try:
        yield
    finally:
        _BATCHES_FOR.reset(token)


def keep_every_sentence_at_inference() -> None:
    """Wrap ``data_utils.batch_by_size`` (:func:`warn_on_dropped_sentences`), ``FairseqTask.get_batch_iterator`` and
    ``Trainer.get_train_iterator`` so that batches built for inference keep the sentences fairseq would leave out,
    and training batches stay fairseq's (idempotent)."""
    from fairseq.trainer import Trainer

    warn_on_dropped_sentences()
    get_train_iterator = Trainer.get_train_iterator
    if not is_replaced(get_train_iterator, "dropped_sentences"):

        def get_train_iterator_for_training(self, *args, **kwargs):
            with _batches_for("training"):
                return get_train_iterator(self, *args, **kwargs)

        replace(Trainer, "get_train_iterator", get_train_iterator_for_training, "dropped_sentences")
    get_batch_iterator = FairseqTask.get_batch_iterator
    if not is_replaced(get_batch_iterator, "dropped_sentences"):
        signature = inspect.signature(get_batch_iterator)

        def get_batch_iterator_for_inference_unless_training(self, *args, **kwargs):
            purpose = _BATCHES_FOR.get() or "inference"
            call = signature.bind(self, *args, **kwargs)
            model_positions, max_tokens = call.arguments.get("max_positions"), call.arguments.get("max_tokens")
            capped = purpose == "inference" and max_tokens is not None and max_tokens > 0
            if capped:  # (as Trainer.get_train_iterator does: a batch holds at most max_tokens of a sentence)
                call.arguments["max_positions"] = utils.resolve_max_positions(model_positions, max_tokens)
            with _batches_for(purpose):
                try:
                    return get_batch_iterator(*call.args, **call.kwargs)
                except Exception as e:
                    if not (capped and type(e) is Exception and str(e).startswith("Size of sample #")):
                        raise
                    raise InputError(
                        f"{e}; max_positions is the model's {model_positions} capped by --max-tokens {max_tokens}: "
                        "a batch must hold the whole sentence, so raise --max-tokens (or batch with --batch-size "
                        "alone)"
                    ) from None

        replace(
            FairseqTask, "get_batch_iterator", get_batch_iterator_for_inference_unless_training, "dropped_sentences"
        )


def left_out(indices, batches) -> np.ndarray:
    """The ``indices`` (in their order) that no batch holds."""
    indices = np.asarray(indices if isinstance(indices, np.ndarray) else list(indices), dtype=np.int64)
    if not len(batches):
        return indices
    return indices[~np.isin(indices, np.concatenate([np.asarray(b, dtype=np.int64) for b in batches]))]


def warn_on_dropped_sentences() -> None:
    """Wrap ``data_utils.batch_by_size`` (what every fairseq dataset batches with): where the batches fairseq makes
    hold fewer sentences than the indices it was given, batches for inference get the rest as one more batch, other
    batches stay as they are with a warning (idempotent)."""
    batch_by_size = data_utils.batch_by_size
    if is_replaced(batch_by_size, "dropped_sentences"):
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
            raise InputError(NO_SENTENCES) from None
        dropped = len(indices) - sum(len(batch) for batch in batches)
        if dropped <= 0 or call.arguments.get("fixed_shapes") is not None:
            return batches
        if _BATCHES_FOR.get() == "inference":  # fairseq's last batch, which it made and then left out
            return [*batches, left_out(indices, batches)]
        if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_rank():
            return batches  # (every rank batches the same sentences: rank 0 says it, once)
        logger.warning(
            f"fairseq left the last {dropped} of {len(indices)} sentences out of the batches: the last batch "
            f"was not a multiple of --required-batch-size-multiple ({multiple}); pass "
            "--required-batch-size-multiple 1 to keep every sentence"
        )
        return batches

    replace(data_utils, "batch_by_size", batch_by_size_and_warn, "dropped_sentences")


def refuse_empty_splits() -> None:
    """Wrap ``indexed_dataset.make_dataset`` (what fairseq's tasks load a binarized split with) to raise a
    ``ValueError`` naming an empty memory-mapped ``.bin`` file, where fairseq fails on it unnamed (idempotent)."""
    make_dataset = indexed_dataset.make_dataset
    if is_replaced(make_dataset, "empty_splits"):
        return

    def make_dataset_or_refuse_empty(path, impl, *args, **kwargs):
        data_file = indexed_dataset.data_file_path(path)
        if impl == "mmap" and indexed_dataset.MMapIndexedDataset.exists(path) and os.path.getsize(data_file) == 0:
            raise InputError(
                f"{data_file} is empty: the split has no sentences (fairseq-preprocess was given empty files); "
                "binarize at least one sentence, or leave the split out (a valid split: fairseq-train "
                "--disable-validation)"
            )
        return make_dataset(path, impl, *args, **kwargs)

    replace(indexed_dataset, "make_dataset", make_dataset_or_refuse_empty, "empty_splits")
