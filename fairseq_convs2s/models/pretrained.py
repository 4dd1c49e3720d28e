"""``ConvS2SModel.from_pretrained``: fairseq's hub interface, with fconv checkpoints converted on first load.

fairseq's own ``from_pretrained`` (``fairseq.hub_utils``) resolves a ``hub_models`` name to its archive URL,
downloads and unpacks it into its cache, and loads ``model.pt`` with whatever model the checkpoint names. The
published ConvS2S models are fconv checkpoints, so here each checkpoint file is looked at first: an fconv one is
converted (``fconv_checkpoint``) to ``<name>.convs2s.pt`` beside it, written atomically, and that file is loaded; the
next load finds the converted file and does not read the original again. A convs2s checkpoint loads as it is.
"""

import glob
import hashlib
import logging
import os
import shutil
import tarfile
import tempfile
from typing import Dict, Tuple

import torch
from fairseq import file_utils, hub_utils
from fairseq.models import ARCH_MODEL_REGISTRY
from omegaconf import open_dict

from .fconv_checkpoint import (
    FCONV_ARCHS,
    ConversionError,
    checkpoint_arch,
    convert_checkpoint,
    read_checkpoint,
    save_atomically,
)

logger = logging.getLogger(__name__)

CONVERTED_SUFFIX = ".convs2s.pt"


def converted_path(checkpoint_path: str) -> str:
    """Where the conversion of an fconv checkpoint is kept: ``model.pt`` -> ``model.convs2s.pt``."""
    root, _ = os.path.splitext(checkpoint_path)
    return root + CONVERTED_SUFFIX


SOURCE_STAMP = "convs2s_converted_from"  # (size, mtime_ns) of the fconv file a conversion was made from


def _stamp(path: str) -> list:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns]


def _converted_from_this(target: str, path: str) -> bool:
    """Whether the conversion at ``target`` is of the file now at ``path`` (or ``path`` is gone). A file replaced by
    another with an older timestamp (``cp -p``, ``rsync -a``, ``tar x``) is not taken for the one converted."""
    if not os.path.exists(path):
        return True
    try:
        stamp = read_checkpoint(target, mmap=True).get(SOURCE_STAMP)
    except ConversionError:
        return False  # (a broken conversion: made anew)
    if stamp is None:  # converted before the stamp was recorded: the timestamps alone
        return os.path.getmtime(target) >= os.path.getmtime(path)
    return list(stamp) == _stamp(path)


def prepare_checkpoint(path: str, model_class) -> str:
    """The file to load for the checkpoint at ``path``: ``path`` itself if it is a convs2s checkpoint; for an fconv
    one its conversion, written now unless one made from the file now at ``path`` is already there (by the size and
    modification time it records; older conversions by their timestamps), or ``path`` is gone. Anything else raises
    a ``ValueError`` (a ``ConversionError``) that says what the file is."""
    target = converted_path(path)
    if os.path.exists(target) and _converted_from_this(target, path):
        logger.info(f"loading {target}, converted earlier from the fconv checkpoint {path}")
        return target
    checkpoint = read_checkpoint(path, mmap=True)  # cheap: only cfg is looked at unless it needs converting
    arch = checkpoint_arch(checkpoint)
    if arch in FCONV_ARCHS:
        logger.info(f"{path} is an fconv checkpoint ({arch}): converting it once to {target}")
        converted = convert_checkpoint(checkpoint, model_class)
        converted[SOURCE_STAMP] = _stamp(path)
        try:
            save_atomically(converted, target)
        except OSError as e:
            raise ConversionError(
                f"cannot write the converted checkpoint {target} ({e}); convert it where you can write with "
                f"`python -m fairseq_convs2s.convert_fconv {path} OUT.pt` and load OUT.pt"
            ) from None
        return target
    if ARCH_MODEL_REGISTRY.get(arch) is not model_class:
        raise ConversionError(f"{path}: a checkpoint of arch {arch!r}, neither convs2s nor fconv")
    return path


def _resolve_name(archive_map: Dict, name_or_path: str, kwargs: Dict) -> Tuple[str, str]:
    """A ``hub_models`` name -> its archive URL, with its tokenizer/bpe settings put into ``kwargs`` unless given
    (as ``hub_utils.from_pretrained`` does); a path or URL stays as it is. Returns (path, checkpoint_file or '')."""
    entry = archive_map.get(name_or_path, name_or_path)
    if not isinstance(entry, dict):
        return entry, ""
    for key, value in entry.items():
        if key not in ("path", "checkpoint_file"):
            kwargs.setdefault(key, value)
    return entry["path"], entry.get("checkpoint_file", "")


ARCHIVE_SUFFIXES = (".gz", ".bz2", ".xz")  # what fairseq's load_archive_file unpacks: tarfile.open(f, "r:<suffix>")


def _is_archive(path: str) -> bool:
    """A local file that fairseq's ``file_utils.load_archive_file`` unpacks (it opens a file with the compression its
    suffix names, so a checkpoint or a text file stopped in ``tarfile.CompressionError: unknown compression type``)."""
    return path.endswith(ARCHIVE_SUFFIXES) and tarfile.is_tarfile(path)


def _check_model_path(path: str) -> None:
    """Refuse a local file that is not an archive, a checkpoint most likely: fairseq wants its folder."""
    if os.path.isfile(path) and not _is_archive(path):
        folder, name = os.path.split(path)
        raise ValueError(
            f"{path} is a file, not a model directory nor a .tar.gz/.bz2/.xz archive: pass its folder and the "
            f"checkpoint's name, from_pretrained({folder or '.'!r}, checkpoint_file={name!r})"
        )


def _unpacked(path: str) -> str:
    """The folder a local archive unpacks to, in fairseq's cache (one per archive file and version: its path, size and
    modification time), unpacked now unless it already is; the archive stays as it is. (fairseq's load_archive_file
    deletes a local archive and moves the unpacked folder to its name; with members named './...' it then stops in
    ``OSError: [Errno 22]``, or a ``FileNotFoundError`` when the names share a prefix, the archive already gone.)
    The folder is the archive's one top folder, if it has one, else the unpacked files'."""
    st = os.stat(path)
    key = hashlib.sha256(f"{os.path.abspath(path)}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    cache = os.path.join(str(file_utils.PYTORCH_FAIRSEQ_CACHE), "local_archives")
    target = os.path.join(cache, f"{os.path.basename(path)}.{key}")
    if not os.path.isdir(target):
        os.makedirs(cache, exist_ok=True)
        partial = tempfile.mkdtemp(dir=cache, prefix=".unpacking.")
        try:
            with tarfile.open(path) as archive:
                safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # (Pythons since 2023)
                archive.extractall(partial, **safe)  # (no member written outside the folder)
            os.replace(partial, target)
        except OSError:
            if not os.path.isdir(target):  # (another process unpacked it first: use that)
                raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    entries = os.listdir(target)
    only = os.path.join(target, entries[0]) if len(entries) == 1 else None
    return only if only and os.path.isdir(only) else target


def _local_archive(path: str) -> str:
    """``path`` unpacked (``_unpacked``) when it is a local archive file, else as it is."""
    return _unpacked(path) if "://" not in path and os.path.isfile(path) and _is_archive(path) else path


def _data_path(model_dir: str, data_name_or_path: str) -> str:
    """Where fairseq's hub reads ``data_name_or_path``: relative to the model directory when it starts with '.' (an
    archive is not unpacked there), else as it is."""
    return os.path.join(model_dir, data_name_or_path) if data_name_or_path.startswith(".") else data_name_or_path


def _check_dictionaries(model_dir: str, data_name_or_path: str) -> None:
    """Where fairseq will look for the dictionaries (``_data_path``), refuse a local folder without any
    ``dict.*.txt``: fairseq stops there with a bare ``Exception: Could not infer language pair`` (or, languages
    given, a missing file); and a file there that fairseq would not unpack (a dictionary given for its folder): a
    ``tarfile.CompressionError``."""
    data = _data_path(model_dir, data_name_or_path)
    if "://" in data or (os.path.isfile(data) and not data_name_or_path.startswith(".") and _is_archive(data)):
        return  # an archive, by URL or a local file: fairseq downloads and unpacks it
    if os.path.isfile(data):
        raise ValueError(
            f"data_name_or_path: {os.path.abspath(data)} is a file, not a folder nor a .tar.gz/.bz2/.xz archive: "
            f"pass the fairseq-preprocess folder holding the dict.<lang>.txt files"
        )
    if os.path.isdir(data) and glob.glob(os.path.join(glob.escape(data), "dict.*.txt")):
        return
    raise FileNotFoundError(
        f"no fairseq dictionaries (dict.<lang>.txt) in {os.path.abspath(data)}: pass data_name_or_path, the "
        f"fairseq-preprocess folder the model was trained on (absolute, or relative to {model_dir} with a leading '.')"
    )


def _languages_error(model_dir: str, data_name_or_path: str) -> ValueError:
    """What fairseq's bare ``Exception: Could not infer language pair`` means: a data folder with dictionaries but no
    binarized data (whose file names carry the pair), for a checkpoint that does not name its languages."""
    data = _data_path(model_dir, data_name_or_path)
    names = sorted(os.path.basename(f) for f in glob.glob(os.path.join(glob.escape(data), "dict.*.txt")))
    return ValueError(
        f"the checkpoint does not name its languages and {os.path.abspath(data)} holds no binarized data to tell "
        f"them ({', '.join(names) or 'no dict.<lang>.txt'}): pass source_lang= and target_lang="
    )


def from_pretrained(model_class, model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".", **kwargs):
    """fairseq's ``GeneratorHubInterface`` for ``model_name_or_path`` (a ``hub_models`` name, an archive URL or a
    local directory), converting fconv checkpoints on first load; the arguments are ``from_pretrained``'s."""
    archive_map = model_class.hub_models()
    path, archive_checkpoint = _resolve_name(archive_map, model_name_or_path, kwargs)
    checkpoint_file = archive_checkpoint or checkpoint_file
    if isinstance(archive_map.get(data_name_or_path), dict):
        data_name_or_path = archive_map[data_name_or_path]["path"]

    _check_model_path(path)
    path = _local_archive(path)
    if not data_name_or_path.startswith("."):
        data_name_or_path = _local_archive(data_name_or_path)
    try:
        model_dir = file_utils.load_archive_file(path)  # downloads and unpacks a URL once; a local dir stays as is
    except ImportError as e:  # fairseq imports its download client (requests, or boto3 for s3) only when needed
        raise ImportError(f"downloading {path} needs the {e.name} package: pip install {e.name}") from e
    if (model_dir is None or not os.path.isdir(model_dir)) and "://" in path:
        raise FileNotFoundError(f"could not download or unpack {path} (fairseq's log above says why)")
    if model_dir is None or not os.path.isdir(model_dir):
        raise FileNotFoundError(
            f"{model_name_or_path!r} is neither a model directory nor a known name ({', '.join(sorted(archive_map))})"
        )
    files = [
        prepare_checkpoint(os.path.join(model_dir, name), model_class) for name in checkpoint_file.split(os.pathsep)
    ]
    checkpoint_file = os.pathsep.join(os.path.relpath(f, model_dir) for f in files)
    _check_dictionaries(model_dir, data_name_or_path)  # after the checkpoints: what is wrong with them comes first

    try:
        loaded = hub_utils.from_pretrained(model_dir, checkpoint_file, data_name_or_path, archive_map=None, **kwargs)
    except Exception as e:  # (fairseq's TranslationTask.setup_task raises a bare Exception)
        if str(e) != "Could not infer language pair, please provide it explicitly":
            raise
        raise _languages_error(model_dir, data_name_or_path) from None
    cfg = loaded["args"]
    with open_dict(cfg):  # the checkpoint's --bf16 says how the model trained, not how to decode it
        cfg.common.bf16 = False
    hub = hub_utils.GeneratorHubInterface(cfg, loaded["task"], loaded["models"])
    if kwargs.get("bf16", False):  # asked here: as ConvS2SModel.prepare_for_inference_ with --bf16, weight norm
        for model in hub.models:  # folded in fp32 (above), then every weight rounded once
            model.to(torch.bfloat16)
        with open_dict(cfg):
            cfg.common.bf16 = True
    return hub
