"""The pipeline every recipe runs, from raw text to a score. Each task's ``run.py`` only describes its data and
settings (a :class:`Recipe`) and calls :func:`main`.

Stages, each skipped when its output is already there (delete a stage's output to run it again; a training that
runs again, to train longer, makes stages 5-7 run again too). ``OUT/settings.json`` keeps the settings each output
was made with (``settings.py``): a command with other settings stops before stages 1-4 instead of skipping them,
and runs 5-7 again:

  1 data            download and unpack (or ``--raw-dir`` with local files), normalize  -> OUT/raw/
  2 sentencepiece   one joint vocabulary over both sides of train; encode; length/ratio filter -> OUT/spm/
  3 preprocess      fairseq-preprocess --joined-dictionary                               -> OUT/data-bin/
                    an extra test set (DUC-2004) alone, made again when given other files -> data-bin/test1.*
  4 train           fairseq-train with the recipe's preset and the paper's optimization  -> OUT/checkpoints/
                    (under --time-budget, annealed to its end); the validation curve    -> OUT/curve.{tsv,png}
  5 average         average checkpoints from the end of training; keep it if it validates
                    better than checkpoint_best.pt                                      -> checkpoint_avg.pt
  6 generate        fairseq-generate --beam 5 on each test set, detokenized              -> OUT/<test>.hyp
  7 score           sacrebleu (with its signature) or ROUGE-1/2/L                        -> OUT/score-<test>.txt
"""

import argparse
import contextlib
import hashlib
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
USER_DIR = REPO / "fairseq_convs2s"
sys.path.insert(0, str(HERE.parent))

from recipes import final_model, scoring, text, training  # noqa: E402
from recipes.settings import RunSettings, SettingsChanged, folders  # noqa: E402

SPLITS = ("train", "valid", "test")


@dataclass
class EvalSet:
    """A test set to translate and score. The recipe's own test split has no files here; an extra one (DUC-2004)
    names its source file and one or more reference files."""

    name: str
    source: Optional[Path] = None
    references: Sequence[Path] = ()
    min_len: int = 1  # fairseq-generate --min-len, in subword tokens
    rouge_recall_bytes: Optional[int] = None  # ROUGE recall of outputs cut to this many bytes instead of F1


@dataclass
class Recipe:
    """What differs between tasks: where the data comes from, the vocabulary, the model and its training flags."""

    name: str
    langs: Sequence[str]  # the two "languages"; the first is the default source
    # raw files: raw_pattern.format(prefix=raw_prefixes[split], lang=lang), plain text or .gz
    raw_prefixes: Dict[str, str]
    raw_pattern: str = "{prefix}.{lang}"
    # download(folder, mirror) fetches and unpacks the corpus below folder; returns the folder of raw files
    download: Optional[Callable[[Path, Optional[str]], Path]] = None
    fix_line: Optional[Callable[[str], str]] = None  # a task's own clean-up, before the common normalization
    max_valid_lines: Optional[int] = None  # validate on the first N pairs only (Gigaword's dev set is 190k)
    vocab_size: int = 32000
    spm_model_type: str = "bpe"
    character_coverage: float = 1.0
    max_tokens_per_side: int = 250  # train/valid pairs longer than this (in pieces) are dropped
    max_len_ratio: Optional[float] = 1.5  # ... and pairs whose lengths differ more than this ratio
    arch: str = "convs2s_iwslt_de_en"
    train_flags: List[str] = field(default_factory=list)  # after the common ones; --train-args come last
    # the training length without --time-budget or --update-budget: that many updates on the budget schedule
    # (None: the paper's plateau rule)
    update_budget: Optional[int] = None
    # a convs2s model's one embedding table for both languages and the output (--share-all-embeddings; the
    # vocabulary is joint): the recipe's default, --separate-embeddings turns it off
    share_embeddings: bool = False
    average_last: int = 5
    generate_flags: List[str] = field(default_factory=list)
    metric: str = "bleu"  # or "rouge"
    reference: str = ""  # the numbers to compare with, printed with the score
    add_args: Optional[Callable[[argparse.ArgumentParser], None]] = None
    extra_eval_sets: Optional[Callable[[argparse.Namespace], List[EvalSet]]] = None


# averaging takes checkpoints saved in this final part of training (by update count) only
AVERAGE_TAIL = 0.25


def stage(name: str, done: Path) -> bool:
    """Print the stage header; False (skip the stage) when its output ``done`` already exists."""
    if done.exists():
        print(f"== {name}: already done ({done})", flush=True)
        return False
    print(f"== {name}", flush=True)
    return True


def fairseq(tool: str) -> List[str]:
    return [sys.executable, "-m", f"fairseq_cli.{tool}"]


class CommandFailed(Exception):
    """A stage's command exited with an error (its own output, printed above, says why); the message names the
    command, how it ended and where its output is kept."""


def command_name(cmd: Sequence[str]) -> str:
    """``fairseq-train`` for ``python -m fairseq_cli.train ...``, ``python -m fairseq_convs2s.train`` for the
    plugin's entry; the program otherwise."""
    if len(cmd) > 2 and cmd[1] == "-m":
        module = cmd[2]
        return "fairseq-" + module.split(".", 1)[1] if module.startswith("fairseq_cli.") else f"python -m {module}"
    return Path(cmd[0]).name


def failure(cmd: Sequence[str], returncode: int, log: Optional[Path]) -> CommandFailed:
    """The error for a command that exited with ``returncode`` (negative: killed by that signal)."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:  # a number Python has no name for
            name = f"signal {-returncode}"
        how = f"was killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    else:
        how = f"exited with status {returncode}"
    kept = f" (its output is also in {log})" if log is not None else ""
    return CommandFailed(
        f"{command_name(cmd)} {how}{kept}; once fixed, run the same command again: the stages already done are "
        "skipped and an interrupted training resumes from its last checkpoint"
    )


@contextlib.contextmanager
def errors_in_one_line(prog: str) -> Iterator[None]:
    """Ends a driver's run on a corpus it cannot use or a command that failed with one line, ``PROG: error:
    ...`` (exit 1; what went wrong was printed above it), and on an interrupt with one line saying how to go on
    (exit 130), not a traceback."""
    try:
        yield
    except (text.DataError, CommandFailed, SettingsChanged) as e:
        sys.exit(f"{prog}: error: {e}")
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted; run the same command again to go on from here", file=sys.stderr)
        sys.exit(130)


def run(cmd: Sequence, log: Optional[Path] = None, append: bool = False, quiet: Sequence[str] = ()) -> None:
    """Run a command; :class:`CommandFailed` when it fails. Its output goes to the console and, when given, all of
    it into ``log`` (the lines starting with one of ``quiet`` into ``log`` only)."""
    cmd = [str(c) for c in cmd]
    print("$ " + shlex.join(cmd), flush=True)
    if log is None:
        returncode = subprocess.run(cmd).returncode  # on an exception (Ctrl-C) subprocess.run kills the child
        if returncode != 0:
            raise failure(cmd, returncode, None)
        return
    with open(log, "a" if append else "w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)

        def copy_output() -> None:
            for line in proc.stdout:
                if not line.startswith(tuple(quiet)):
                    sys.stdout.write(line)
                out.write(line)

        try:
            copy_output()
        except BaseException:
            # a Ctrl-C in the terminal reached the child too; an interrupt sent to this process alone did not,
            # and the child would go on training, unseen, beside the rerun. Training saves where it is and stops
            # (python -m fairseq_convs2s.train, on SIGINT or SIGTERM): its last lines say what it saved
            proc.terminate()
            copy_output()
            proc.wait()
            raise
        if proc.wait() != 0:
            raise failure(cmd, proc.returncode, log)


def train_command() -> List[str]:
    """The plugin's entry to fairseq-train, ``python -m fairseq_convs2s.train``, on every device: the same flags and
    training loop, and an interrupt or SIGTERM saves where training is before it stops (fairseq-train stops at once,
    losing every update since its last save: up to an epoch, hours of a WMT run on GPUs); ``--bf16`` is bfloat16 on
    a GPU too (fairseq-train takes it for a TPU); on a CPU it keeps the memory an update frees for the next
    (BENCHMARKS.md, "What bounds them")."""
    return [sys.executable, "-m", "fairseq_convs2s.train"]


def device_flags() -> List[str]:
    """``--cpu`` where torch sees no GPU (fairseq would fail without it); nothing where it does, so that
    fairseq-train uses every visible GPU."""
    import torch  # here, not at the top: a run whose stages are all done never pays for the import

    return [] if torch.cuda.is_available() else ["--cpu"]


def count(text: str) -> int:
    """argparse's type for a count: 0 or less is a usage error, not sentencepiece's or fairseq's crash later."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def updates(text: str) -> int:
    """argparse's type for ``--update-budget``: a count, or 0 for none (the plateau rule)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (no budget) or more, got {value}")
    return value


def minutes(text: str) -> float:
    """argparse's type for ``--time-budget``: a positive number of minutes (not inf: a budget that never ends never
    anneals the rate; leave the flag out for the recipe's length in updates)."""
    value = float(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive number of minutes, got {text}")
    return value


def out_dir(text: str) -> Path:
    """argparse's type for ``--out``: an existing file is a usage error, not a traceback at the first mkdir."""
    path = Path(text)
    if not text.strip():
        raise argparse.ArgumentTypeError("must name a folder (an empty name is the current folder: give '.' for it)")
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    return path


def build_parser(recipe: Recipe, doc: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    add = parser.add_argument
    add(
        "--out",
        type=out_dir,
        default=Path("outputs") / recipe.name,
        help="where every stage writes (default: %(default)s)",
    )
    add("--raw-dir", type=Path, help="use the raw files in this folder instead of downloading (see the README)")
    add("--mirror", help="fetch every download as MIRROR/<file name> (a mirror, or file:///dir of hand downloads)")
    add(
        "--source-lang", choices=list(recipe.langs), help=f"default: {recipe.langs[0]}, or the other than --target-lang"
    )
    add("--target-lang", choices=list(recipe.langs), help="default: the other one")
    add("--max-train-lines", type=count, help="use only the first N training pairs (a quick try, a smoke test)")
    add("--vocab-size", type=count, default=recipe.vocab_size, help="joint sentencepiece vocabulary (%(default)s)")
    add(
        "--time-budget",
        type=minutes,
        metavar="MINUTES",
        help="train for this many minutes, the learning rate annealed to 0 at the end (--lr-scheduler budget), "
        "instead of until the validation loss plateaus",
    )
    default_length = f"{recipe.update_budget} updates" if recipe.update_budget else "the plateau rule"
    add(
        "--update-budget",
        type=updates,
        metavar="UPDATES",
        help="train for this many updates, annealed in the same way (with --time-budget: whichever ends first); "
        f"0: until the validation loss plateaus. Without either budget: {default_length}",
    )
    if recipe.share_embeddings:
        add(
            "--separate-embeddings",
            action="store_true",
            help="train separate source, target and output embeddings (the paper's model) instead of one table",
        )
    add(
        "--precision",
        choices=["auto", "fp32", "bf16"],
        default="auto",
        help="auto (default): bf16 on a CPU that computes it natively, else fp32",
    )
    add(
        "--average-last",
        type=count,
        default=recipe.average_last,
        help=f"average up to N checkpoints from the last {AVERAGE_TAIL * 100:.0f}%% of training (%(default)s)",
    )
    add(
        "--checkpoint",
        choices=["auto", "avg", "best", "last"],
        default="auto",
        help="the model to test; auto (default): the average or checkpoint_best.pt, the lower validation loss",
    )
    add("--train-args", default="", help='more fairseq-train flags, e.g. "--max-epoch 30 --fp16"; they win')
    add("--generate-args", default="", help='more fairseq-generate flags, e.g. "--lenpen 1.2"')
    add("--workers", type=count, default=min(8, os.cpu_count() or 1), help="threads for data preparation")
    if recipe.add_args:
        recipe.add_args(parser)
    return parser


def _flag_values_attached(argv: Sequence[str]) -> List[str]:
    """``--train-args --flag`` as ``--train-args=--flag``: argparse takes a lone ``--flag`` after an option for an
    option of its own and stops with ``expected one argument`` (a value with a space in it passes already)."""
    out, rest = [], iter(argv)
    for arg in rest:
        value = next(rest, None) if arg in ("--train-args", "--generate-args") else None
        out.append(arg if value is None else f"{arg}={value}")
    return out


# fairseq-train flags the recipe sets from its own (the stages after training read what they decide)
OWNED_TRAIN_FLAGS = {
    "--save-dir": "the recipe keeps its checkpoints in OUT/checkpoints (give another --out)",
    "--source-lang": "give the recipe's own --source-lang",
    "--target-lang": "give the recipe's own --target-lang",
}


def main(recipe: Recipe, doc: str, argv: Optional[Sequence[str]] = None) -> None:
    """Parse the command line and run the stages of ``recipe``."""
    parser = build_parser(recipe, doc)
    args = parser.parse_args(_flag_values_attached(sys.argv[1:] if argv is None else argv))
    other = {recipe.langs[0]: recipe.langs[1], recipe.langs[1]: recipe.langs[0]}
    src = args.source_lang or (other[args.target_lang] if args.target_lang else recipe.langs[0])
    tgt = args.target_lang or other[src]
    if tgt == src:
        parser.error("--source-lang and --target-lang must differ")
    for flag, instead in OWNED_TRAIN_FLAGS.items():
        if training.given_value(shlex.split(args.train_args), flag) is not None:
            parser.error(f"{flag} in --train-args: {instead}")
    with errors_in_one_line(parser.prog):
        run_stages(recipe, args, src, tgt)


@dataclass
class RecipeCommand:
    """One command's run of a recipe: its folders, the settings each stage's output is made with, and the minutes
    each stage took."""

    recipe: Recipe
    args: argparse.Namespace
    src: str
    tgt: str

    def __post_init__(self):
        self.out = self.args.out.resolve()
        self.raw, self.spm_dir, self.bin_dir = self.out / "raw", self.out / "spm", self.out / "data-bin"
        self.ckpt = self.out / "checkpoints"
        self.pair = f"{self.src}-{self.tgt}"
        extra = self.recipe.extra_eval_sets(self.args) if self.recipe.extra_eval_sets else []
        self.eval_sets: List[EvalSet] = [EvalSet("test"), *extra]
        self.train_args = shlex.split(self.args.train_args)
        self.arch = training.given_value(self.train_args, "--arch") or self.recipe.arch  # --train-args win
        self.settings = RunSettings(self.out)
        self.made_with = stage_settings(self.args, self.src, self.tgt, self.arch)
        self.timings: Dict[str, float] = {}

    def timed(self, name: str, fn: Callable, *fn_args, **fn_kwargs) -> None:
        started = time.time()
        fn(*fn_args, **fn_kwargs)
        self.timings[name] = time.time() - started

    def subset(self, index: int) -> str:
        """fairseq's name for the test set ``eval_sets[index]``: test, test1, ..."""
        return "test" if index == 0 else f"test{index}"


def run_stages(recipe: Recipe, args: argparse.Namespace, src: str, tgt: str) -> None:
    """The seven stages, each skipped when its output is there."""
    r = RecipeCommand(recipe, args, src, tgt)
    refuse_data_of_another_command(r)
    data_stage(r)
    sentencepiece_stage(r)
    preprocess_stage(r)
    for index in range(1, len(r.eval_sets)):
        extra_test_set_stage(r, index)
    train_stage(r)
    if not (r.out / "curve.png").exists() and (r.out / "train.log").exists():
        write_curve(r.out, f"{recipe.name} {r.pair}, {r.arch}")
    model = model_stage(r)
    summary = [test_stage(r, index, model) for index in range(len(r.eval_sets))]
    report(r, model, summary)


def refuse_data_of_another_command(r: RecipeCommand) -> None:
    """The data, pieces and binarized data of another command are refused before anything runs."""
    kept = [("data", r.raw), ("sentencepiece", r.spm_dir), ("preprocess", r.bin_dir)]
    for k, (name, folder) in enumerate(kept):
        redo = f"delete {folders(r.out, *(later for _, later in kept[k:]), r.ckpt)} to redo them"
        r.settings.refuse_changed(name, r.made_with[name], folder, redo)


# each of stages 1-4 records its settings when it starts: a rerun after an interrupt reuses what the stage had
# made (the splits written, the sentencepiece model), and so must be the same command


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
        r.timed("preprocess", run, cmd)


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
        _remove(*r.raw.glob(f"{extra.name}.*"), *r.spm_dir.glob(f"{extra.name}.*"))
        _remove(*r.bin_dir.glob(f"{subset}.*"), *_outputs(r.out, extra.name))
    if not stage(f"3/7 {extra.name}: normalize, encode, fairseq-preprocess as {subset}", made):
        return
    r.settings.record(name, now)
    _remove(*_outputs(r.out, extra.name))  # (any made from files of an earlier record)
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
    run(cmd)
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
    fastest, notes = training.fastest_flags(r.arch, train_args, args.precision, torch.cuda.is_available())
    separate = r.recipe.share_embeddings and args.separate_embeddings
    model_flags, model_notes = training.embedding_flags(r.arch, train_args, r.recipe.share_embeddings, separate)
    update_budget = args.update_budget
    if update_budget is None and args.time_budget is None:
        update_budget = r.recipe.update_budget
    for note in [*notes, *model_notes, training.length_note(args.time_budget, update_budget, r.recipe.update_budget)]:
        print(f"   {note}")
    budget = args.time_budget is not None or bool(update_budget)
    if budget and training.given_value(train_args, "--max-epoch") not in (None, "0"):
        print("   warning: --max-epoch in --train-args can end training before the budget, unannealed")
    cmd = train_command() + [
        r.bin_dir, "--user-dir", USER_DIR, "--arch", r.recipe.arch, "--source-lang", r.src, "--target-lang", r.tgt,
        *r.recipe.train_flags, *training.optimization_flags(args.time_budget, update_budget or None), *fastest,
        *model_flags,
        "--save-dir", ckpt, "--keep-last-epochs", max(args.average_last, 1),
        "--skip-invalid-size-inputs-valid-test", "--log-format", "simple", "--log-interval", "100",
        "--seed", "1", *device_flags(), *train_args,
    ]  # fmt: skip
    r.settings.record("train", r.made_with["train"])  # (at the start: an interrupted training resumes as it)
    log = r.out / "train.log"
    resuming = (ckpt / "checkpoint_last.pt").exists()
    if log.exists() and not resuming:  # a model trained anew: the curve and compare.py read its log alone
        earlier = _unused(log)
        log.rename(earlier)
        print(f"   the earlier model's training log kept as {earlier.name}")
    r.timed("train", run, cmd, log=log, append=resuming)
    (ckpt / "train.done").touch()
    # a new model: the average and the outputs of an earlier model are stale (this is how "train longer" works:
    # delete checkpoints/train.done and run again with a larger budget)
    _remove(ckpt / "checkpoint_avg.pt", ckpt / "chosen.txt", r.out / "curve.png", *_outputs(r.out))
    r.settings.forget("average", "generate")


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
        _remove(r.ckpt / "checkpoint_avg.pt", r.ckpt / "chosen.txt", *_outputs(r.out))
        r.settings.forget("average", "generate")
    fresh = not (r.ckpt / ("chosen.txt" if r.args.checkpoint == "auto" else "checkpoint_avg.pt")).exists()
    model = average_and_choose(r.args, r.ckpt, r.bin_dir, r.src, r.tgt)
    if fresh:
        r.settings.record("average", r.made_with["average"])
    return model


def test_stage(r: RecipeCommand, index: int, model: Path) -> str:
    """Stages 6 and 7 on ``eval_sets[index]``: its translations and score; returns the score's summary line."""
    if index == 0:  # (once, before the first set)
        difference = r.settings.difference("generate", r.made_with["generate"])
        if difference is not None:
            print(f"   {difference}: generating again")
            _remove(*_outputs(r.out))
            r.settings.forget("generate")
    eval_set, args = r.eval_sets[index], r.args
    # file names carry the checkpoint, so --checkpoint best after --checkpoint avg generates again
    tag = f"{eval_set.name}.{args.checkpoint}"
    generated, hyp_file, score_file = r.out / f"generate-{tag}.txt", r.out / f"{tag}.hyp", r.out / f"score-{tag}.txt"
    if stage(f"6/7 fairseq-generate --beam 5 on {eval_set.name} ({model.name})", generated):
        cmd = fairseq("generate") + [
            r.bin_dir, "--user-dir", USER_DIR, "--path", model, "--source-lang", r.src, "--target-lang", r.tgt,
            "--gen-subset", r.subset(index), "--beam", "5", "--min-len", eval_set.min_len, "--batch-size", "64",
            "--remove-bpe", "sentencepiece",
            "--required-batch-size-multiple", "1",  # else fairseq may drop the last sentences (issue 5036)
            *r.recipe.generate_flags, *device_flags(), *shlex.split(args.generate_args),
        ]  # fmt: skip
        # the per-sentence S-/T-/H-/D-/P- lines go to the file only
        partial = generated.with_name(generated.name + ".partial")
        r.timed(f"generate {eval_set.name}", run, cmd, log=partial, quiet=("S-", "T-", "H-", "D-", "P-"))
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


def stage_settings(args: argparse.Namespace, src: str, tgt: str, arch: str) -> Dict[str, Dict]:
    """What each stage's output depends on (recorded in OUT/settings.json): its own settings and those of the
    stages before it."""
    raw_from = str(args.raw_dir.resolve()) if args.raw_dir else "download"
    made_with = {"data": {"raw_dir": raw_from, "max_train_lines": args.max_train_lines}}
    made_with["sentencepiece"] = {**made_with["data"], "vocab_size": args.vocab_size}
    made_with["preprocess"] = {**made_with["sentencepiece"], "pair": f"{src}-{tgt}"}
    made_with["train"] = {
        **made_with["preprocess"],
        "arch": arch,
        **{key: getattr(args, key, None) for key in ("train_args", "time_budget", "update_budget", "precision")},
        "separate_embeddings": getattr(args, "separate_embeddings", False),
    }
    made_with["average"] = {**made_with["train"], "average_last": args.average_last}
    tested = made_with["average"] if args.checkpoint in ("avg", "auto") else made_with["train"]
    made_with["generate"] = {**tested, "generate_args": args.generate_args}
    return made_with


def _outputs(out: Path, name: str = "*") -> List[Path]:
    """The generation outputs and scores in ``out`` of the test set ``name`` (default: every set), every model."""
    return [*out.glob(f"generate-{name}.*.txt"), *out.glob(f"{name}.*.hyp"), *out.glob(f"score-{name}.*.txt")]


def _remove(*paths: Path) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


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


def average_and_choose(args, ckpt: Path, bin_dir: Path, src: str, tgt: str) -> Path:
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
        result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
        if result.returncode != 0:  # its own words say why, then the one line that names the command
            sys.stderr.write(result.stdout[-3000:] + result.stderr[-3000:])
            raise failure(cmd, result.returncode, None)
        return final_model.validation_loss(result.stdout + result.stderr)

    choice = final_model.choose(averaged if len(inputs) > 1 else None, best, validate, inputs)
    print(f"   testing {choice.reason}")
    chosen.write_text(f"{choice.path.name}\t{choice.reason}\n", encoding="utf-8")
    return choice.path


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
        n = text.write_normalized_pairs(pairs, raw / f"{split}.{a}", raw / f"{split}.{b}", recipe.fix_line)
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
    (spm_dir / "test.done").touch()


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
