"""Answer every line of ``fairseq-interactive``, also one skipped for its length.

With ``--skip-invalid-size-inputs-valid-test``, fairseq 0.12's ``fairseq-interactive`` leaves a line longer than the
model's position table out of its batches (one warning per buffer, with a count) and prints nothing for it, so
its outputs no longer line up with its inputs. With the plugin loaded, each such line gets an ``S-`` line (the
source as read), a ``W-`` line naming the reason, and an empty hypothesis: ``H-`` and ``D-`` lines with the score
``-inf`` and no tokens, and an empty ``P-`` line. They come once the lines batched with it are decoded and before
those are printed: with ``--buffer-size 1`` (the default) exactly in input order, otherwise ahead of the other
lines of the same buffer, each with its own id.

Installed when the plugin is loaded by ``fairseq-interactive`` (``--user-dir``, or the start-up hook), whose module
is then loaded: the fix replaces that module's ``buffered_read`` (to know each buffer's first id) and
``make_batches`` (to see which ids came out of the batches).
"""

from fairseq_convs2s_autoload import is_replaced, replace

from .quiet_exits import loaded_tool_modules

MODULE = "fairseq_cli.interactive"
SKIP_FLAG = "--skip-invalid-size-inputs-valid-test"


class _Lines(list):
    """A buffer of input lines that knows the id of its first line."""

    start_id = 0


def _answer_skipped(lines, ids, cfg, task, max_positions, encode_fn) -> None:
    dictionary = task.source_dictionary
    tokens, lengths = task.get_interactive_tokens_and_lengths([lines[i] for i in ids], encode_fn)
    max_tokens = cfg.dataset.max_tokens
    for i, source, length in zip(ids, tokens, lengths):
        line_id = lines.start_id + i
        if dictionary is not None:
            print(f"S-{line_id}\t{dictionary.string(source, cfg.common_eval.post_process)}")
        too_long = max_tokens and length > max_tokens
        limit = f"--max-tokens {max_tokens}" if too_long else f"the model's max_positions={max_positions}"
        print(f"W-{line_id}\tskipped: {length} source tokens (with EOS) do not fit {limit} ({SKIP_FLAG})")
        print(f"H-{line_id}\t-inf\t")
        print(f"D-{line_id}\t-inf\t")
        print(f"P-{line_id}\t")


def answer_skipped_lines() -> None:
    """Replace ``buffered_read`` and ``make_batches`` of the loaded ``fairseq-interactive`` module (idempotent; a
    no-op in a process that is not running it)."""
    for module in loaded_tool_modules(MODULE, "make_batches", "buffered_read"):
        if is_replaced(module.make_batches, "interactive_skipped_lines"):
            continue
        buffered_read, make_batches = module.buffered_read, module.make_batches

        def buffered_read_counting(input, buffer_size, buffered_read=buffered_read):
            start_id = 0
            for buffer in buffered_read(input, buffer_size):
                lines = _Lines(buffer)
                lines.start_id = start_id
                start_id += len(lines)
                yield lines

        def make_batches_answering_skipped(lines, cfg, task, max_positions, encode_fn, make_batches=make_batches):
            seen = set()
            for batch in make_batches(lines, cfg, task, max_positions, encode_fn):
                seen.update(batch.ids.tolist())
                yield batch
            skipped = [i for i in range(len(lines)) if i not in seen]
            if skipped and cfg.dataset.skip_invalid_size_inputs_valid_test and isinstance(lines, _Lines):
                _answer_skipped(lines, skipped, cfg, task, max_positions, encode_fn)

        replace(module, "buffered_read", buffered_read_counting, "interactive_skipped_lines")
        replace(module, "make_batches", make_batches_answering_skipped, "interactive_skipped_lines")
