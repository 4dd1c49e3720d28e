"""Fine-tune a token-level ConvS2S checkpoint with ``--criterion sequence_risk`` and report BLEU before and after,
against continued token-level training from the same checkpoint.

    python examples/sequence_risk/finetune.py DATA_BIN CHECKPOINT --out outputs/risk --max-update 100

Runs, each from CHECKPOINT with a fresh optimizer (``--finetune-from-model``):

- ``risk``: ``--criterion sequence_risk`` for --max-update updates;
- ``token``: ``--criterion label_smoothed_cross_entropy`` for the same number of updates (same batches);
- ``token-time`` (unless ``--no-time-matched``): token-level training for as many seconds as ``risk`` took
  (``--stop-time-hours``), so the baseline gets the risk run's compute, not just its updates.

Every model, CHECKPOINT included, is scored by ``fairseq-generate --beam 5 --scoring sacrebleu`` on
``--gen-subset`` (BLEU on detokenized text: the sub-words are joined with the post-processing that the target
dictionary calls for, sentencepiece or BPE, or ``--post-process``). The model flags come from the checkpoint, so
only paths are needed. Everything lands in --out; ``results.md`` holds the table and the commands.
"""

import argparse
import dataclasses
import json
import re
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

USER_DIR = Path(__file__).resolve().parent.parent.parent / "fairseq_convs2s"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recipes.commands import CommandFailed, errors_in_one_line, failure, fairseq  # noqa: E402
from recipes.pipeline import count, out_dir  # noqa: E402
from recipes.settings import SettingsChanged  # noqa: E402


def command_flags(command: str) -> Dict[str, str]:
    """A recorded fairseq-train command's flags with their values (the words up to the next flag; "" for a switch);
    the data folder (the words before the first flag, less the module's name) as ``data``."""
    values: Dict[str, List[str]] = {"data": []}
    flag = "data"
    for word in command.split():
        if word.startswith("--"):
            flag = word
            values.setdefault(flag, [])
        elif not (flag == "data" and word.startswith("fairseq_cli.")):
            values[flag].append(word)
    return {flag: " ".join(words) for flag, words in values.items()}


def command_difference(before: str, now: str) -> str:
    """How two recorded fairseq-train commands differ, flag by flag (``--risk-alpha 0.3, this command 0.5``); ""
    when they do not (:func:`command_flags`)."""
    old, new = command_flags(before), command_flags(now)
    differences = []
    for flag in [*old, *(f for f in new if f not in old)]:
        if old.get(flag) != new.get(flag):
            shown = [("not given" if f.get(flag) is None else f.get(flag) or "set") for f in (old, new)]
            differences.append(f"{flag} {shown[0]}, this command {shown[1]}")
    return "; ".join(differences)


def checkpoint_settings(checkpoint: Path) -> Tuple[List[str], Optional[Tuple[str, str]]]:
    """``--arch`` and the model flags a checkpoint was trained with, so fairseq-train rebuilds the same model, and
    the (source, target) languages it recorded (fairseq-train's --source-lang and --target-lang; None where it did
    not record both: a data-bin binarized de-en trains en -> de too, so its names do not tell). ValueError when the
    file is no fairseq checkpoint (the plugin's message: truncated, not torch, ...)."""
    from fairseq import checkpoint_utils

    import fairseq_convs2s  # noqa: F401  (lets torch's safe unpickler read fairseq's checkpoints)
    from fairseq_convs2s.compat.broken_checkpoints import BrokenCheckpoint
    from fairseq_convs2s.models.config import ConvS2SConfig

    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))
    except BrokenCheckpoint as e:
        raise ValueError(str(e)) from None

    def section(name: str) -> dict:
        found = state["cfg"].get(name) or {}
        return vars(found) if isinstance(found, Namespace) else dict(found)

    values = section("model")
    flags = ["--arch", str(values["arch"])]
    # every model flag (config.py) but the embedding files, whose vectors the checkpoint's weights replace
    skipped = {"encoder_embed_path", "decoder_embed_path"}
    names = [f.name for f in dataclasses.fields(ConvS2SConfig) if not f.name.startswith("_") and f.name not in skipped]
    for name in (*names, "max_source_positions", "max_target_positions"):  # (and the task's position limits)
        value = values.get(name)
        if value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    task = section("task")
    source, target = task.get("source_lang"), task.get("target_lang")
    return flags, ((str(source), str(target)) if source and target else None)


def subword_post_process(data: Path, target_lang: str) -> str:
    """'sentencepiece', 'subword_nmt' or 'none', from the pieces in the target dictionary (the criterion's own
    check, so the scores and the criterion's costs join sub-words the same way)."""
    from fairseq.data import Dictionary

    from fairseq_convs2s.criterions.risk_config import subword_marker

    marker = subword_marker(Dictionary.load(str(data / f"dict.{target_lang}.txt")))
    return marker[2] if marker is not None else "none"


def language_pair(data: Path):
    """(source, target) from the data-bin's ``dict.<lang>.txt`` and ``train.<src>-<tgt>.<lang>.bin`` names;
    ValueError when it holds none."""
    for path in sorted(data.glob("*.bin")):
        m = re.match(r"^\w+\.([^.-]+)-([^.-]+)\.([^.]+)\.bin$", path.name)
        if m:
            return m.group(1), m.group(2)
    raise ValueError(f"{data}: no binarized split found (expected e.g. train.de-en.de.bin)")


def run(cmd: List[str], log: Path) -> str:
    """Run a command with its output in ``log`` and return that output; when it fails, print the log's tail and
    raise :class:`CommandFailed` (on an interrupt ``subprocess.run`` ends the command too)."""
    printable = " ".join(cmd[2:] if cmd[0] == sys.executable else cmd)
    print(f"$ {printable}", flush=True)
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, text=True)
    text = log.read_text()
    if proc.returncode != 0:
        print(text[-3000:], file=sys.stderr)
        raise failure(cmd, proc.returncode, log)
    return text


def bleu(args, checkpoint: Path, post_process: str, extra: List[str], log: Path) -> str:
    """fairseq-generate's sacrebleu line for ``checkpoint`` on --gen-subset: 'BLEU = 96.93 99.7/... (BP = ...)';
    ``extra``: the languages and the device."""
    cmd = [
        *fairseq("generate"), str(args.data), "--user-dir", str(USER_DIR), "--path", str(checkpoint),
        "--gen-subset", args.gen_subset, "--beam", "5", "--batch-size", "64", "--required-batch-size-multiple", "1",
        "--max-len-a", str(args.max_len_a), "--max-len-b", str(args.max_len_b),
        "--scoring", "sacrebleu", "--post-process", post_process, "--quiet", *extra,
    ]  # fmt: skip
    m = re.search(r"(BLEU = [0-9.]+ [0-9./]+ \(BP = [0-9.]+ ratio = [0-9.]+)", run(cmd, log))
    if not m:
        raise CommandFailed(f"fairseq-generate printed no BLEU line (its output is in {log})")
    return m.group(1) + ")"


def previous_training_time(checkpoint: Path) -> float:
    """The training seconds a checkpoint has behind it (fairseq's --stop-time-hours counts them too)."""
    from fairseq import checkpoint_utils

    import fairseq_convs2s  # noqa: F401

    state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))
    return float((state.get("extra_state") or {}).get("previous_training_time", 0.0))


def existing_file(text: str) -> Path:
    """argparse's type for the checkpoint: a missing one is a usage error, not a traceback from torch.load."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file {text}")
    return path


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="fairseq-preprocess output folder")
    parser.add_argument("checkpoint", type=existing_file, help="the token-level checkpoint to start from")
    parser.add_argument("--out", type=out_dir, required=True)
    # (counts: fairseq reads --max-update 0 as no limit, and trained until stopped)
    parser.add_argument("--max-update", type=count, default=100, help="updates of the risk and token runs")
    parser.add_argument("--max-tokens", type=count, default=1000, help="batch size of both (sources + targets)")
    parser.add_argument("--lr", type=float, default=0.05, help="NAG learning rate of both fine-tuning runs")
    parser.add_argument("--risk-candidates", type=count, default=8)
    parser.add_argument("--risk-alpha", type=float, default=0.3)
    parser.add_argument("--risk-include-reference", action="store_true")
    parser.add_argument("--gen-subset", default="test")
    # the limits fairseq's translation examples give --eval-bleu, and the criterion's candidates' defaults
    parser.add_argument("--max-len-a", type=float, default=1.2, help="generation length limit a * source + b")
    parser.add_argument("--max-len-b", type=int, default=10)
    parser.add_argument("--post-process", default=None, help="sentencepiece, subword_nmt or none (default: from dict)")
    parser.add_argument("--no-time-matched", action="store_true", help="skip the token-level run of equal time")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    try:  # (a folder or file these cannot read is a usage error, as a missing one is)
        pair = language_pair(args.data)
    except ValueError as e:
        parser.error(f"argument data: {e}")
    try:
        model_flags, recorded_pair = checkpoint_settings(args.checkpoint)
    except ValueError as e:
        parser.error(f"argument checkpoint: {e}")
    with errors_in_one_line("finetune.py"):
        fine_tune(args, recorded_pair or pair, model_flags)


def fine_tune(args, pair, model_flags: List[str]) -> None:
    """Score the start, train each run not done yet, score each, write ``results.{json,md}``."""
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    device = [] if torch.cuda.is_available() else ["--cpu"]
    src, tgt = pair
    languages = ["--source-lang", src, "--target-lang", tgt]
    generate_flags = [*languages, *device]  # (without the languages, generate reads them from the data's names)
    post_process = args.post_process or subword_post_process(args.data, tgt)
    common = [
        *fairseq("train"), str(args.data), "--user-dir", str(USER_DIR), *languages,
        *model_flags, "--finetune-from-model", str(args.checkpoint.resolve()),
        "--optimizer", "nag", "--momentum", "0.99", "--lr", str(args.lr), "--clip-norm", "0.1",
        "--label-smoothing", "0.1", "--max-tokens", str(args.max_tokens), "--seed", str(args.seed),
        "--no-epoch-checkpoints", "--disable-validation", "--log-format", "simple", "--log-interval", "10", *device,
    ]  # fmt: skip
    runs = {
        "risk": [
            "--criterion", "sequence_risk", "--risk-candidates", str(args.risk_candidates),
            "--risk-alpha", str(args.risk_alpha), "--risk-post-process", post_process,
            "--risk-max-len-a", str(args.max_len_a), "--risk-max-len-b", str(args.max_len_b),
            *(["--risk-include-reference"] if args.risk_include_reference else []),
            "--max-update", str(args.max_update),
        ],
        "token": ["--criterion", "label_smoothed_cross_entropy", "--max-update", str(args.max_update)],
        # as many seconds of training as the risk run took, however many updates that is: --stop-time-hours
        # counts the checkpoint's own training time too, so the limit is the risk checkpoint's total
        "token-time": ["--criterion", "label_smoothed_cross_entropy", "--max-update", "1000000000"],
    }  # fmt: skip
    if args.no_time_matched:
        del runs["token-time"]

    # a second call with the same --out reuses the finished runs (their checkpoint and timing) and re-scores all;
    # a run that another command trained is refused, before anything runs, not reported as this command's
    saved = args.out / "runs.json"
    done: Dict[str, dict] = json.loads(saved.read_text()) if saved.exists() else {}

    def command(name: str) -> List[str]:
        flags = runs[name]
        if name == "token-time":  # (as long as the risk run took: known once that has trained)
            total = previous_training_time(args.out / "risk" / "checkpoint_last.pt")
            flags = flags + ["--stop-time-hours", f"{total / 3600:.6f}"]
        return [*common, *flags, "--save-dir", str(args.out / name)]

    finished = [name for name in runs if name in done and (args.out / name / "checkpoint_last.pt").exists()]
    for name in finished:
        difference = command_difference(done[name]["command"], " ".join(command(name)[2:]))
        if difference:
            raise SettingsChanged(
                f"{args.out / name} was trained by another command ({difference}): give this command its own "
                f"--out, or delete {args.out / name} to train it again"
            )
    # how every model was scored (summarize.py puts only runs scored alike side by side)
    scored = {
        "gen_subset": args.gen_subset,
        "max_len_a": args.max_len_a,
        "max_len_b": args.max_len_b,
        "post_process": post_process,
    }
    results = {
        "scored": scored,
        "start": {"bleu": bleu(args, args.checkpoint, post_process, generate_flags, args.out / "gen_start.log")},
    }
    print(f"   before fine-tuning: {results['start']['bleu']}", flush=True)
    for name in runs:
        save_dir = args.out / name
        if name not in finished:
            cmd = command(name)
            started = time.time()
            log = run(cmd, args.out / f"train_{name}.log")
            updates = re.findall(r"num_updates[ =:\"]+(\d+)", log)
            done[name] = {
                "seconds": round(time.time() - started, 1),
                "updates": int(updates[-1]) if updates else None,
                "command": " ".join(cmd[2:]),
            }
            saved.write_text(json.dumps(done, indent=2))
        score = bleu(args, save_dir / "checkpoint_last.pt", post_process, generate_flags, args.out / f"gen_{name}.log")
        results[name] = {**done[name], "bleu": score}
        print(f"   {name}: {score} after {done[name]['updates']} updates, {done[name]['seconds']} s", flush=True)

    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    lines = [
        f"`{args.gen_subset}`, beam 5, --max-len-a {args.max_len_a} --max-len-b {args.max_len_b}, sacrebleu "
        f"(post-process {post_process}); fine-tuned from `{args.checkpoint}`:",
        "",
        "| model | updates | seconds (wall, whole fairseq-train) | BLEU |",
        "|---|---|---|---|",
        f"| start: the token-level checkpoint | - | - | {results['start']['bleu']} |",
    ]
    for name in (n for n in runs if n in results):
        r = results[name]
        lines.append(f"| + {name} | {r['updates']} | {r['seconds']} | {r['bleu']} |")
    lines += ["", "Commands:", ""] + [f"    {name}: {results[name]['command']}" for name in runs]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
