"""One way for the plugin to put a wrapper in place of a fairseq function (``checkpoint_compat``,
``search_compat``, ``batching_compat``): once per process, however often the plugin is imported, with the
original's name and docstring, and the original reachable as ``__wrapped__`` (the tests call it to show what
fairseq does alone)."""

import functools
from typing import Callable

_MARK = "_convs2s_wrapper"


def is_wrapped(function: Callable) -> bool:
    """Whether ``function`` is already one of the plugin's wrappers."""
    return getattr(function, _MARK, False)


def install(owner, name: str, wrapper: Callable) -> None:
    """Put ``wrapper`` in place of ``owner.<name>`` (a module's function or a class's method), marked as the
    plugin's (:func:`is_wrapped`)."""
    functools.update_wrapper(wrapper, getattr(owner, name))
    setattr(wrapper, _MARK, True)
    setattr(owner, name, wrapper)
