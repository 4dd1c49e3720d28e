"""Loads the fairseq-convs2s plugin when fairseq reads a convs2s checkpoint without it (a missing ``--user-dir``),
and holds the one way the plugin puts a wrapper in place of a fairseq function (:func:`replace`).

Installing fairseq-convs2s puts ``fairseq_convs2s_autoload.pth`` into site-packages; Python runs its one line at
start-up, which imports this module. At start-up it imports only small standard modules (``os``, ``sys``,
``contextvars``) and only watches for ``fairseq.checkpoint_utils`` being imported; then it wraps
``load_checkpoint_to_cpu``, the function through which fairseq-generate, fairseq-interactive, fairseq-validate,
``--restore-file`` and ``from_pretrained`` read a checkpoint. When the plugin has not been imported and the
checkpoint names a convs2s arch, it imports the plugin (registering the model, and letting torch >= 2.6 read the
``argparse.Namespace`` inside every fairseq checkpoint) and logs a warning that names the flag that was missing.
Without this, fairseq fails inside ``torch.load`` with "Unsupported global: GLOBAL argparse.Namespace", or on torch
< 2.6 with an unknown arch, and neither says what to add.

It also marks each call of ``load_model_ensemble_and_task`` (:data:`LOADING_CHECKPOINT`, :func:`mark_checkpoint_loads`):
the models built there only receive a checkpoint's weights, so they read no pre-trained embedding file. The plugin
(``fairseq_convs2s.compat.checkpoints``) installs the same wrapper when it is imported first, and reads the same
variable, so the fact has one name whichever came first.

The arch is found by reading the checkpoint's pickle opcodes (``pickletools``), which executes nothing.
``FAIRSEQ_CONVS2S_NO_AUTOLOAD=1`` switches the hook off.
"""

from __future__ import annotations

import contextvars
import os
import sys

# the archs fairseq_convs2s registers (tests/test_autoload.py keeps this list equal to the registry)
CONVS2S_ARCHS = frozenset(
    {
        "convs2s",
        "convs2s_iwslt_de_en",
        "convs2s_wmt_en_ro",
        "convs2s_wmt_en_de",
        "convs2s_wmt_en_fr",
        "convs2s_gigaword",
    }
)
WATCHED = "fairseq.checkpoint_utils"
PLUGIN = "fairseq_convs2s"

# True while models are built only to receive a checkpoint's weights: inside fairseq's load_model_ensemble_and_task
# (marked here, or by the plugin through the same wrapper) or the plugin's own ``building_to_load``
LOADING_CHECKPOINT: contextvars.ContextVar = contextvars.ContextVar("convs2s_loading_checkpoint", default=False)

_MARK = "_convs2s_fix"  # on a wrapper: the name of the fix it is (compat's table; "autoload" for the hook's own)


def is_replaced(function, fix: str) -> bool:
    """Whether ``function`` is the wrapper of ``fix`` (:func:`replace`), or wraps it (through ``__wrapped__``): each
    fix is installed once per process, and two fixes of one fairseq function are both installed, in either order."""
    while function is not None:
        if getattr(function, "__dict__", {}).get(_MARK) == fix:
            return True
        function = getattr(function, "__wrapped__", None)
    return False


def replace(owner, name: str, wrapper, fix: str) -> None:
    """Put ``wrapper`` in place of ``owner.<name>`` (a module's function or a class's method) with the original's
    name and docstring, the original reachable as ``__wrapped__`` (the tests call it to show what fairseq does
    alone), and marked as ``fix``'s (:func:`is_replaced`; ``tests/test_layout.py`` holds that ``fix`` names a row
    of compat's table)."""
    import functools

    functools.update_wrapper(wrapper, getattr(owner, name))
    setattr(wrapper, _MARK, fix)
    setattr(owner, name, wrapper)


def _logger():
    import logging

    return logging.getLogger("fairseq_convs2s.autoload")


def checkpoint_arch(path) -> str | None:
    """The convs2s arch (the preset) named in the checkpoint at ``path`` (a ``torch.save`` zip archive), or None:
    not such a checkpoint, not a readable zip, or not a local file. Reads the pickle's opcodes; runs none of them."""
    import pickletools
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            name = next(n for n in archive.namelist() if n == "data.pkl" or n.endswith("/data.pkl"))
            data = archive.read(name)
        found = _arch_values(pickletools.genops(data))
    except Exception:  # whatever the file is, fairseq's own loader reports on it
        return None
    # the model's name "convs2s" sits beside the preset's name (cfg.model._name and cfg.model.arch): name the preset
    return min(found, key=lambda arch: (arch == "convs2s", arch)) if found else None


def _arch_values(ops) -> set:
    """The convs2s arch names a pickle's opcodes give as the value of an ``arch`` or ``_name`` key (a dict's item or
    a Namespace's attribute; strings met again through the memo count too): another model's checkpoint that holds
    the word elsewhere (``--save-dir convs2s``) is not taken for a convs2s one."""
    memo, last, found = {}, None, set()
    for opcode, arg, _pos in ops:
        name = opcode.name
        if name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[arg] = last
            continue
        if name == "MEMOIZE":
            memo[len(memo)] = last
            continue
        if name in ("GET", "BINGET", "LONG_BINGET"):
            value = memo.get(arg)
        else:
            value = arg if isinstance(arg, str) and ("UNICODE" in name or "STRING" in name) else None
        if value in CONVS2S_ARCHS and last in ("arch", "_name"):
            found.add(value)
        last = value
    return found


def missing_user_dir_message(path, arch: str) -> str:
    plugin_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), PLUGIN)
    return (
        f"{path} is a fairseq-convs2s checkpoint (arch {arch}) but the plugin was not loaded: loading it now. "
        f"Add --user-dir {plugin_dir} to the command (in Python: import fairseq_convs2s) to load it yourself"
    )


def mark_checkpoint_loads(module) -> None:
    """Wrap ``module.load_model_ensemble_and_task`` (``fairseq.checkpoint_utils``) so that :data:`LOADING_CHECKPOINT`
    is True while it runs (idempotent: the hook and the plugin both call this), and so that a model of an ensemble
    that cannot be built or loaded (a ``ValueError``: the plugin's dictionary mismatch) is named: the message said
    "the checkpoint's dictionary" of ``--path a.pt:b.pt`` without saying which. On that error only, each file is
    loaded alone to find it."""
    load_ensemble = module.load_model_ensemble_and_task
    if is_replaced(load_ensemble, "build_to_load"):
        return

    def load_model_ensemble_and_task(filenames, *args, **kwargs):
        token = LOADING_CHECKPOINT.set(True)
        try:
            return load_ensemble(filenames, *args, **kwargs)
        except ValueError as error:
            if len(filenames) < 2:
                raise
            for k, filename in enumerate(filenames, 1):
                try:
                    load_ensemble([filename], *args, **kwargs)
                except ValueError as alone:
                    raise _renamed(
                        alone, f"{filename} (model {k} of the {len(filenames)} in --path): {alone}"
                    ) from error
            raise
        finally:
            LOADING_CHECKPOINT.reset(token)

    replace(module, "load_model_ensemble_and_task", load_model_ensemble_and_task, "build_to_load")


def _renamed(error: ValueError, message: str) -> ValueError:
    """``error``'s class with ``message`` (the plugin's InputError stays one, which its tools print as one line), or
    a ValueError where that class is not made from a message alone (UnicodeDecodeError)."""
    try:
        return type(error)(message)
    except TypeError:
        return ValueError(message)


def wrap_load_checkpoint(module) -> None:
    """Replace ``module.load_checkpoint_to_cpu`` (``fairseq.checkpoint_utils``) by one that imports the plugin
    first when a convs2s checkpoint is read without it, and mark the calls of ``load_model_ensemble_and_task``."""
    original = module.load_checkpoint_to_cpu
    if not is_replaced(original, "autoload"):

        def load_checkpoint_to_cpu(path, *args, **kwargs):
            if PLUGIN not in sys.modules:
                arch = checkpoint_arch(path)
                if arch is not None:
                    _logger().warning(missing_user_dir_message(path, arch))
                    __import__(PLUGIN)
            return original(path, *args, **kwargs)

        replace(module, "load_checkpoint_to_cpu", load_checkpoint_to_cpu, "autoload")
    mark_checkpoint_loads(module)


class _AfterImportFinder:
    """A ``sys.meta_path`` finder that finds nothing itself; for ``fairseq.checkpoint_utils`` it lets the other
    finders find the module and runs :func:`wrap_load_checkpoint` once the module has executed."""

    def find_spec(self, fullname, path, target=None):
        if fullname != WATCHED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_wrap(module):
            exec_module(module)
            try:
                wrap_load_checkpoint(module)
            except Exception:  # never break fairseq's import over a convenience
                _logger().debug("could not wrap %s.load_checkpoint_to_cpu", WATCHED, exc_info=True)

        loader.exec_module = exec_then_wrap
        return spec

    def invalidate_caches(self):
        pass


def install() -> None:
    """Called by the .pth at start-up; a no-op when switched off or already installed."""
    if os.environ.get("FAIRSEQ_CONVS2S_NO_AUTOLOAD"):
        return
    if any(isinstance(f, _AfterImportFinder) for f in sys.meta_path):
        return
    if WATCHED in sys.modules:  # imported before this ran (not at start-up): wrap it directly
        wrap_load_checkpoint(sys.modules[WATCHED])
        return
    sys.meta_path.insert(0, _AfterImportFinder())
