"""The exception the plugin raises for what a user gave it and it cannot use: a flag, a file, a sentence. It
imports nothing, so that every layer (compat included) can raise it."""


class InputError(ValueError):
    """A flag, file or sentence the plugin refuses; the message names it and says what to do instead.

    Under fairseq's command-line tools (fairseq-generate, -interactive, -validate, -train) the compat row
    ``quiet_exits`` prints the message alone, ``fairseq-generate: error: MESSAGE``, and exits with status 1, where
    fairseq would end in a traceback; anywhere else it is a ``ValueError`` like any other."""
