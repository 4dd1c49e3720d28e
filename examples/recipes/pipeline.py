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
                    (under --time-budget, annealed to its end; on a CPU after a trial    -> OUT/trial.log
                    that chooses the batch and dropout); the validation curve            -> OUT/curve.{tsv,png}
  5 average         average checkpoints from the end of training; keep it if it validates
                    better than checkpoint_best.pt                                      -> checkpoint_avg.pt
  6 generate        fairseq-generate --beam 5 on each test set, detokenized              -> OUT/<test>.hyp
  7 score           sacrebleu (with its signature) or ROUGE-1/2/L                        -> OUT/score-<test>.txt

Stages 1-3 are ``data_stages.py``, 4-7 ``model_stages.py``; ``commands.py`` runs their commands.
"""

import argparse
import math
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recipes import training  # noqa: E402
from recipes.commands import OutLock, alone_in, errors_in_one_line  # noqa: E402
from recipes.data_stages import (  # noqa: E402
    data_stage,
    extra_test_set_stage,
    preprocess_stage,
    refuse_data_of_another_command,
    sentencepiece_stage,
)
from recipes.model_stages import AVERAGE_TAIL, model_stage, report, test_stage, train_stage, write_curve  # noqa: E402
from recipes.settings import RunSettings  # noqa: E402


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
        self.settings = RunSettings(self.out)  # (read again by run_stages once it holds OUT's lock)
        self.made_with = stage_settings(self.args, self.src, self.tgt, self.arch)
        self.timings: Dict[str, float] = {}
        self.lock = OutLock()  # (the lock on OUT, once run_stages holds it: each command started holds it too)

    def timed(self, name: str, fn: Callable, *fn_args, **fn_kwargs) -> None:
        started = time.time()
        fn(*fn_args, **fn_kwargs)
        self.timings[name] = time.time() - started

    def subset(self, index: int) -> str:
        """fairseq's name for the test set ``eval_sets[index]``: test, test1, ..."""
        return "test" if index == 0 else f"test{index}"


def run_stages(recipe: Recipe, args: argparse.Namespace, src: str, tgt: str) -> None:
    """The seven stages, each skipped when its output is there; one command at a time in an --out."""
    r = RecipeCommand(recipe, args, src, tgt)
    with alone_in(r.out) as r.lock:
        r.settings = RunSettings(r.out)  # (as the last command into it left them)
        _run_stages(r)


def _run_stages(r: RecipeCommand) -> None:
    """The stages, in order, of a command that holds its --out."""
    recipe = r.recipe
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
