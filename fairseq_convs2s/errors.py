"""The exception the plugin raises for what a user gave it and it cannot use: a flag, a file, a sentence. It
imports nothing, so that every layer (compat included) can raise it."""


class InputError(ValueError):
    """A flag, file or sentence the plugin refuses; the message names it and says what to do instead.

    Under fairseq's command-line tools (fairseq-generate, -interactive, -validate, -train) the compat row
    ``quiet_exits`` prints the message alone, ``fairseq-generate: error: MESSAGE``, and exits with status 1, where
    fairseq would end in a traceback; anywhere else it is a ``ValueError`` like any other."""


def refusal_in(trace: str):
    """The message of the :class:`InputError` (or a subclass) whose traceback text ``trace`` is, as another process
    reports it (torch's spawn hands a failed rank's traceback to its parent); None for any other error."""
    import sys

    head, found, message = trace.rstrip().rpartition("\n")[2].partition(": ")
    module, _, name = head.rpartition(".")
    error = getattr(sys.modules.get(module), name, None)
    return message if found and isinstance(error, type) and issubclass(error, InputError) else None
