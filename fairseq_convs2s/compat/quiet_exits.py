"""End ``fairseq-interactive`` and ``fairseq-generate`` in one line on Ctrl-C, and quietly when their reader goes
away (``| head``), instead of fairseq 0.12's ``KeyboardInterrupt`` and ``BrokenPipeError`` tracebacks.

Installed when the plugin is loaded by one of these tools (``--user-dir``), whose module is then loaded: the fix
replaces that module's ``main``, which its ``cli_main`` calls once the flags (and so the plugin) are read. Ctrl-C
exits with status 130 and the line ``fairseq-interactive: interrupted``; a closed pipe exits with 141, as a tool
ended by SIGPIPE would, and prints nothing.
"""

import os
import sys
from typing import List

from fairseq_convs2s_autoload import is_replaced, replace

TOOLS = {"fairseq_cli.interactive": "fairseq-interactive", "fairseq_cli.generate": "fairseq-generate"}


def loaded_tool_modules(name: str, *attributes: str) -> List:
    """Module ``name`` (a ``fairseq_cli`` tool) as imported, and as ``__main__`` under ``python -m NAME``, where it
    is loaded and has ``attributes``."""
    found = []
    for key in (name, "__main__"):
        module = sys.modules.get(key)
        spec = getattr(module, "__spec__", None)
        if module is not None and (key == name or getattr(spec, "name", None) == name):
            if all(hasattr(module, attribute) for attribute in attributes):
                found.append(module)
    return found


def end_tools_quietly() -> None:
    """Replace ``main`` of the loaded ``fairseq-interactive`` or ``fairseq-generate`` module (idempotent; a no-op in
    a process that is not running one)."""
    for name, tool in TOOLS.items():
        for module in loaded_tool_modules(name, "main", "cli_main"):
            if not is_replaced(module.main, "quiet_exits"):
                replace(module, "main", _ending_quietly(module.main, tool), "quiet_exits")


def _ending_quietly(main, tool: str):
    def wrapper(cfg, **kwargs):
        try:
            return main(cfg, **kwargs)
        except KeyboardInterrupt:
            print(f"\n{tool}: interrupted", file=sys.stderr)
            raise SystemExit(130) from None
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (the exit's own flush has nowhere to go)
            raise SystemExit(141) from None

    return wrapper
