"""fconv vs convs2s, side by side, in one run: ``python -m benchmarks.run [--quick] [--device cuda]``.

Both models have the same architecture and the same weights (stock fconv, then the converter), see the same
inputs, and are timed alternately (warm-up first, medians of the repeats); on a CPU the fp32 training rows are
timed again with each model in a fresh process of its own (``--alone-rounds``, ``benchmarks.alone``). Writes
``benchmarks/results/<device>.json``, ``benchmarks/results/scaling_<device>.png`` and the tables in
``BENCHMARKS.md`` (between that device's markers); ``--quick`` writes ``<device>_quick.json`` and
``scaling_<device>_quick.png`` and leaves BENCHMARKS.md alone unless ``--markdown`` names a file.
"""

import argparse
import copy
import gc
import json
import time
from pathlib import Path
from typing import Dict, List, Tuple

import torch

from fairseq_convs2s.train import keep_freed_memory

from . import alone, measure
from .arguments import device_name, positive_int, size_names
from .pair import SIZES, build_pair, make_dictionary
from .report import FUSED, plot_path, write_markdown, write_plot

RESULTS = Path(__file__).resolve().parent / "results"
IMPLS = ("fconv", "convs2s")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", type=device_name, default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--quick", action="store_true", help="a small grid (minutes) to check the harness")
    p.add_argument("--sizes", type=size_names, default="iwslt,wmt_en_de", help=f"comma-separated, of {sorted(SIZES)}")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed repeats per configuration (medians)")
    p.add_argument("--src-len", type=int, default=25, help="source tokens per sentence; outputs are as long")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--out", default=str(RESULTS), help="folder for the JSON and the plot")
    p.add_argument(
        "--markdown",
        help="file whose tables are rewritten (default BENCHMARKS.md; with --quick none; '' for none)",
    )
    p.add_argument(
        "--split",
        type=_split_cells,
        metavar="SIZE:BATCH,...",
        help="only the time split of beam-5 generation (and its bound) for these cells, e.g. wmt_en_de:128; "
        "printed and written to split_<device>.json, BENCHMARKS.md left alone",
    )
    add_alone_flags(p)
    measure.add_malloc_flag(p)
    p.add_argument("--memory-worker", nargs=2, metavar=("IMPL", "SIZE"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def add_alone_flags(p) -> None:
    """``--alone-rounds`` and ``--alone-updates``, which :func:`training` reads (``benchmarks.training_rows`` too)."""
    p.add_argument(
        "--alone-rounds",
        type=int,
        default=3,
        help="CPU fp32 training: rounds of one fresh process per model (benchmarks.alone), as one fairseq-train "
        "runs a single model; 0 for none",
    )
    p.add_argument("--alone-updates", type=int, default=5, help="timed updates per such process (their median)")


def describe_run(args, device) -> Dict:
    """The machine, and the malloc setting ``--keep-freed-memory`` asked for (applied here, before any timing)."""
    machine = measure.describe_machine(device)
    machine["freed_memory_kept"] = bool(args.keep_freed_memory) and keep_freed_memory()
    if args.keep_freed_memory and not machine["freed_memory_kept"]:
        log("--keep-freed-memory: not applied (not glibc, or MALLOC_MMAP_MAX_/MALLOC_TRIM_THRESHOLD_ set)")
    return machine


def _split_cells(text: str) -> List[Tuple[str, int]]:
    """``--split``'s cells: SIZE:BATCH pairs, SIZE one of the harness's sizes."""
    cells = []
    for cell in text.split(","):
        size, _, batch = cell.partition(":")
        if size not in SIZES or not batch.isdigit() or int(batch) < 1:
            raise argparse.ArgumentTypeError(f"{cell!r}: expected SIZE:BATCH with SIZE one of {sorted(SIZES)}")
        cells.append((size, int(batch)))
    return cells


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def generation(size_name: str, args, device) -> List[Dict]:
    """sentences/s and tokens/s for beam 1 and 5, batch 1, 16 and 128; hypotheses compared."""
    size = SIZES[size_name]
    dictionary = make_dictionary(size.vocab)
    fconv, convs2s = (m.to(device).eval() for m in build_pair(size, dictionary, dropout=0.0))
    rows = []
    for beam in (1, 5):
        models = {n: measure.prepare_for_generation(m, beam) for n, m in (("fconv", fconv), ("convs2s", convs2s))}
        for batch in (1, 16, 128):
            sentences = max(batch, 4 if args.quick else 16)
            samples = measure.source_batches(dictionary, sentences, args.src_len, batch, device)
            runs = {
                name: measure.generator_fn(m, dictionary, samples, beam, args.src_len) for name, m in models.items()
            }
            repeats = 1 if args.quick else (args.repeats if batch < 128 or size_name == "iwslt" else 3)
            times = measure.alternate({n: r[0] for n, r in runs.items()}, repeats, warmup=1, device=device)
            hyps = {n: r[1]["hyps"] for n, r in runs.items()}
            tokens = sum(len(h) for h in hyps["convs2s"])
            row = {"size": size_name, "beam": beam, "batch": batch, "sentences": sentences, "repeats": repeats}
            for name in IMPLS:
                t = measure.median(times[name])
                row[name] = {"seconds": t, "sentences_per_s": sentences / t, "tokens_per_s": tokens / t}
            row["speedup"] = row["convs2s"]["sentences_per_s"] / row["fconv"]["sentences_per_s"]
            row["identical"] = sum(a == b for a, b in zip(hyps["fconv"], hyps["convs2s"]))
            log(
                f"generate {size_name} beam {beam} batch {batch}: fconv {row['fconv']['sentences_per_s']:.1f} "
                f"convs2s {row['convs2s']['sentences_per_s']:.1f} sent/s = {row['speedup']:.2f}x, "
                f"identical {row['identical']}/{sentences}"
            )
            rows.append(row)
    return rows


def training(size_name: str, args, device, peaks: Dict[str, float]) -> List[Dict]:
    """words/s per update, fp32 and bf16, and FLOP/s as a fraction of the measured matmul peak."""
    size = SIZES[size_name]
    dictionary = make_dictionary(size.vocab)
    sentences = 16 if args.quick else 64  # 64 x 26 target tokens, about fairseq's --max-tokens 4000 per side
    sample = measure.train_sample(dictionary, sentences, args.src_len, device)
    rows = []
    for dtype_name, dtype in training_dtypes(device):
        row: Dict = {"size": size_name, "dtype": dtype_name, "target_tokens": sample["ntokens"]}
        if dtype == torch.bfloat16 and peaks["bf16"] < 0.5 * peaks["fp32"]:
            row["skipped"] = (
                f"bf16 matmul runs at {peaks['bf16']:.1f} GFLOP/s here vs {peaks['fp32']:.0f} fp32 "
                f"(cpu capability {torch.backends.cpu.get_cpu_capability()}): not accelerated on this machine"
            )
            log(f"train {size_name} bf16 skipped: {row['skipped']}")
            rows.append(row)
            continue
        fconv, convs2s = (m.to(device) for m in build_pair(size, dictionary, dropout=0.2))
        steps = {
            n: measure.TrainStep(m, sample, dictionary.pad(), dtype)
            for n, m in (("fconv", fconv), ("convs2s", convs2s))
        }
        # convs2s again (its own copy of the same weights) with the plugin's fused loss
        steps[FUSED] = measure.TrainStep(copy.deepcopy(convs2s), sample, dictionary.pad(), dtype, fused_loss=True)
        repeats = 2 if args.quick else args.repeats
        times = measure.alternate(steps, repeats, warmup=1, device=device)
        for name in steps:
            t = measure.median(times[name])
            row[name] = {
                "seconds_per_update": t,
                "words_per_s": sample["ntokens"] / t,
                "first_loss": steps[name].losses[0],
                # clip and NAG step alone (fairseq's and torch's code on the same parameters for every model)
                "apply_gradients_s": steps[name].apply_gradients_seconds(repeats, device),
            }
            flops = measure.count_flops(steps[name].forward_backward)
            row[name]["gflop_per_update"] = flops / 1e9
            row[name]["fraction_of_peak"] = flops / t / 1e9 / peaks[dtype_name]
        row["speedup"] = row["convs2s"]["words_per_s"] / row["fconv"]["words_per_s"]
        row["speedup_fused"] = row[FUSED]["words_per_s"] / row["fconv"]["words_per_s"]
        del fconv, convs2s, steps
        gc.collect()
        if device.type == "cpu" and dtype == torch.float32 and args.alone_rounds > 0:
            row["one_process"] = one_process(size_name, args)
        log(
            f"train {size_name} {dtype_name}: fconv {row['fconv']['words_per_s']:.0f} convs2s "
            f"{row['convs2s']['words_per_s']:.0f} words/s = {row['speedup']:.2f}x, with the fused loss "
            f"{row[FUSED]['words_per_s']:.0f} = {row['speedup_fused']:.2f}x; first loss "
            f"{row['fconv']['first_loss']:.5f} / {row['convs2s']['first_loss']:.5f} / {row[FUSED]['first_loss']:.5f}"
        )
        if "one_process" in row:
            r = row["one_process"]
            c, f = r["convs2s"], r[FUSED]
            log(
                f"train {size_name} fp32, one model per process (rounds: {r['rounds']}, timed updates each: "
                f"{r['updates']}): convs2s {c['speedup']:.2f}x fconv, with the fused loss {f['speedup']:.2f}x "
                f"(medians of the rounds' ratios {c['round_speedup_median']:.2f}x and "
                f"{f['round_speedup_median']:.2f}x)"
            )
        rows.append(row)
    return rows


# benchmarks.alone's variants under the training rows' keys
ALONE_KEYS = {"fconv": "fconv", "convs2s": "convs2s", "convs2s-fused": FUSED}


def one_process(size_name: str, args) -> Dict:
    """The training row again with each model in a fresh process of its own (``benchmarks.alone``: 64 x 26 target
    tokens, the run's malloc setting), as one ``fairseq-train`` run has it: in the alternation above each update
    meets the malloc state the other models' updates left (glibc's mmap threshold moves with what was freed
    last), which a single-model run never does. Rounds of one process per model in turn; medians over them."""
    rounds, updates = (1, 1) if args.quick else (args.alone_rounds, args.alone_updates)
    medians = alone.round_medians(size_name, rounds, updates, bool(args.keep_freed_memory), args.threads)
    variants = alone.summary(medians)
    return {"rounds": rounds, "updates": updates, **{key: variants[v] for v, key in ALONE_KEYS.items()}}


def limits(args, device, training_rows: List[Dict], peaks: Dict[str, float]) -> Dict[str, List[Dict]]:
    """Where the time goes, and the best speed-up any implementation of the model body could reach.

    Generation: the time of each model's beam-5 run split into encoder, decoder body, vocabulary projection and
    fairseq's beam search; were the convs2s body free, the speed-up would be fconv's total over the rest.
    Training: an update costs at least the vocabulary part (measured alone), the body's FLOPs at the matmul peak
    and the gradient clipping and optimizer step (measured); fconv's update time over that is the bound.
    """
    generation_rows = generation_bounds("iwslt", (1, 16, 128), args, device, peaks["fp32"])
    _, training = training_limits(args, device, training_rows, peaks)
    return {"generation": generation_rows, "training": training}


def training_limits(args, device, training_rows: List[Dict], peaks) -> Tuple[Dict[str, float], List[Dict]]:
    """The vocabulary step measured alone on the iwslt size's batch (``args.quick``: 16 sentences, else 64), and
    the bounds it puts on the training rows (:func:`training_bounds`)."""
    size = SIZES["iwslt"]
    dictionary = make_dictionary(size.vocab)
    sample = measure.train_sample(dictionary, 16 if args.quick else 64, args.src_len, device)
    vocab_s = measure.vocabulary_step_seconds(sample, size.out_embed_dim, size.vocab, dictionary.pad(), 11, device)
    return vocab_s, training_bounds(training_rows, vocab_s, sample["ntokens"], peaks)


def training_bounds(training_rows: List[Dict], vocab_s: Dict[str, float], ntokens: int, peaks) -> List[Dict]:
    """The bound on the iwslt fp32 training row: fconv's update time over the least any implementation of the
    body pays, the vocabulary step (``vocab_s``, measured alone, with fairseq's loss and in the form the fused
    criterion runs: on a CPU projection and loss in chunks, else from the logits), the body's FLOPs at the
    matmul peak, and the clip and optimizer step as measured in the row."""
    size = SIZES["iwslt"]
    bounds = []
    for r in training_rows:
        if r["size"] != "iwslt" or r["dtype"] != "fp32" or "skipped" in r:
            continue
        vocab_flops = 6 * ntokens * size.out_embed_dim * size.vocab  # forward + two backward products
        body_s = max(0.0, r["convs2s"]["gflop_per_update"] * 1e9 - vocab_flops) / (peaks["fp32"] * 1e9)
        row = {"size": "iwslt", "vocabulary_s": vocab_s["stock"], "body_at_peak_s": body_s}
        fused_form = "projected" if "projected" in vocab_s else "fused"
        row["vocabulary_fused_s"], row["vocabulary_fused_form"] = vocab_s[fused_form], fused_form
        row["apply_gradients_s"] = r["convs2s"]["apply_gradients_s"]
        row["fconv_s"] = r["fconv"]["seconds_per_update"]
        row["convs2s_s"] = r["convs2s"]["seconds_per_update"]
        row["convs2s_fused_s"] = r[FUSED]["seconds_per_update"]
        floor = body_s + row["apply_gradients_s"]
        row["bound"] = row["fconv_s"] / (vocab_s["stock"] + floor)
        row["bound_fused"] = row["fconv_s"] / (row["vocabulary_fused_s"] + floor)
        log(f"limits train: {row}")
        bounds.append(row)
    return bounds


def generation_bounds(size_name: str, batches, args, device, peak_gflops: float) -> List[Dict]:
    """Each model's beam-5 run split into encoder, decoder body, vocabulary projection and fairseq's beam search
    (medians of 3 runs), and two bounds on convs2s's speed-up: fconv's total over convs2s's all but its body
    (``bound_body_free``), and over its beam search plus the model's FLOPs at the matmul peak
    (``bound_at_peak``: what any implementation doing this arithmetic needs). ``bound`` is the lower."""
    size = SIZES[size_name]
    dictionary = make_dictionary(size.vocab)
    fconv, convs2s = (measure.prepare_for_generation(m.to(device), 5) for m in build_pair(size, dictionary, 0.0))
    rows = []
    for batch in batches:
        sentences = max(batch, 4 if args.quick else 16)
        samples = measure.source_batches(dictionary, sentences, args.src_len, batch, device)
        row: Dict = {"size": size_name, "beam": 5, "batch": batch}
        for name, model in (("fconv", fconv), ("convs2s", convs2s)):
            run, _ = measure.generator_fn(model, dictionary, samples, 5, args.src_len)
            run()  # warm-up
            splits = [measure.generation_split(model, run, device) for _ in range(3)]
            row[name] = {key: measure.median([split[key] for split in splits]) for key in splits[0]}
            row[name]["gflop"] = measure.count_flops(run) / 1e9
        c, fconv_s = row["convs2s"], row["fconv"]["total"]
        row["bound_body_free"] = fconv_s / (c["vocab_projection"] + c["beam_search"] + c["encoder"])
        row["bound_at_peak"] = fconv_s / (c["beam_search"] + c["gflop"] / peak_gflops)
        row["bound"] = min(row["bound_body_free"], row["bound_at_peak"])
        log(f"limits generate {size_name} batch {batch}: {row}")
        rows.append(row)
    return rows


def split_only(args, device) -> None:
    """``--split``: the generation split of the cells asked for, on their own."""
    results = {"machine": describe_run(args, device), "args": {"src_len": args.src_len, "split": args.split}}
    peak = measure.matmul_peak(torch.float32, device)  # the bounds' only peak (bf16's takes a minute emulated)
    results["machine"]["matmul_gflops_fp32"] = peak
    results["generation"] = [
        row for size, batch in args.split for row in generation_bounds(size, (batch,), args, device, peak)
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"split_{args.device}.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    for r in results["generation"]:
        parts = ", ".join(
            f"{impl} {r[impl]['total']:.2f} s (encoder {r[impl]['encoder']:.2f}, body {r[impl]['decoder_body']:.2f}, "
            f"vocabulary {r[impl]['vocab_projection']:.2f}, beam search {r[impl]['beam_search']:.2f})"
            for impl in IMPLS
        )
        print(
            f"{r['size']} beam 5 batch {r['batch']}: {parts}; convs2s {r['convs2s']['gflop']:.0f} GFLOP, "
            f"matmul peak {peak:.0f} GFLOP/s; bound {r['bound_body_free']:.2f}x with the body free, "
            f"{r['bound_at_peak']:.2f}x with all arithmetic at the peak"
        )
    log(f"wrote {path}")


def training_dtypes(device) -> List[Tuple[str, torch.dtype]]:
    """fp32 and bf16 everywhere; fp16 too on a GPU (the paper's and fairseq's ``--fp16`` setting)."""
    dtypes = [("fp32", torch.float32), ("bf16", torch.bfloat16)]
    return dtypes + [("fp16", torch.float16)] if device.type == "cuda" else dtypes


def matmul_peaks(device) -> Dict[str, float]:
    return {name: measure.matmul_peak(dtype, device) for name, dtype in training_dtypes(device)}


def scaling(args, device) -> Dict:
    """ms per sentence as the source grows (beam 5) and as the beam grows (25 tokens); iwslt size, batch 16."""
    size = SIZES["iwslt"]
    dictionary = make_dictionary(size.vocab)
    pair = dict(zip(IMPLS, (m.to(device).eval() for m in build_pair(size, dictionary, dropout=0.0))))
    sentences, batch = (4, 4) if args.quick else (16, 16)
    lengths = (10, 50, 200) if args.quick else (10, 25, 50, 100, 200)
    beams = (1, 12) if args.quick else (1, 2, 4, 8, 12)
    out: Dict = {"length": [], "beam": [], "batch": batch}  # the batch, for the report (--quick: 4)
    for axis, points in (("length", lengths), ("beam", beams)):
        for point in points:
            length, beam = (point, 5) if axis == "length" else (args.src_len, point)
            samples = measure.source_batches(dictionary, sentences, length, batch, device)
            models = {n: measure.prepare_for_generation(m, beam) for n, m in pair.items()}
            runs = {n: measure.generator_fn(m, dictionary, samples, beam, length)[0] for n, m in models.items()}
            times = measure.alternate(runs, 1 if args.quick else 3, warmup=1, device=device)
            row = {axis: point, **{n: 1e3 * measure.median(times[n]) / sentences for n in IMPLS}}
            log(f"scaling {axis}={point}: fconv {row['fconv']:.1f} convs2s {row['convs2s']:.1f} ms/sentence")
            out[axis].append(row)
    return out


def memory(args, device) -> List[Dict]:
    """Peak RSS (and GPU memory) of each implementation alone in a fresh process; convs2s twice, its update with
    fairseq's loss and with the fused criterion (``FUSED``: on a CPU no N x V logits stored)."""
    rows = []
    for size_name in args.sizes.split(","):
        for impl in IMPLS + (FUSED,):
            cmd = ["--device", args.device, "--src-len", str(args.src_len)]
            cmd += ["--memory-worker", impl, size_name, "--threads", str(torch.get_num_threads())]
            cmd += ["--quick"] if args.quick else []
            cmd += ["--keep-freed-memory"] if args.keep_freed_memory else []
            row = measure.fresh_process_json("benchmarks.run", cmd)
            log(f"memory {size_name} {impl}: {row}")
            rows.append(row)
    return rows


def memory_worker(args, device) -> None:
    name, size_name = args.memory_worker
    fused_loss = name == FUSED  # convs2s, its update through the fused criterion
    impl = "convs2s" if fused_loss else name
    size = SIZES[size_name]
    dictionary = make_dictionary(size.vocab)

    def load():
        models = dict(zip(IMPLS, build_pair(size, dictionary, dropout=0.0)))
        model = models.pop(impl).to(device)
        models.clear()
        gc.collect()
        return model

    model = load()
    batch = 16 if args.quick else 128
    samples = measure.source_batches(dictionary, batch, args.src_len, batch, device)
    row = {"size": size_name, "impl": name, "idle_rss_mib": measure.PeakRSS.rss_mib()}
    # prepared in place, as fairseq-generate does (no copy to count), then a fresh model to train
    prepared = measure.prepare_for_generation(model, 5, in_place=True)
    run, _ = measure.generator_fn(prepared, dictionary, samples, 5, args.src_len)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with measure.PeakRSS() as peak:
        run()
    row.update(generate_rss_mib=peak.peak_mib, generate_gpu_mib=measure.gpu_peak_mib(device))
    del model, prepared, run
    model = load()
    sample = measure.train_sample(dictionary, batch // 2, args.src_len, device)
    step = measure.TrainStep(model, sample, dictionary.pad(), fused_loss=fused_loss)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with measure.PeakRSS() as peak:
        step()
    row.update(train_rss_mib=peak.peak_mib, train_gpu_mib=measure.gpu_peak_mib(device))
    print(json.dumps(row))


def main(argv=None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    measure.use_threads(args.threads)
    if args.memory_worker:
        if args.keep_freed_memory:
            keep_freed_memory()
        memory_worker(args, device)
        return
    if args.split:
        split_only(args, device)
        return
    started = time.time()
    machine = describe_run(args, device)
    peaks = matmul_peaks(device)
    log(f"machine: {machine}")
    results: Dict = {"machine": machine, "args": {k: v for k, v in vars(args).items() if k != "memory_worker"}}
    results["generation"] = [row for s in args.sizes.split(",") for row in generation(s, args, device)]
    # measured again next to the training runs, the best of both kept: a slow spell of the shared machine can
    # only lower a measurement, and a low peak would overstate the fraction of it an update reaches
    again = matmul_peaks(device)
    peaks = {dtype: max(gflops, again[dtype]) for dtype, gflops in peaks.items()}
    machine["matmul_gflops"] = peaks
    log(f"matmul peaks: {peaks}")
    results["training"] = [row for s in args.sizes.split(",") for row in training(s, args, device, peaks)]
    results["limits"] = limits(args, device, results["training"], peaks)
    results["scaling"] = scaling(args, device)
    results["memory"] = memory(args, device)
    results["wall_s"] = time.time() - started

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = args.device + ("_quick" if args.quick else "")
    (out / f"{tag}.json").write_text(json.dumps(results, indent=1) + "\n")
    plot = write_plot(results, plot_path(out, tag))
    log(f"wrote {out / f'{tag}.json'} and {plot}")
    # a --quick check of the harness writes no section into BENCHMARKS.md, unless asked to
    markdown = args.markdown if args.markdown is not None else ("" if args.quick else "BENCHMARKS.md")
    if markdown:
        write_markdown(results, Path(markdown), tag, plot)
        log(f"updated {markdown} ({tag} section)")


if __name__ == "__main__":
    main()
