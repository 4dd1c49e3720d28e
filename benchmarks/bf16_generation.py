"""Beam search with the convs2s model in bf16 (``fairseq-generate --bf16``) against the same model in fp32.

    python -m benchmarks.bf16_generation [--sizes iwslt,wmt_en_de] [--batches 1,16,128] [--beam 5] [--repeats 5]
    python -m benchmarks.bf16_generation --data DATA_BIN --path CHECKPOINT [--batches 16,128] [--repeats 3]
        [--generate-args "--remove-bpe sentencepiece --scoring sacrebleu"]

The harness's convs2s model (``benchmarks.pair``, random weights) prepared as fairseq-generate prepares it, once
as it is and once with ``--bf16`` (``ConvS2SModel.prepare_for_inference_``: weight norm folded in fp32, then
every weight rounded to bf16); both decode the same random sources with every hypothesis forced to ``--src-len``
tokens, so they do the same steps; their timings alternate (``measure.alternate``, medians). Prints sentences/s
of each and the ratio, and writes ``bf16_generation_<device>.json`` into ``--out``. Random weights say nothing of
translation quality: for that, ``--data`` and ``--path`` name a trained model, and ``fairseq-generate`` decodes
its test set with and without ``--bf16``, in turn, ``--repeats`` times each in fresh processes; printed: its
sentences/s (its own "Translated" line; medians), BLEU, and how many hypotheses bf16 changed.
"""

import argparse
import copy
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Sequence

import torch
from omegaconf import OmegaConf

from . import measure
from .arguments import checkpoint_file, data_bin, device_name, positive_int, positive_ints, size_names
from .bf16_curve import USER_DIR
from .pair import SIZES, build_pair, make_dictionary
from .run import RESULTS


def prepared(model, beam: int, bf16: bool):
    """A copy of ``model`` as fairseq-generate prepares it with ``--beam beam`` (``--bf16`` if ``bf16``)."""
    cfg = OmegaConf.create({"common": {"bf16": bf16}, "generation": {"beam": beam, "print_alignment": False}})
    model = copy.deepcopy(model).eval()
    model.prepare_for_inference_(cfg)
    return model


def harness_models(size_name: str, beam: int, device):
    """The harness's convs2s model at ``size_name`` (random weights, no dropout), its dictionary, and copies of it
    prepared for generation in fp32 and with ``--bf16``: (dictionary, model, {"fp32": ..., "bf16": ...})."""
    dictionary = make_dictionary(SIZES[size_name].vocab)
    convs2s = build_pair(SIZES[size_name], dictionary, dropout=0.0)[1].to(device)
    return dictionary, convs2s, {"fp32": prepared(convs2s, beam, False), "bf16": prepared(convs2s, beam, True)}


def compare(size_name: str, batches: List[int], beam: int, repeats: int, src_len: int, device) -> List[Dict]:
    """fp32 against bf16 beam search of the harness's convs2s model at ``size_name``, at each of ``batches``."""
    dictionary, _, models = harness_models(size_name, beam, device)
    rows = []
    for batch in batches:
        row = {"size": size_name, **beam_speeds(models, dictionary, batch, beam, repeats, src_len, device)}
        row["bf16_over_fp32"] = row["bf16_sentences_per_s"] / row["fp32_sentences_per_s"]
        print(
            f"{size_name} beam {beam} batch {batch}: fp32 {row['fp32_sentences_per_s']:.1f} "
            f"bf16 {row['bf16_sentences_per_s']:.1f} sent/s = {row['bf16_over_fp32']:.2f}x",
            flush=True,
        )
        rows.append(row)
    return rows


def beam_speeds(models: Dict, dictionary, batch: int, beam: int, repeats: int, src_len: int, device) -> Dict:
    """Beam search of each of ``models`` over the same random sources (at least 16) in batches of ``batch``,
    every hypothesis forced to ``src_len`` tokens, timings alternated: ``<name>_sentences_per_s`` (medians)."""
    sentences = max(batch, 16)
    samples = measure.source_batches(dictionary, sentences, src_len, batch, device)
    runs = {name: measure.generator_fn(m, dictionary, samples, beam, src_len)[0] for name, m in models.items()}
    times = measure.alternate(runs, repeats, warmup=1, device=device)
    row = {"beam": beam, "batch": batch, "sentences": sentences, "repeats": repeats}
    row.update({f"{name}_sentences_per_s": sentences / measure.median(times[name]) for name in models})
    return row


_SPEED = re.compile(r"Translated [0-9,]+ sentences .* \(([0-9.]+) sentences/s")
_BLEU = re.compile(r"BLEU4? = ([0-9.]+)")


def generate_once(
    data: str,
    path: str,
    batch: int,
    beam: int,
    bf16: bool,
    extra: List[str],
    device,
    entry: Sequence[str] = ("-m", "fairseq_cli.generate"),
) -> Dict:
    """One ``fairseq-generate`` of ``data``'s test set: its sentences/s, BLEU and hypotheses (by sentence id).
    ``entry``: how the Python interpreter is to run it (another module that runs fairseq-generate in itself)."""
    cmd = [sys.executable, *entry, data, "--user-dir", str(USER_DIR), "--path", path]
    cmd += ["--beam", str(beam), "--batch-size", str(batch), "--required-batch-size-multiple", "1", *extra]
    cmd += (["--bf16"] if bf16 else []) + (["--cpu"] if device.type == "cpu" else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    speed, bleu = _SPEED.search(out), _BLEU.search(out)
    if proc.returncode or not speed or not bleu:
        raise SystemExit(f"{shlex.join(cmd)} failed (exit {proc.returncode}):\n{out[-3000:]}")
    hyps = {}
    for line in proc.stdout.splitlines():
        if line.startswith("H-"):  # H-<id> TAB score TAB tokens
            sentence_id, _, tokens = line[2:].split("\t", 2)
            hyps[sentence_id] = tokens
    return {"sentences_per_s": float(speed.group(1)), "bleu": float(bleu.group(1)), "hyps": hyps}


def compare_trained(args, batches: List[int], device) -> List[Dict]:
    """fp32 against bf16 ``fairseq-generate`` of a trained model, at each of ``batches``."""
    extra = shlex.split(args.generate_args)
    rows = []
    for batch in batches:
        runs: Dict[str, List[Dict]] = {"fp32": [], "bf16": []}
        for i in range(args.repeats):
            for name in ("fp32", "bf16") if i % 2 == 0 else ("bf16", "fp32"):
                runs[name].append(generate_once(args.data, args.path, batch, args.beam, name == "bf16", extra, device))
        row = {"checkpoint": args.path, "beam": args.beam, "batch": batch, "repeats": args.repeats}
        for name, results in runs.items():
            row[f"{name}_sentences_per_s"] = measure.median([r["sentences_per_s"] for r in results])
            row[f"{name}_bleu"] = results[0]["bleu"]
        row["bf16_over_fp32"] = row["bf16_sentences_per_s"] / row["fp32_sentences_per_s"]
        fp32_hyps, bf16_hyps = runs["fp32"][0]["hyps"], runs["bf16"][0]["hyps"]
        row["sentences"] = len(fp32_hyps)
        row["changed_by_bf16"] = sum(bf16_hyps.get(i) != h for i, h in fp32_hyps.items())
        print(
            f"beam {args.beam} batch {batch}: fp32 {row['fp32_sentences_per_s']:.1f} bf16 "
            f"{row['bf16_sentences_per_s']:.1f} sent/s = {row['bf16_over_fp32']:.2f}x; BLEU fp32 "
            f"{row['fp32_bleu']:.2f} bf16 {row['bf16_bleu']:.2f}; bf16 changed {row['changed_by_bf16']} of "
            f"{row['sentences']} hypotheses",
            flush=True,
        )
        rows.append(row)
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=size_names, default="iwslt,wmt_en_de", help=f"comma-separated, of {sorted(SIZES)}")
    p.add_argument("--batches", type=positive_ints, default="1,16,128", help="comma-separated batch sizes")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--repeats", type=positive_int, default=5, help="timed repeats per configuration (medians)")
    p.add_argument("--src-len", type=int, default=25, help="source tokens per sentence; outputs are as long")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--device", type=device_name, default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--out", default=str(RESULTS), help="folder for bf16_generation[_trained]_<device>.json")
    p.add_argument("--data", type=data_bin, help="a data-bin folder: decode its test set with the trained model --path")
    p.add_argument("--path", type=checkpoint_file, help="a convs2s checkpoint, with --data")
    p.add_argument("--generate-args", default="", help="more fairseq-generate flags, with --data (one flag: use =)")
    args = p.parse_args(argv)
    if bool(args.data) != bool(args.path):
        p.error("--data and --path go together")
    measure.use_threads(args.threads)
    device = torch.device(args.device)
    machine = measure.describe_machine(device)
    print(machine, flush=True)
    batches = [int(b) for b in args.batches.split(",")]
    if args.data:
        rows = compare_trained(args, batches, device)
    else:
        rows = []
        for size_name in args.sizes.split(","):
            rows += compare(size_name, batches, args.beam, args.repeats, args.src_len, device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"bf16_generation{'_trained' if args.data else ''}_{args.device}.json"
    path.write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
