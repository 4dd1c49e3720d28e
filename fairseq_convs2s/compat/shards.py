"""A run resumed mid-epoch with another number of ranks: installed, as ``training.py``'s fixes are, by ``python -m
fairseq_convs2s.train`` in every training process.

fairseq gives rank r of N the batches r, r + N, r + 2N, ... of an epoch, and saves the position in the epoch as the
number of batches each rank has taken (``iterations_in_epoch``), not the number taken by all. Resumed with another
number of ranks, that count means other batches: from 2 ranks to 1 (``--update-freq 2`` in their place) the run
trained half the batches it had already seen again; from 1 to 2 each rank skipped past the end of its share and
stopped in ``RuntimeError: Cannot resume training due to dataloader mismatch``. The position is saved with the
number of ranks that took it, and turned into the new ranks' count on load: the same batches come next.
"""

import logging

from fairseq_convs2s_autoload import is_replaced, replace

logger = logging.getLogger("fairseq_convs2s.train")

SHARDS = "convs2s_num_shards"  # (the key added to fairseq's iterator state)


def resume_with_other_rank_counts() -> None:
    """Wrap ``EpochBatchIterator.state_dict`` to record the number of ranks (shards) and ``load_state_dict`` to
    turn a position taken by another number into this one's (idempotent)."""
    from fairseq.data.iterators import EpochBatchIterator

    if is_replaced(EpochBatchIterator.load_state_dict, "resume_other_world_size"):
        return
    state_dict, load_state_dict = EpochBatchIterator.state_dict, EpochBatchIterator.load_state_dict

    def state_dict_with_shards(self):
        return {**state_dict(self), SHARDS: self.num_shards}

    def load_state_dict_of_any_shards(self, state):
        saved, position = state.get(SHARDS, self.num_shards), state.get("iterations_in_epoch", 0)
        if saved != self.num_shards and position > 0:
            taken = position * saved  # the epoch's batches taken by all ranks (fewer than its batches: mid-epoch)
            state = {**state, "iterations_in_epoch": taken // self.num_shards}
            again = taken % self.num_shards
            logger.info(
                "resuming epoch %d after %d of its batches, taken by %d ranks, with %d ranks%s",
                state["epoch"],
                taken,
                saved,
                self.num_shards,
                f": the last {again} of them are trained again" if again else "",
            )
        return load_state_dict(self, state)

    replace(EpochBatchIterator, "state_dict", state_dict_with_shards, "resume_other_world_size")
    replace(EpochBatchIterator, "load_state_dict", load_state_dict_of_any_shards, "resume_other_world_size")
