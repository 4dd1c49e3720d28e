"""Export a checkpoint for the fairseq-free runtime (``convs2s_runtime``): a self-contained model folder.

    python -m fairseq_convs2s.export CHECKPOINT OUT_DIR [--data DATA_DIR] [--sentencepiece-model FILE]
        [--source-lang SRC --target-lang TGT]

OUT_DIR gets ``config.json`` (the model's sizes), ``model.pt`` (every weight with weight norm folded), the source and
target vocabularies (one symbol a line, in index order), and ``sentencepiece.model`` when given. CHECKPOINT is a
convs2s checkpoint or a fairseq fconv one (converted on the way, ``models/fconv_checkpoint.py``). DATA_DIR holds
the ``dict.<lang>.txt`` files the model was trained with (default: the data folder the checkpoint names; the
languages are the checkpoint's, else the data folder's, else ``--source-lang`` and ``--target-lang``). The
sentencepiece model must be the one the data was encoded with (its pieces are the dictionary's symbols); a
dictionary of sentencepiece pieces exported without it gets a warning (the runtime would then read and write
pieces). The folder is written beside OUT_DIR and renamed into place when complete; an OUT_DIR that exists must be
an earlier export, holding nothing else, which is replaced (through a link: the folder it points to).
"""

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace
from typing import List, Optional

import torch
from fairseq.data import Dictionary, data_utils

from convs2s_runtime.model import CONFIG, FORMAT, SENTENCEPIECE, VERSION, VOCABULARIES, WEIGHTS

from .compat.checkpoints import building_to_load
from .models.convs2s import ConvS2SModel
from .models.fconv_checkpoint import (
    FCONV_ARCHS,
    ConversionError,
    checkpoint_arch,
    convert_checkpoint,
    current_umask,
    model_args_of,
    read_checkpoint,
)
from .models.layer_spec import parse_attention_spec, parse_layer_spec


class ExportError(ValueError):
    """The export cannot be made; the message says why."""


def _task_settings(checkpoint: dict):
    """(data folder, source language, target language) as the checkpoint's task saved them (None where not)."""
    task = (checkpoint.get("cfg") or {}).get("task") or checkpoint.get("args")
    get = task.get if isinstance(task, dict) else (lambda key, default=None: getattr(task, key, default))
    data = get("data", None) if task is not None else None
    source, target = (get(key, None) if task is not None else None for key in ("source_lang", "target_lang"))
    return (str(data).split(os.pathsep)[0] if data else None), source, target


def _dictionaries(checkpoint: dict, data_dir, langs=(None, None)):
    saved, source, target = _task_settings(checkpoint)
    data = data_dir or saved
    if data_dir and not os.path.isdir(data_dir):
        raise ExportError(f"--data {data_dir}: no such folder")
    if not data or not os.path.isdir(data):
        where = f"the checkpoint's data folder {data} is not here" if data else "the checkpoint names no data folder"
        raise ExportError(f"{where}: pass --data, the fairseq-preprocess folder with the model's dict.<lang>.txt")
    if source is None or target is None:
        source, target = data_utils.infer_language_pair(data)
    source, target = langs[0] or source, langs[1] or target
    if source is None or target is None:
        found = sorted(name for name in os.listdir(data) if name.startswith("dict.") and name.endswith(".txt"))
        raise ExportError(
            f"neither the checkpoint nor {data} says which languages the model translates "
            f"({', '.join(found) or 'no dict.<lang>.txt'} there): pass --source-lang and --target-lang"
        )
    paths = [os.path.join(data, f"dict.{lang}.txt") for lang in (source, target)]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise ExportError(f"no {' or '.join(missing)} in {data}: pass --data, the folder with both")
    return (source, target), [Dictionary.load(p) for p in paths]


def build_model(checkpoint: dict, data_dir=None, langs=(None, None)):
    """The convs2s model of a loaded checkpoint (fconv converted), its weights loaded and folded for inference;
    with its languages (``langs`` where given) and dictionaries."""
    arch = checkpoint_arch(checkpoint)
    if arch in FCONV_ARCHS:
        checkpoint = convert_checkpoint(checkpoint, ConvS2SModel)
    elif arch is None or not str(arch).startswith("convs2s"):
        raise ExportError(f"a checkpoint of arch {arch!r}: export takes convs2s and fconv models")
    langs, (src_dict, tgt_dict) = _dictionaries(checkpoint, data_dir, langs)
    args = model_args_of(checkpoint)[0]
    args = Namespace(**(args if isinstance(args, dict) else vars(args)))
    task = SimpleNamespace(source_dictionary=src_dict, target_dictionary=tgt_dict)
    with building_to_load():
        model = ConvS2SModel.build_model(args, task)
    try:
        model.load_state_dict(checkpoint["model"], strict=True)
    except RuntimeError as e:
        raise ExportError(f"the checkpoint's weights do not fit the model its settings describe: {e}") from None
    model.eval().make_generation_fast_()
    return model, args, langs, (src_dict, tgt_dict)


def export_files(model, args, langs, dictionaries) -> dict:
    """{file name: bytes or tensors} of the folder."""
    src_dict, tgt_dict = dictionaries
    enc, dec = model.encoder, model.decoder
    encoder_layers = parse_layer_spec(str(args.encoder_layers))
    decoder_layers = parse_layer_spec(str(args.decoder_layers))
    config = {
        "format": FORMAT,
        "version": VERSION,
        "source_lang": langs[0],
        "target_lang": langs[1],
        "bos": tgt_dict.bos(),
        "pad": tgt_dict.pad(),
        "eos": tgt_dict.eos(),
        "unk": tgt_dict.unk(),
        "query_scale": next((b.attention.query_scale for b in dec.blocks if b.attention is not None), 1.0),
        "value_scale": enc.value_scale,
        "encoder": {"layers": [list(layer) for layer in encoder_layers], "max_positions": enc.max_positions()},
        "decoder": {
            "layers": [list(layer) for layer in decoder_layers],
            "attention": parse_attention_spec(str(args.decoder_attention), len(decoder_layers)),
            "max_positions": dec.max_positions(),
        },
    }
    weights = {}
    for name, tensor in model.state_dict().items():
        if name.endswith((".version", ".weight_g")):
            continue
        weights[name[: -len("_v")] if name.endswith(".weight_v") else name] = tensor.detach().clone()
    return {
        CONFIG: json.dumps(config, indent=1).encode("utf-8"),
        WEIGHTS: weights,
        VOCABULARIES["source"]: "".join(s + "\n" for s in src_dict.symbols).encode("utf-8"),
        VOCABULARIES["target"]: "".join(s + "\n" for s in tgt_dict.symbols).encode("utf-8"),
    }


EXPORTED = frozenset({CONFIG, WEIGHTS, SENTENCEPIECE, *VOCABULARIES.values()})
# the share of a dictionary's words that must be pieces of --sentencepiece-model: all of them when the model encoded
# the data; two models of 8,000 pieces trained on different text of the same languages share far fewer (61% for
# models of the two halves of Multi30k's training sentences)
PIECES_SHARE = 0.95


def _check_out_dir(out_dir: Path) -> None:
    """ExportError unless ``out_dir`` is new, empty, or an earlier export holding nothing else (it is replaced)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"{out_dir} is a file: name a folder to write")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        try:
            earlier = json.loads((out_dir / CONFIG).read_text(encoding="utf-8")).get("format") == FORMAT
        except (OSError, ValueError, AttributeError):
            earlier = False
        if not earlier:
            raise ExportError(f"{out_dir} exists and is not an earlier export: name a new folder")
        others = sorted(p.name for p in out_dir.iterdir() if p.name not in EXPORTED)
        if others:
            raise ExportError(
                f"{out_dir} is an earlier export that also holds {', '.join(others[:5])}"
                f"{' ...' if len(others) > 5 else ''}, which replacing it would delete: move them, or name a new folder"
            )
    if not out_dir.resolve().parent.is_dir():
        raise ExportError(f"{out_dir}: no such folder {out_dir.resolve().parent}")


def write_folder(files: dict, out_dir: Path, sentencepiece_model=None) -> None:
    """Write ``files`` into a folder beside ``out_dir`` and rename it into place (an earlier export replaced; where
    ``out_dir`` is a link, the folder it points to)."""
    out_dir = out_dir.resolve()
    parent = out_dir.parent
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{out_dir.name}.export."))
    old = None
    try:
        for name, content in files.items():
            if isinstance(content, bytes):
                (tmp / name).write_bytes(content)
            else:
                torch.save(content, tmp / name)
        if sentencepiece_model is not None:
            shutil.copyfile(sentencepiece_model, tmp / SENTENCEPIECE)
        os.chmod(tmp, 0o777 & ~current_umask())
        if out_dir.exists():
            old = parent / f".{out_dir.name}.replaced"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:  # (an interrupt between the two renames: the earlier export is put back)
        if old is not None and old.exists() and not out_dir.exists():
            os.replace(old, out_dir)
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _words(dictionaries) -> set:
    """The symbols of the dictionaries that stand for text: not the specials, not fairseq-preprocess's padding
    symbols (``madeupword0000`` ...)."""
    return {
        symbol
        for d in dictionaries
        for symbol in d.symbols[d.nspecial :]
        if not (symbol.startswith("madeupword") and symbol[10:].isdigit())
    }


def _pieces(path) -> set:
    import sentencepiece

    try:
        processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as e:
        raise ExportError(f"--sentencepiece-model {path}: not a sentencepiece model ({e})") from None
    return {processor.id_to_piece(i) for i in range(processor.get_piece_size())}


def _check_sentencepiece(path, pieces: Optional[set], dictionaries) -> List[str]:
    """ExportError when the model at ``path`` (its ``pieces``) is not the one the data was encoded with: a
    dictionary built from text that model encoded holds its pieces alone, so each dictionary, source and target,
    must be (all but a few of) its pieces. Without a model, a warning when the words look like sentencepiece
    pieces."""
    if path is None:
        words = _words(dictionaries)
        pieces = sum(word.startswith("\u2581") for word in words)
        if words and pieces >= 0.1 * len(words):
            return [
                f"{pieces} of the dictionary's {len(words)} words are sentencepiece pieces (they start with "
                "\u2581), and no --sentencepiece-model was given: the runtime will read and write pieces, not "
                "text. Export again with --sentencepiece-model SPM.model (the model the data was encoded with) to "
                "translate text"
            ]
        return []
    src_dict, tgt_dict = dictionaries
    sides = [("", src_dict)] if src_dict.symbols == tgt_dict.symbols else [("source ", src_dict), ("target ", tgt_dict)]
    for side, dictionary in sides:
        words = _words([dictionary])
        found = len(words & pieces)
        if found < PIECES_SHARE * len(words):
            raise ExportError(
                f"--sentencepiece-model {path}: only {found} of the {side}dictionary's {len(words)} words are its "
                "pieces: not the model the training data was encoded with (the runtime applies one model to both "
                "languages)"
            )
    return []


def export(checkpoint_path, out_dir, data_dir=None, sentencepiece_model=None, langs=(None, None)) -> List[str]:
    """Write the model folder; returns warnings for the user (ExportError, with nothing written, when it cannot)."""
    out_dir = Path(out_dir)
    _check_out_dir(out_dir)
    # (read before the checkpoint: a file that is no sentencepiece model at all is named at once)
    pieces = _pieces(sentencepiece_model) if sentencepiece_model is not None else None
    model, args, langs, dictionaries = build_model(read_checkpoint(checkpoint_path), data_dir, langs)
    warnings = _check_sentencepiece(sentencepiece_model, pieces, dictionaries)
    try:
        write_folder(export_files(model, args, langs, dictionaries), out_dir, sentencepiece_model)
    except OSError as e:
        raise ExportError(f"cannot write {out_dir}: {e.strerror or e}") from None
    return warnings


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fairseq_convs2s.export", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a convs2s or fconv checkpoint (.pt)")
    p.add_argument("out_dir", help="the model folder to write")
    p.add_argument("--data", default=None, help="the fairseq-preprocess folder with the model's dict.<lang>.txt")
    p.add_argument(
        "--sentencepiece-model",
        default=None,
        help="the model the data was encoded with, copied into the folder: the runtime applies it",
    )
    p.add_argument("--source-lang", default=None, help="where neither the checkpoint nor the data folder says")
    p.add_argument("--target-lang", default=None, help="where neither the checkpoint nor the data folder says")
    args = p.parse_args(argv)
    try:
        langs = (args.source_lang, args.target_lang)
        warnings = export(args.checkpoint, args.out_dir, args.data, args.sentencepiece_model, langs)
    except (ExportError, ConversionError, ValueError) as e:
        print(f"export: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"export: interrupted; {args.out_dir} is as it was", file=sys.stderr)
        return 130
    for warning in warnings:
        print(f"export: warning: {warning}", file=sys.stderr)
    try:
        print(
            f"wrote {args.out_dir}; translate with: python -m convs2s_runtime {shlex.quote(str(args.out_dir))}",
            flush=True,
        )
    except BrokenPipeError:  # (export ... | head: the folder is written; the reader went before this line)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
