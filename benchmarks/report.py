"""The harness's results as markdown tables (a section of BENCHMARKS.md per device) and a scaling plot.

``python -m benchmarks.report benchmarks/results/cpu.json`` writes a saved run's section again (after a change to
how it is reported), without measuring anything.
"""

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Dict, List

from .measure import matmul_peak_size

FUSED = "convs2s_fused_loss"  # the training row's key for convs2s with the fused loss (benchmarks.run)


def plot_path(results_dir: Path, tag: str) -> Path:
    """Where a run's scaling plot lies: beside its ``<tag>.json``."""
    return results_dir / f"scaling_{tag}.png"


def write_plot(results: Dict, path: Path) -> Path:
    """Two panels: ms per sentence against source length (beam 5) and against beam size, fconv vs convs2s."""
    import matplotlib

    matplotlib.use("Agg")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq leaves the root logger at DEBUG
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, axis, label in zip(axes, ("length", "beam"), ("source length (tokens; output as long), beam 5", "beam")):
        rows = results["scaling"][axis]
        xs = [r[axis] for r in rows]
        for impl, style in (("fconv", "o--"), ("convs2s", "s-")):
            ax.plot(xs, [r[impl] for r in rows], style, label=impl)
        ax.set_xlabel(label)
        ax.set_ylabel(f"ms per sentence (batch {_scaling_batch(results)})")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"Generation cost, convs2s_iwslt_de_en size, {results['machine'].get('gpu', 'CPU')}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _scaling_batch(results: Dict) -> int:
    """The scaling rows' batch (``benchmarks.run --quick``: 4); runs before it was recorded used 16."""
    return results["scaling"].get("batch", 16)


def _table(header: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _limits(limits) -> List[str]:
    if not limits:
        return []
    parts = [
        "**Where the time goes** (iwslt size, beam 5, seconds of one run, each part the median of 3 runs; "
        "'body free': convs2s's speed-up were its decoder body free, the rest as measured; 'at peak': were all "
        "its counted FLOPs at the matmul peak, fairseq's beam search as measured):",
        "",
    ]
    rows = []
    for r in limits["generation"]:
        for impl in ("fconv", "convs2s"):
            t = r[impl]
            rows.append(
                [
                    str(r["batch"]),
                    impl,
                    f"{t['total']:.2f}",
                    f"{t['encoder']:.2f}",
                    f"{t['decoder_body']:.2f}",
                    f"{t['vocab_projection']:.2f}",
                    f"{t['beam_search']:.2f}",
                    f"{r.get('bound_body_free', r['bound']):.2f}x" if impl == "convs2s" else "",
                    f"{r['bound_at_peak']:.2f}x" if impl == "convs2s" and "bound_at_peak" in r else "",
                ]
            )
    header = ["batch", "model", "total", "encoder", "decoder body", "vocab projection", "beam search"]
    header += ["body free", "at peak"]
    parts += [_table(header, rows), ""]
    for r in limits["training"]:
        text = (
            f"Training (iwslt, fp32), ms per update: vocabulary projection, log-softmax and loss "
            f"{1e3 * r['vocabulary_s']:.0f}, the body's FLOPs at the matmul peak {1e3 * r['body_at_peak_s']:.0f}"
        )
        if "apply_gradients_s" in r:  # runs before this column left the clip and optimizer step out of the bound
            text += f", clipping and NAG step {1e3 * r['apply_gradients_s']:.0f}"
        text += (
            f"; fconv {1e3 * r['fconv_s']:.0f}, convs2s {1e3 * r['convs2s_s']:.0f}. No body can beat fconv by more "
            f"than **{r['bound']:.2f}x** at equal arithmetic with fairseq's loss"
        )
        if "bound_fused" in r:
            text += (
                f"; with the fused criterion{_FORMS.get(r.get('vocabulary_fused_form'), '')} "
                f"(vocabulary {1e3 * r['vocabulary_fused_s']:.0f}, convs2s {1e3 * r['convs2s_fused_s']:.0f}) "
                f"**{r['bound_fused']:.2f}x**"
            )
        text += "."
        parts += [text, ""]
    return parts


# how the fused criterion's vocabulary step ran (runs before the chunked form name none: from the logits)
_FORMS = {"projected": ", a chunk of rows at a time", "fused": ", from the logits in one pass"}


def _malloc_text(machine: Dict) -> str:
    """Said only where the run kept freed memory (``--keep-freed-memory``); runs before the flag did not."""
    return (
        " malloc keeps freed memory (`--keep-freed-memory`), for both models."
        if machine.get("freed_memory_kept")
        else ""
    )


def _peaks_text(machine: Dict) -> str:
    """The matmul peaks the fractions are taken of, as the run measured them."""
    peaks = machine["matmul_gflops"]
    rates = ", ".join(f"{gflops:.1f} GFLOP/s {dtype}" for dtype, gflops in peaks.items())
    n = matmul_peak_size("cuda" if machine.get("gpu") else "cpu")
    if machine.get("gpu"):
        return f"{n}^3 matmul: {rates} (fp32 without TF32, torch's default)"
    return f"{n}^3 matmul (the faster of MKL and oneDNN): {rates}"


def render(results: Dict, plot: Path, markdown_dir: Path) -> str:
    m = results["machine"]
    parts = [
        f"Machine: {m.get('gpu') or m['cpu']}, {m['torch_threads']} torch threads ({m['cpu_count']} CPUs), "
        f"cpu capability {m['cpu_capability']}; Python {m['python']}, torch {m['torch']}, fairseq {m['fairseq']}; "
        f"commit {m['git_commit']}. {_peaks_text(m)}.{_malloc_text(m)} Whole run: {results['wall_s'] / 60:.1f} min.",
        "",
        "**Generation** (random sentences of "
        f"{results['args']['src_len']} tokens, outputs forced to the same length; both models prepared as "
        "fairseq-generate prepares them; median of the repeats):",
        "",
    ]
    rows = []
    for r in results["generation"]:
        rows.append(
            [
                r["size"],
                str(r["beam"]),
                str(r["batch"]),
                f"{r['fconv']['sentences_per_s']:.1f}",
                f"{r['convs2s']['sentences_per_s']:.1f}",
                f"{r['convs2s']['tokens_per_s']:.0f}",
                f"**{r['speedup']:.2f}x**",
                f"{r['identical']}/{r['sentences']}",
            ]
        )
    header = ["size", "beam", "batch", "fconv sent/s", "convs2s sent/s", "convs2s tok/s", "speed-up", "same hyps"]
    parts += [
        _table(header, rows),
        "",
        "**Training** (words/s of one update: forward, label-smoothed loss, backward, clip, NAG; fconv and convs2s "
        "with fairseq's `label_smoothed_cross_entropy`, 'fused' convs2s with the plugin's "
        "`fused_label_smoothed_cross_entropy` (on a CPU in fp32 a chunk of rows at a time, elsewhere from the "
        "logits), the three alternated in one process; 'one per process': CPU fp32 again, each model in a fresh "
        "process as one `fairseq-train` run has it, medians over rounds):",
        "",
    ]
    rows = []
    for r in results["training"]:
        if "skipped" in r:
            rows.append([r["size"], r["dtype"], "-", "-", "-", "-", "-", "skipped: " + r["skipped"]])
            continue
        fused = r.get(FUSED)  # absent from runs before the fused loss
        alone = r.get("one_process")  # CPU fp32 rows since the harness measured them
        rows.append(
            [
                r["size"],
                r["dtype"],
                f"{r['fconv']['words_per_s']:.0f}",
                f"{r['convs2s']['words_per_s']:.0f} (**{r['speedup']:.2f}x**)",
                f"{fused['words_per_s']:.0f} (**{r['speedup_fused']:.2f}x**)" if fused else "-",
                f"{alone['convs2s']['speedup']:.2f}x / **{alone[FUSED]['speedup']:.2f}x**" if alone else "-",
                f"{r['fconv']['fraction_of_peak']:.0%} / {r['convs2s']['fraction_of_peak']:.0%}",
                f"{r['convs2s']['gflop_per_update']:.1f}",
            ]
        )
    header = ["size", "dtype", "fconv", "convs2s", "fused", "one per process: convs2s / fused"]
    header += ["of peak: fconv / convs2s", "GFLOP/update"]
    parts += [_table(header, rows), ""]
    parts += _limits(results.get("limits"))
    parts += ["**Peak memory** (each model alone in a fresh process):", ""]
    on_gpu = any(r.get("generate_gpu_mib") for r in results["memory"])
    rows = []
    for r in results["memory"]:
        model = "convs2s, fused criterion" if r["impl"] == FUSED else r["impl"]
        row = [r["size"], model, f"{r['idle_rss_mib']:.0f}", f"{r['generate_rss_mib']:.0f}"]
        row.append(f"{r['train_rss_mib']:.0f}")
        if on_gpu:
            row += [f"{r['generate_gpu_mib']:.0f}", f"{r['train_gpu_mib']:.0f}"]
        rows.append(row)
    header = ["size", "model", "RSS loaded (MiB)", "RSS beam-5 generate", "RSS one update"]
    header += ["GPU beam-5 generate (MiB, peak allocated)", "GPU one update"] if on_gpu else []
    scaling = f"**Scaling** (ms per sentence, batch {_scaling_batch(results)}, convs2s_iwslt_de_en size):"
    parts += [_table(header, rows), "", scaling, ""]
    for axis in ("length", "beam"):
        points = results["scaling"][axis]
        name = "source length (beam 5)" if axis == "length" else f"beam ({results['args']['src_len']} tokens)"
        rows = [[impl] + [f"{r[impl]:.1f}" for r in points] for impl in ("fconv", "convs2s")]
        rows.append(["speed-up"] + [f"{r['fconv'] / r['convs2s']:.2f}x" for r in points])
        parts += [_table([name] + [str(r[axis]) for r in points], rows), ""]
    parts.append(f"![scaling]({os.path.relpath(plot, markdown_dir)})")
    return "\n".join(parts)


def write_markdown(results: Dict, path: Path, tag: str, plot: Path) -> None:
    """Replace the ``tag`` section of ``path`` (between its markers), or append one."""
    begin, end = f"<!-- results:{tag} -->", f"<!-- /results:{tag} -->"
    body = f"{begin}\n{render(results, plot, path.resolve().parent)}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + body + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n## Results: {tag}\n\n{body}\n"
    path.write_text(text)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Write a saved benchmarks.run result's section of BENCHMARKS.md.")
    parser.add_argument("results", help="a run's <device>.json (benchmarks/results/cpu.json)")
    parser.add_argument("--markdown", default="BENCHMARKS.md", help="the document whose section is replaced")
    args = parser.parse_args(argv)
    path = Path(args.results)
    tag = path.stem
    plot = plot_path(path.parent, tag)
    if not plot.exists():
        raise SystemExit(f"{plot} is missing: benchmarks.run writes it beside {path}")
    write_markdown(json.loads(path.read_text()), Path(args.markdown), tag, plot)
    print(f"wrote the {tag} section of {args.markdown} from {path}")


if __name__ == "__main__":
    main()
