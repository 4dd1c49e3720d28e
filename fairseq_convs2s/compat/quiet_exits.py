"""End fairseq's command-line tools in one line where fairseq 0.12 ends them in a traceback: the plugin's own
refusals (:class:`fairseq_convs2s.errors.InputError`: a broken checkpoint, a flag it cannot use) under
fairseq-generate, -interactive, -validate and -train; Ctrl-C, and a reader that goes away (``| head``), under
fairseq-interactive and fairseq-generate.

Installed when the plugin is loaded by one of these tools (``--user-dir``), whose module is then loaded: the fix
replaces that module's ``main``, which its ``cli_main`` calls once the flags (and so the plugin) are read. A refusal
prints ``fairseq-generate: error: MESSAGE`` and exits with status 1; Ctrl-C exits with 130 and the line
``fairseq-interactive: interrupted``; a closed pipe exits with 141, as a tool ended by SIGPIPE would, and prints
nothing. Errors that are not the plugin's refusals keep fairseq's traceback. The ranks that fairseq-train spawns
(``--distributed-world-size N``, one per GPU) run fairseq's own ``main``, and torch's spawn hands a failed rank's
traceback to the launching process as text: there the fix wraps ``distributed_utils.call_main``, and a rank's
refusal, read from that text, ends the launcher in the same one line.
"""

import os
import sys
from typing import List

from fairseq_convs2s_autoload import is_replaced, replace

from ..errors import InputError, refusal_in

# fairseq's tools whose main is replaced, and whether they also end quietly on Ctrl-C and a closed pipe (the decoding
# tools; training and validation keep fairseq's own ways to stop)
TOOLS = {
    "fairseq_cli.interactive": ("fairseq-interactive", True),
    "fairseq_cli.generate": ("fairseq-generate", True),
    "fairseq_cli.validate": ("fairseq-validate", False),
    "fairseq_cli.train": ("fairseq-train", False),
}


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
    """Replace ``main`` of the loaded tool module of :data:`TOOLS` (idempotent; a no-op in a process that is not
    running one)."""
    for name, (tool, decoding) in TOOLS.items():
        for module in loaded_tool_modules(name, "main", "cli_main"):
            if not is_replaced(module.main, "quiet_exits"):
                replace(module, "main", _ending_quietly(module.main, tool, decoding), "quiet_exits")
            if tool == "fairseq-train":
                from fairseq.distributed import utils as distributed_utils

                if not is_replaced(distributed_utils.call_main, "quiet_exits"):
                    replace(
                        distributed_utils,
                        "call_main",
                        _ranks_ending_quietly(distributed_utils.call_main, tool),
                        "quiet_exits",
                    )


def _ending_quietly(main, tool: str, decoding: bool):
    def wrapper(cfg, *args, **kwargs):
        try:
            return main(cfg, *args, **kwargs)
        except InputError as e:
            print(f"{tool}: error: {e}", file=sys.stderr)
            raise SystemExit(1) from None
        except KeyboardInterrupt:
            if not decoding:
                raise
            print(f"\n{tool}: interrupted", file=sys.stderr)
            raise SystemExit(130) from None
        except BrokenPipeError:
            if not decoding:
                raise
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (the exit's own flush has nowhere to go)
            raise SystemExit(141) from None

    return wrapper


def _ranks_ending_quietly(call_main, tool: str):
    def wrapper(cfg, main, **kwargs):
        import torch.multiprocessing

        try:
            return call_main(cfg, main, **kwargs)
        except torch.multiprocessing.ProcessRaisedException as e:  # a spawned rank's error, as its traceback's text
            refusal = refusal_in(str(e))
            if refusal is None:
                raise
            print(f"{tool}: error: {refusal}", file=sys.stderr)
            raise SystemExit(1) from None

    return wrapper
