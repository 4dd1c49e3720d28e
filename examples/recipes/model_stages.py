"""Stages 4-7 of a recipe: training, the model to test (an average from the end of training or the best
checkpoint), its translations of each test set and their scores, and the closing report."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Sequence

from recipes import final_model, scoring, text, training
from recipes.commands import USER_DIR, OutLock, child_options, device_flags, failure, fairseq, run, stage, train_command
from recipes.settings import folders, outputs, remove

if TYPE_CHECKING:
    from recipes.pipeline import EvalSet, Recipe, RecipeCommand

# averaging takes checkpoints saved in this final part of training (by update count) only
AVERAGE_TAIL = 0.25
TRIAL = "trial.json"  # in checkpoints/: what the batch trial measured (_batch_trial)


def train_stage(r: RecipeCommand) -> None:
    """Stage 4: checkpoints/, train.log. An interrupted training resumes from checkpoint_last.pt (fairseq's
    default --restore-file), and so does a training told to go on (train.done deleted), with this command's
    settings."""
    ckpt, args, train_args = r.ckpt, r.args, r.train_args
    if (ckpt / "train.done").exists():
        remedy = f"delete {folders(r.out, ckpt)} to train anew"
        if r.settings.difference("train", {"arch": r.arch}) is None:  # (the same model: it can train on)
            remedy += f", or only {ckpt.name}/train.done there to train on from its last checkpoint with this command"
        r.settings.refuse_changed("train", r.made_with["train"], ckpt, remedy)
    elif (ckpt / "checkpoint_last.pt").exists():  # (a training that resumes goes on with the same model only)
        r.settings.refuse_changed("train", {"arch": r.arch}, ckpt, f"delete {folders(r.out, ckpt)} to train anew")
    if not stage(f"4/7 fairseq-train --arch {r.arch}", ckpt / "train.done"):
        return
    import torch

    ckpt.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    fastest, notes = training.fastest_flags(r.arch, train_args, args.precision, cuda)
    separate = r.recipe.share_embeddings and args.separate_embeddings
    model_flags, model_notes = training.embedding_flags(r.arch, train_args, r.recipe.share_embeddings, separate)
    update_budget = args.update_budget
    if update_budget is None and args.time_budget is None:
        update_budget = r.recipe.update_budget
    budget = args.time_budget is not None or bool(update_budget)
    if budget and training.given_value(train_args, "--max-epoch") not in (None, "0"):
        notes.append("warning: --max-epoch in --train-args can end training before the budget, unannealed")
    recipes = [
        r.bin_dir, "--user-dir", USER_DIR, "--arch", r.recipe.arch, "--source-lang", r.src, "--target-lang", r.tgt,
        *r.recipe.train_flags,
    ]  # fmt: skip

    def chosen(batch: Sequence[str], minutes: float | None) -> list:
        # (a budget's --max-epoch 0 replaces the recipe's epoch limit, a chosen batch and dropout the recipe's)
        return [
            *batch, *training.optimization_flags(minutes, update_budget or None), *fastest, *model_flags,
            "--save-dir", ckpt, "--keep-last-epochs", max(args.average_last, 1),
            "--skip-invalid-size-inputs-valid-test", "--log-format", "simple", "--log-interval", "100",
            "--seed", "1", *device_flags(),
        ]  # fmt: skip

    for note in notes:
        print(f"   {note}")
    resuming = (ckpt / "checkpoint_last.pt").exists()
    minutes, expected_updates, expected_epochs = args.time_budget, None, None
    if training.wants_a_trial(r.recipe.train_flags, train_args, args.time_budget, cuda):
        trial = _batch_trial(
            r,
            lambda save_dir: [recipes, chosen([], args.time_budget), train_args, training.trial_flags(save_dir)],
            resuming,
        )
        minutes = args.time_budget - trial["minutes"]
        expected_updates = trial["updates_per_second"] * training.RUN_TO_TRIAL_RATE * minutes * 60
        if "updates_per_epoch" in trial:  # (a trial saved before the dropout rule: the recipe's dropout, as it began)
            expected_epochs = expected_updates / trial["updates_per_epoch"]
    longest = r.recipe.max_tokens_per_side + 1  # (its pieces and the end of sentence fairseq-preprocess adds)
    batch, batch_notes = training.batch_flags(r.recipe.train_flags, train_args, expected_updates, longest)
    dropout, dropout_notes = training.dropout_flags(r.recipe.train_flags, train_args, expected_epochs)
    length = training.length_note(minutes, update_budget, r.recipe.update_budget)
    for note in [*batch_notes, *dropout_notes, *model_notes, length]:
        print(f"   {note}")
    cmd = train_command() + training.later_wins(recipes, chosen([*batch, *dropout], minutes), train_args)
    r.settings.record("train", r.made_with["train"])  # (at the start: an interrupted training resumes as it)
    log = r.out / "train.log"
    if log.exists() and not resuming:  # a model trained anew: the curve and compare.py read its log alone
        earlier = _unused(log)
        log.rename(earlier)
        print(f"   the earlier training's log kept as {earlier.name}")
    r.timed("train", run, cmd, log=log, append=resuming, lock=r.lock)
    (ckpt / "train.done").touch()
    # a new model: the average and the outputs of an earlier model are stale (this is how "train longer" works:
    # delete checkpoints/train.done and run again with a larger budget)
    remove(ckpt / "checkpoint_avg.pt", ckpt / "chosen.txt", r.out / "curve.png", *outputs(r.out))
    r.settings.forget("average", "generate")


def _batch_trial(
    r: RecipeCommand, trial_parts: Callable[[Path], Sequence[Sequence]], resuming: bool
) -> Dict[str, float]:
    """The trial that chooses the batch and the dropout under a time budget on a CPU (:func:`training.wants_a_trial`):
    the training command for ``training.TRIAL_UPDATES`` updates of the recipe's batch (``trial_parts(save_dir)``:
    the parts of the command, later parts winning), its log in OUT/trial.log. Its updates a second, the updates of
    an epoch and the minutes it took, which the budget counts; a training that resumes (``resuming``) reads them
    from checkpoints/trial.json, so that its batch, dropout and schedule stay those it started with."""
    saved = r.ckpt / TRIAL
    if saved.exists() and resuming:
        trial = json.loads(saved.read_text())
        print(f"   trial: {trial['updates_per_second']:.2f} updates/s at the start of this training ({saved.name})")
        return trial
    save_dir, log = r.ckpt / "trial", r.out / "trial.log"
    cmd = train_command() + training.later_wins(*trial_parts(save_dir))
    r.timed("trial", run, cmd, log=log, quiet=("",), lock=r.lock)  # (its output in trial.log only)
    shutil.rmtree(save_dir, ignore_errors=True)
    logged = log.read_text()
    trial = {
        "updates_per_second": training.updates_per_second(logged),
        "updates_per_epoch": training.updates_per_epoch(logged),
        "minutes": r.timings["trial"] / 60,
    }
    saved.write_text(json.dumps(trial) + "\n")
    print(
        f"   trial: {training.TRIAL_UPDATES} updates of the recipe's batch at {trial['updates_per_second']:.2f} "
        f"updates/s; its {trial['minutes']:.1f} min count in the budget"
    )
    return trial


def model_stage(r: RecipeCommand) -> Path:
    """Stage 5 (with --checkpoint avg or auto): the model to test."""
    model = {"best": r.ckpt / "checkpoint_best.pt", "last": r.ckpt / "checkpoint_last.pt"}.get(r.args.checkpoint)
    if r.args.checkpoint not in ("avg", "auto"):
        if not model.exists():
            raise text.DataError(f"{model} is not there (training without validation saves no best): --checkpoint auto")
        return model
    difference = r.settings.difference("average", r.made_with["average"])
    if difference is not None:
        print(f"   {difference}: averaging and generating again")
        remove(r.ckpt / "checkpoint_avg.pt", r.ckpt / "chosen.txt", *outputs(r.out))
        r.settings.forget("average", "generate")
    fresh = not (r.ckpt / ("chosen.txt" if r.args.checkpoint == "auto" else "checkpoint_avg.pt")).exists()
    model = average_and_choose(r.args, r.ckpt, r.bin_dir, r.src, r.tgt, r.lock)
    if fresh:
        r.settings.record("average", r.made_with["average"])
    return model


def test_stage(r: RecipeCommand, index: int, model: Path) -> str:
    """Stages 6 and 7 on ``eval_sets[index]``: its translations and score; returns the score's summary line."""
    if index == 0:  # (once, before the first set)
        difference = r.settings.difference("generate", r.made_with["generate"])
        if difference is not None:
            print(f"   {difference}: generating again")
            remove(*outputs(r.out))
            r.settings.forget("generate")
    eval_set, args = r.eval_sets[index], r.args
    # file names carry the checkpoint, so --checkpoint best after --checkpoint avg generates again
    tag = f"{eval_set.name}.{args.checkpoint}"
    generated, hyp_file, score_file = r.out / f"generate-{tag}.txt", r.out / f"{tag}.hyp", r.out / f"score-{tag}.txt"
    given = shlex.split(args.generate_args)
    beam = training.given_value(given, "--beam") or "5"
    if stage(f"6/7 fairseq-generate --beam {beam} on {eval_set.name} ({model.name})", generated):
        recipes = [
            r.bin_dir, "--user-dir", USER_DIR, "--path", model, "--source-lang", r.src, "--target-lang", r.tgt,
            "--gen-subset", r.subset(index), "--beam", "5", "--min-len", eval_set.min_len, "--batch-size", "64",
            "--remove-bpe", "sentencepiece",
            "--required-batch-size-multiple", "1",  # else fairseq may drop the last sentences (issue 5036)
            *r.recipe.generate_flags, *device_flags(),
        ]  # fmt: skip
        cmd = fairseq("generate") + training.later_wins(recipes, given)
        # the per-sentence S-/T-/H-/D-/P- lines go to the file only
        partial = generated.with_name(generated.name + ".partial")
        r.timed(f"generate {eval_set.name}", run, cmd, log=partial, quiet=("S-", "T-", "H-", "D-", "P-"), lock=r.lock)
        write_hypotheses(partial, hyp_file, len(text.read_lines(r.raw / f"{eval_set.name}.{r.src}")))
        partial.rename(generated)
        r.settings.record("generate", r.made_with["generate"])
    if stage(f"7/7 score {eval_set.name}", score_file):
        score_file.write_text(score(r.recipe, eval_set, hyp_file, r.raw, r.tgt) + "\n")
    show_examples(hyp_file, r.raw / f"{eval_set.name}.{r.src}", r.raw / f"{eval_set.name}.{r.tgt}")
    return f"{eval_set.name} ({model.name}): {score_file.read_text().strip()}"


def report(r: RecipeCommand, model: Path, summary: Sequence[str]) -> None:
    """The scores, the time each stage took (also added to OUT/timings.txt), and how to translate other text."""
    print("\n== results")
    for line in summary:
        print(line)
    if r.recipe.reference:
        print(f"for comparison: {r.recipe.reference}")
    for name, seconds in r.timings.items():
        print(f"   {name}: {seconds / 60:.1f} min")
    with open(r.out / "timings.txt", "a", encoding="utf-8") as f:
        f.writelines(f"{name}\t{seconds:.0f} s\n" for name, seconds in r.timings.items())
    interactive = [
        "fairseq-interactive", r.bin_dir, "--user-dir", USER_DIR, "--path", model, "--beam", "5",
        "--source-lang", r.src, "--target-lang", r.tgt, "--bpe", "sentencepiece",
        "--sentencepiece-model", r.spm_dir / "spm.model",
    ]  # fmt: skip
    print(f"translate your own text:\n   {shlex.join(map(str, interactive))}   (add --cpu on a machine without a GPU)")


def write_curve(out: Path, title: str) -> None:
    """OUT/curve.tsv and OUT/curve.png: validation perplexity against minutes of training, from train.log."""
    from recipes import curve

    points = curve.read_validation_curve((out / "train.log").read_text(encoding="utf-8", errors="replace"))
    if not points:
        print("   no validation in train.log: no curve")
        return
    curve.write_curve_tsv(points, out / "curve.tsv")
    curve.write_curve_png(points, out / "curve.png", title)
    print(f"   validation curve: {out / 'curve.png'} ({len(points)} points; the numbers in curve.tsv)")


def average_and_choose(args, ckpt: Path, bin_dir: Path, src: str, tgt: str, lock: OutLock) -> Path:
    """Stage 5: checkpoint_avg.pt, the average of up to ``--average-last`` checkpoints from the final part of
    training; with ``--checkpoint auto``, that or checkpoint_best.pt, whichever validates lower (the choice and
    both losses kept in checkpoints/chosen.txt). Returns the model to test."""
    averaged, best, chosen = ckpt / "checkpoint_avg.pt", ckpt / "checkpoint_best.pt", ckpt / "chosen.txt"
    done = chosen if args.checkpoint == "auto" else averaged
    if not stage(f"5/7 average up to {args.average_last} checkpoints from the end of training", done):
        if args.checkpoint == "avg":
            return averaged
        name, _, reason = chosen.read_text(encoding="utf-8").partition("\t")
        print(f"   testing {reason.strip()}")
        return ckpt / name
    import torch  # imported only by the stages that need it: a finished run starts in a blink

    from recipes.average_checkpoints import average_checkpoints

    inputs = final_model.averaging_candidates(ckpt, args.average_last, AVERAGE_TAIL)
    if not inputs:
        sys.exit(f"no checkpoint<epoch>.pt or checkpoint_last.pt in {ckpt} to average")
    print(f"   {', '.join(s.path.name for s in inputs)}")
    if len(inputs) > 1 or args.checkpoint == "avg":
        partial = averaged.with_name(averaged.name + ".partial")
        torch.save(average_checkpoints([s.path for s in inputs]), partial)
        partial.rename(averaged)  # the final name only when complete: an interrupted save is redone
    if args.checkpoint == "avg":
        return averaged

    def validate(path: Path) -> float:
        cmd = fairseq("validate") + [
            bin_dir, "--user-dir", USER_DIR, "--path", path, "--task", "translation", "--source-lang", src,
            "--target-lang", tgt, "--valid-subset", "valid", "--max-tokens", "4000", "--num-workers", "0",
            "--skip-invalid-size-inputs-valid-test", "--model-overrides", repr({"data": str(bin_dir)}), *device_flags(),
        ]  # fmt: skip
        print("$ " + shlex.join(str(c) for c in cmd), flush=True)
        result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **child_options(lock))
        if result.returncode != 0:  # its own words say why, then the one line that names the command
            sys.stderr.write(result.stdout[-3000:] + result.stderr[-3000:])
            raise failure(cmd, result.returncode, None)
        return final_model.validation_loss(result.stdout + result.stderr)

    choice = final_model.choose(averaged if len(inputs) > 1 else None, best, validate, inputs)
    print(f"   testing {choice.reason}")
    chosen.write_text(f"{choice.path.name}\t{choice.reason}\n", encoding="utf-8")
    return choice.path


_DETOK = re.compile(r"^D-(\d+)\t[^\t]*\t(.*)$")


def write_hypotheses(generate_log: Path, hyp_file: Path, sentences: int) -> None:
    """The best of fairseq-generate's detokenized ``D-<id>`` lines for each of the test set's ``sentences`` (the
    first of each id: fairseq prints a sentence's hypotheses best first), in the order of the test set; a
    :class:`text.DataError` where the output is not one test set's translations."""
    hyps = {}
    for line in generate_log.read_text(encoding="utf-8").splitlines():
        m = _DETOK.match(line)
        if m:
            hyps.setdefault(int(m.group(1)), m.group(2))
    if not hyps:
        raise text.DataError(
            f"{generate_log} holds no D- lines to score (a flag in --generate-args such as --quiet or --results-path?)"
        )
    if max(hyps) >= sentences:
        raise text.DataError(
            f"{generate_log} translates sentence {max(hyps)} and the test set has {sentences} (another "
            "--gen-subset in --generate-args?)"
        )
    missing = [i for i in range(sentences) if i not in hyps]
    if missing:
        listed = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
        raise text.DataError(
            f"{generate_log}: no hypothesis for {len(missing)} of the {sentences} test sentences (ids {listed}); "
            "--skip-invalid-size-inputs-valid-test leaves out sentences too long for the model, --truncate-source "
            "--max-source-positions N cuts them"
        )
    hyp_file.write_text("".join(hyps[i] + "\n" for i in range(sentences)), encoding="utf-8")


def _unused(path: Path) -> Path:
    """``train.1.log`` for ``train.log``, or the first number not taken."""
    n = 1
    while (kept := path.with_name(f"{path.stem}.{n}{path.suffix}")).exists():
        n += 1
    return kept


def score(recipe: Recipe, eval_set: EvalSet, hyp_file: Path, raw: Path, tgt: str) -> str:
    """The score line(s) of one test set against its normalized, untokenized references."""
    hyps = text.read_lines(hyp_file)
    refs = text.read_references(raw, eval_set.name, tgt)
    if any(len(r) != len(hyps) for r in refs):
        raise text.DataError(f"{hyp_file} has {len(hyps)} lines, the references {[len(r) for r in refs]}")
    if recipe.metric == "bleu":
        return scoring.bleu(hyps, refs)
    scores = scoring.rouge(hyps, refs, eval_set.rouge_recall_bytes)
    return scoring.format_rouge(scores, eval_set.rouge_recall_bytes)


def show_examples(hyp_file: Path, src_file: Path, ref_file: Path, n: int = 3) -> None:
    hyps, srcs, refs = (text.read_lines(p)[:n] for p in (hyp_file, src_file, ref_file))
    for s, h, r in zip(srcs, hyps, refs):
        print(f"   source:    {s}\n   output:    {h}\n   reference: {r}")
