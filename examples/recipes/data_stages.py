"""Stages 1-3 of a recipe: the raw text, the sentencepiece pieces and fairseq's binarized data, and an extra test
set (DUC-2004) made alone with the same dictionary.

Each of stages 1-3 records its settings when it starts (``settings.py``): a rerun after an interrupt reuses what the
stage had made (the splits written, the sentencepiece model), and so must be the same command.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Dict

from recipes import text
from recipes.commands import fairseq, run, stage
from recipes.settings import folders, outputs, remove

if TYPE_CHECKING:
    from recipes.pipeline import EvalSet, Recipe, RecipeCommand

SPLITS = ("train", "valid", "test")


def refuse_data_of_another_command(r: RecipeCommand) -> None:
    """The data, pieces and binarized data of another command are refused before anything runs."""
    kept = [("data", r.raw), ("sentencepiece", r.spm_dir), ("preprocess", r.bin_dir)]
    for k, (name, folder) in enumerate(kept):
        redo = f"delete {folders(r.out, *(later for _, later in kept[k:]), r.ckpt)} to redo them"
        r.settings.refuse_changed(name, r.made_with[name], folder, redo)


def data_stage(r: RecipeCommand) -> None:
    """Stage 1: raw/{train,valid,test}.<lang>."""
    if stage("1/7 data", r.raw / f"test.{r.recipe.langs[1]}"):
        r.settings.record("data", r.made_with["data"])
        r.timed("data", prepare_raw, r.recipe, r.args, r.raw)


def sentencepiece_stage(r: RecipeCommand) -> None:
    """Stage 2: spm/spm.model and the splits in pieces."""
    title = f"2/7 sentencepiece (joint {r.recipe.spm_model_type}, {r.args.vocab_size} pieces)"
    if stage(title, r.spm_dir / "test.done"):
        r.settings.record("sentencepiece", r.made_with["sentencepiece"])
        r.timed("sentencepiece", prepare_pieces, r.recipe, r.args, r.raw, r.spm_dir)


def preprocess_stage(r: RecipeCommand) -> None:
    """Stage 3: data-bin/, the dictionary and the binarized splits."""
    if stage(f"3/7 fairseq-preprocess {r.pair}", r.bin_dir / f"test.{r.pair}.{r.tgt}.idx"):
        shutil.rmtree(r.bin_dir, ignore_errors=True)
        cmd = fairseq("preprocess") + [
            "--source-lang", r.src, "--target-lang", r.tgt, "--joined-dictionary",
            "--trainpref", r.spm_dir / "train", "--validpref", r.spm_dir / "valid", "--testpref", r.spm_dir / "test",
            "--destdir", r.bin_dir, "--workers", r.args.workers,
        ]  # fmt: skip
        r.settings.record("preprocess", r.made_with["preprocess"])
        r.timed("preprocess", run, cmd, lock=r.lock)


def extra_test_set_stage(r: RecipeCommand, index: int) -> None:
    """Stages 1-3 for an extra test set (DUC-2004) alone: its raw files, pieces and binarized subset
    (data-bin/test<index>, the dictionary of stage 3). Given other files or settings than the set was made from, it
    is made, translated and scored again (it kept the first files' score), the model and the other sets kept."""
    extra, subset = r.eval_sets[index], r.subset(index)
    made = r.bin_dir / f"{subset}.{r.pair}.{r.tgt}.idx"
    name, now = f"test set {extra.name}", extra_set_settings(extra)
    difference = r.settings.difference(name, now) if made.exists() else None
    if difference is not None:
        print(f"   {extra.name}: {difference}: preparing, translating and scoring it again")
        remove(*r.raw.glob(f"{extra.name}.*"), *r.spm_dir.glob(f"{extra.name}.*"))
        remove(*r.bin_dir.glob(f"{subset}.*"), *outputs(r.out, extra.name))
    if not stage(f"3/7 {extra.name}: normalize, encode, fairseq-preprocess as {subset}", made):
        return
    r.settings.record(name, now)
    remove(*outputs(r.out, extra.name))  # (any made from files of an earlier record)
    a, b = r.recipe.langs
    started = time.time()
    write_extra_set(extra, r.raw, a, b)
    pieces = [r.spm_dir / f"{extra.name}.{lang}" for lang in (a, b)]
    text.encode_pairs(r.spm_dir / "spm.model", r.raw / f"{extra.name}.{a}", r.raw / f"{extra.name}.{b}", *pieces)
    staging = r.bin_dir / f"{subset}.partial"  # fairseq-preprocess names its output test.*; renamed below
    shutil.rmtree(staging, ignore_errors=True)
    cmd = fairseq("preprocess") + [
        "--source-lang", r.src, "--target-lang", r.tgt, "--joined-dictionary",
        "--srcdict", r.bin_dir / f"dict.{r.src}.txt", "--testpref", r.spm_dir / extra.name,
        "--destdir", staging, "--workers", 1,
    ]  # fmt: skip
    run(cmd, lock=r.lock)
    for lang in (r.src, r.tgt):  # the target's index last: it marks the set done
        for kind in ("bin", "idx"):
            (staging / f"test.{r.pair}.{lang}.{kind}").rename(r.bin_dir / f"{subset}.{r.pair}.{lang}.{kind}")
    shutil.rmtree(staging)
    r.timings[extra.name] = time.time() - started


def extra_set_settings(extra: EvalSet) -> Dict:
    """What an extra test set's files and scores are made from: its files (path and content) and settings."""
    return {
        "source": _file_identity(extra.source),
        "references": [_file_identity(path) for path in extra.references],
        "min_len": extra.min_len,
        "rouge_recall_bytes": extra.rouge_recall_bytes,
    }


def _file_identity(path: Path) -> str:
    """``/abs/path (sha256 0123456789ab)``: a file given again under another name, or changed in place, differs."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    return f"{path.resolve()} (sha256 {digest})"


def prepare_raw(recipe: Recipe, args, raw: Path) -> None:
    """Stage 1: raw/<split>.<lang> for train, valid and test, normalized, one sentence a line."""
    if args.raw_dir is not None:
        source_dir = args.raw_dir
    elif recipe.download is not None:
        source_dir = recipe.download(args.out.resolve() / "download", args.mirror)
    else:
        raise SystemExit(f"{recipe.name}: no download for this corpus; give --raw-dir")
    raw.mkdir(parents=True, exist_ok=True)
    a, b = recipe.langs
    for split in SPLITS:
        if (raw / f"{split}.{b}").exists():
            continue  # written before an interrupt
        name = {lang: recipe.raw_pattern.format(prefix=recipe.raw_prefixes[split], lang=lang) for lang in (a, b)}
        limit = args.max_train_lines if split == "train" else recipe.max_valid_lines if split == "valid" else None
        read_from = [text.find_raw_file(source_dir, name[lang]) for lang in (a, b)]  # (plain or .gz)
        pairs = text.read_pairs(*read_from, limit)
        written = [raw / f"{split}.{lang}" for lang in (a, b)]
        n = text.write_normalized_pairs(pairs, *written, recipe.fix_line)
        if not any(s.strip() and t.strip() for s, t in text.read_pairs(*written)):
            # (sentencepiece ended in a RuntimeError traceback on an empty train split; fairseq refused an empty
            # valid or test split only after the training before it)
            remove(*written)  # (not done: the rerun reads the fixed files)
            what = "are empty" if n == 0 else f"hold no pair with words on both sides in {n} lines"
            raise text.DataError(f"{read_from[0]} and {read_from[1]} {what}: the {split} split needs sentences")
        print(f"   {split}: {n} pairs from {read_from[0]} and {read_from[1].name}")


def write_extra_set(extra: EvalSet, raw: Path, a: str, b: str) -> None:
    """raw/<name>.<a> (the sources) and raw/<name>.<b>[.ref<k>] (one or more references) of an extra test set."""
    refs = [text.read_lines(p) for p in extra.references]
    sources = text.read_lines(extra.source)
    for path, lines in zip(extra.references, refs):
        if len(lines) != len(sources):
            raise text.DataError(f"{path} has {len(lines)} lines, {extra.source} has {len(sources)}")
    raw.mkdir(parents=True, exist_ok=True)
    for k, lines in enumerate(refs):
        suffix = "" if k == 0 else f".ref{k}"
        with open(raw / f"{extra.name}.{b}{suffix}", "w", encoding="utf-8") as f:
            f.writelines(text.normalize(line) + "\n" for line in lines)
    (raw / f"{extra.name}.{a}").write_text("".join(text.normalize(s) + "\n" for s in sources), encoding="utf-8")
    print(f"   {extra.name}: {len(sources)} sources, {len(refs)} references each")


def prepare_pieces(recipe: Recipe, args, raw: Path, spm_dir: Path) -> None:
    """Stage 2: learn the joint sentencepiece model on train, then encode every split (filtering train/valid)."""
    spm_dir.mkdir(parents=True, exist_ok=True)
    a, b = recipe.langs
    model = spm_dir / "spm.model"
    if not model.exists():
        text.train_sentencepiece(
            [raw / f"train.{a}", raw / f"train.{b}"],
            spm_dir / "spm",
            args.vocab_size,
            recipe.spm_model_type,
            recipe.character_coverage,
            args.workers,
        )
    for name in SPLITS:
        filtered = name in ("train", "valid")
        kept, read = text.encode_pairs(
            model,
            raw / f"{name}.{a}",
            raw / f"{name}.{b}",
            spm_dir / f"{name}.{a}",
            spm_dir / f"{name}.{b}",
            max_tokens=recipe.max_tokens_per_side if filtered else None,
            max_ratio=recipe.max_len_ratio if filtered else None,
            threads=args.workers,
        )
        print(f"   {name}: {kept} of {read} pairs" + (" kept by the length/ratio filter" if filtered else ""))
        if kept == 0:  # (fairseq refused the empty split only in the training after fairseq-preprocess)
            ratio = f", lengths within {recipe.max_len_ratio}x" if recipe.max_len_ratio else ""
            raise text.DataError(
                f"no pair of {raw / name}.{{{a},{b}}} passes the length filter (each side 1 to "
                f"{recipe.max_tokens_per_side} pieces{ratio}): fix the raw files, then delete raw/ and spm/ in "
                f"{args.out} to redo them"
            )
    (spm_dir / "test.done").touch()
