"""What the harness measures: generation and training speed, FLOPs, peak memory, the machine's matmul peak."""

import copy
import functools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import torch
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.optim.nag import FairseqNAG
from fairseq.sequence_generator import SequenceGenerator
from torch.nn.utils.weight_norm import WeightNorm
from torch.utils.flop_counter import FlopCounterMode

from convs2s_runtime import products
from fairseq_convs2s.criterions.fused_label_smoothed import FusedLabelSmoothedCrossEntropyCriterion
from fairseq_convs2s.criterions.label_smoothed_loss import (
    ProjectedLossTargets,
    label_smoothed_nll_loss_from_logits,
    projected_label_smoothed_loss,
)
from fairseq_convs2s.modules.training_products import training_linear

from .pair import SIZES, build_pair, collate, make_dictionary, random_sentences


def use_threads(threads: int, need_onednn: bool = False) -> int:
    """The benchmarks' ``--threads`` (0: torch's default); with ``need_onednn``, stop where torch has no oneDNN.
    Returns the number of torch threads."""
    if threads:
        torch.set_num_threads(threads)
    if need_onednn and not torch.backends.mkldnn.is_available():
        raise SystemExit("this torch has no oneDNN (mkldnn)")
    return torch.get_num_threads()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def alternate(fns: Dict[str, Callable[[], object]], repeats: int, warmup: int, device: torch.device):
    """Run each function ``warmup`` times, then ``repeats`` timed times, alternating the order every round so
    that a slow spell of a shared machine falls on both sides. Returns {name: [seconds, ...]}."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: Dict[str, List[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        for name in names if r % 2 == 0 else reversed(names):
            sync(device)
            start = time.perf_counter()
            fns[name]()
            sync(device)
            times[name].append(time.perf_counter() - start)
    return times


def median(xs: List[float]) -> float:
    return statistics.median(xs)


# ---- generation ----------------------------------------------------------------------------------------------


def source_batches(dictionary, sentences: int, length: int, batch: int, device, seed: int = 7):
    """fairseq samples (left-padded sources) of ``sentences`` random sentences, ``batch`` at a time."""
    sents = random_sentences(dictionary, sentences, length, seed)
    samples = []
    for i in range(0, sentences, batch):
        chunk = sents[i : i + batch]
        src = collate(chunk, dictionary.pad(), left_pad=True).to(device)
        lengths = torch.tensor([s.numel() for s in chunk], device=device)
        samples.append({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    return samples


def prepare_for_generation(model, beam: int, in_place: bool = False):
    """``model`` prepared as fairseq-generate prepares its models (``prepare_for_inference_`` with ``--beam
    beam``, no ``--print-alignment``): fconv's weight norm removed and its attention's bmm turned into
    ``BeamableMM``, convs2s's weights folded for good; neither returns attention. Unless ``in_place``, a copy:
    the model itself, which may still be trained, is left as it was."""
    if not in_place:
        # torch's weight-norm hook (fconv) leaves the last derived weight on the module, a non-leaf tensor that
        # deepcopy refuses; the hook derives it afresh at the next call anyway
        for module in model.modules():
            for hook in module._forward_pre_hooks.values():
                if isinstance(hook, WeightNorm):
                    setattr(module, hook.name, getattr(module, hook.name).detach())
    prepared = (model if in_place else copy.deepcopy(model)).eval()
    prepared.make_generation_fast_(beamable_mm_beam_size=beam, need_attn=False)
    return prepared


def generator_fn(model, dictionary, samples, beam: int, out_len: int):
    """A closure decoding every sample with beam search, every hypothesis forced to ``out_len`` tokens
    (no EOS before, EOS at) so both models do the same work whatever their weights say."""
    generator = SequenceGenerator([model], dictionary, beam_size=beam, max_len_a=0, max_len_b=out_len, min_len=out_len)
    result: Dict[str, list] = {}

    def run():
        hyps = []
        with torch.no_grad():
            for sample in samples:
                hyps.extend(h[0]["tokens"].tolist() for h in generator.generate([model], sample))
        result["hyps"] = hyps
        return hyps

    return run, result


# ---- training ------------------------------------------------------------------------------------------------


def train_sample(dictionary, sentences: int, length: int, device, seed: int = 11):
    """A training batch: sources, the target shifted right (EOS first), and the target."""
    src = collate(random_sentences(dictionary, sentences, length, seed), dictionary.pad(), True)
    tgt_list = random_sentences(dictionary, sentences, length, seed + 1)
    tgt = collate(tgt_list, dictionary.pad(), False)
    prev = torch.cat([torch.full((sentences, 1), dictionary.eos()), tgt[:, :-1]], dim=1)
    lengths = torch.full((sentences,), length + 1)
    return {
        "net_input": {
            "src_tokens": src.to(device),
            "src_lengths": lengths.to(device),
            "prev_output_tokens": prev.to(device),
        },
        "target": tgt.to(device),
        "ntokens": int(tgt.ne(dictionary.pad()).sum()),
    }


class TrainingPair(NamedTuple):
    """The harness's training update at one size: fconv and its conversion (the same weights, dropout 0.2) and
    one batch of 64 sentences of 25 tokens plus EOS (``train_sample``), on CPU weights and ``device``'s batch."""

    fconv: torch.nn.Module
    convs2s: torch.nn.Module
    sample: dict
    pad: int


def training_pair(size_name: str, device: torch.device, sentences: int = 64, length: int = 25) -> TrainingPair:
    """:class:`TrainingPair` at ``size_name``, one of ``pair.SIZES`` (a batch of ``sentences`` x ``length`` + EOS
    tokens instead of the harness's 64 x 25 where asked)."""
    size = SIZES[size_name]
    dictionary = make_dictionary(size.vocab)
    fconv, convs2s = build_pair(size, dictionary, dropout=0.2)
    return TrainingPair(fconv, convs2s, train_sample(dictionary, sentences, length, device), dictionary.pad())


def fresh_process_json(module: str, args: List[str]):
    """``python -m module args`` in a fresh Python process from the repository root: its last line of output, read
    as JSON (the benchmarks' workers print their figures there)."""
    cmd = [sys.executable, "-m", module, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


class TrainStep:
    """One fairseq-style update: forward, label-smoothed NLL (0.1), backward, clip 0.1, NAG (0.99).

    With ``dtype=torch.bfloat16`` the model computes in bf16 and the optimizer updates fp32 master weights,
    as fairseq's ``--bf16`` does. ``fused_loss``: the loss by ``--criterion fused_label_smoothed_cross_entropy``
    itself (for convs2s on a CPU in fp32: projection and loss a chunk of rows at a time; for fconv: from the
    logits in one pass) instead of ``label_smoothed_cross_entropy``'s (through the log-softmax).
    """

    def __init__(self, model, sample, pad: int, dtype: torch.dtype = torch.float32, fused_loss: bool = False):
        self.model, self.sample, self.pad = model.train(), sample, pad
        self.fused_loss = fused_loss
        task = SimpleNamespace(target_dictionary=SimpleNamespace(pad=lambda: pad))
        self.criterion = FusedLabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
        self.params = [p for p in model.parameters() if p.requires_grad]
        if dtype != torch.float32:
            model.to(dtype)
            self.master = [p.detach().float().clone().requires_grad_() for p in self.params]
        else:
            self.master = self.params
        self.optimizer = FairseqNAG(_NagCfg(), self.master)
        self.dtype = dtype
        self.losses: List[float] = []

    def forward_backward(self):
        if self.fused_loss:
            loss = self.criterion(self.model, self.sample)[0]
        else:
            net_output = self.model(**self.sample["net_input"])
            target = self.sample["target"].view(-1)
            lprobs = self.model.get_normalized_probs(net_output, log_probs=True)  # B x T x V, fp32
            loss, _ = label_smoothed_nll_loss(
                lprobs.view(-1, lprobs.size(-1)), target.unsqueeze(1), 0.1, ignore_index=self.pad
            )
        loss.backward()
        return loss

    def __call__(self):
        self.optimizer.zero_grad()
        for p in self.params:
            p.grad = None
        loss = self.forward_backward()
        self.apply_gradients()
        self.losses.append(loss.item() / self.sample["ntokens"])

    def apply_gradients(self):
        """The update after its backward: the gradients to the fp32 master weights (bf16), clip 0.1, the NAG
        step, the weights back. torch's and fairseq's code over the parameters, the same for fconv and convs2s."""
        if self.master is not self.params:
            for m, p in zip(self.master, self.params):
                m.grad = p.grad.float() if p.grad is not None else None
        torch.nn.utils.clip_grad_norm_(self.master, 0.1)
        self.optimizer.step()
        if self.master is not self.params:
            with torch.no_grad():
                for m, p in zip(self.master, self.params):
                    p.copy_(m)

    def apply_gradients_seconds(self, repeats: int, device: torch.device) -> float:
        """Median seconds of :meth:`apply_gradients` alone, on the gradients of the last update (which it keeps
        applying: for timing only, after the timed updates)."""
        if all(p.grad is None for p in self.params):
            raise RuntimeError("apply_gradients_seconds times the step after an update: run the update first")
        return median(alternate({"apply": self.apply_gradients}, repeats, warmup=1, device=device)["apply"])


class _NagCfg:
    lr = [0.25]
    momentum = 0.99
    weight_decay = 0.0


def _conv_tbc_flops(x_shape, w_shape, b_shape, pad=0, out_shape=None, **_):
    # conv_tbc multiplies, per kernel tap, only the output steps whose input step is not padding (as its backward
    # does); counting the same pairs keeps forward and backward consistent
    k, c_in, c_out = w_shape
    time_in, time_out = x_shape[0], out_shape[0]
    pairs = sum(max(0, min(time_out, time_in + pad - tap) - max(0, pad - tap)) for tap in range(k))
    return 2 * pairs * out_shape[1] * c_in * c_out


def _addmm_inplace_flops(self_shape, mat1_shape, mat2_shape, *_, out_shape=None, **__):
    m, k = mat1_shape
    return 2 * m * k * mat2_shape[1]


def _onednn_linear_flops(x_shape, *_, out_shape=None, **__):
    rows = math.prod(x_shape[:-1])
    return 2 * rows * x_shape[-1] * out_shape[-1]


# what torch's counter does not know: conv_tbc, and the in-place addmm_ per kernel tap its backward is made of
# (counted as they come), and oneDNN's linear
_FLOP_MAPPING = {
    torch.ops.aten.conv_tbc: _conv_tbc_flops,
    torch.ops.aten.addmm_: _addmm_inplace_flops,
    torch.ops.mkldnn._linear_pointwise: _onednn_linear_flops,
}


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of one call, counting matmuls, bmm, conv_tbc and oneDNN's linear (torch's counter knows neither)."""
    with FlopCounterMode(display=False, custom_mapping=_FLOP_MAPPING) as counter:
        fn()
    return counter.get_total_flops()


@functools.lru_cache(maxsize=None)
def flop_formulas() -> Dict[object, Callable[..., int]]:
    """{aten operator packet: formula(*args, out_val=out, **kwargs) -> FLOPs}: torch's, with ``count_flops``'s
    additions, for counting one call at a time."""
    return dict(FlopCounterMode(display=False, custom_mapping=_FLOP_MAPPING).flop_registry)


# ---- the machine ---------------------------------------------------------------------------------------------


def matmul_peak(dtype: torch.dtype, device: torch.device, n: int = 0, budget_s: float = 3.0) -> float:
    """GFLOP/s of an n^3 matmul (median of up to 5 timed calls within ``budget_s``; n = 2048 on a CPU, 8192 on
    a GPU, where a smaller product is too short to reach the peak): on a CPU the faster of torch's ``a @ b``
    (MKL) and oneDNN's product (``a @ b^T``), which runs about a third faster on this project's AMD machine; oneDNN's
    only in a dtype it computes here (``products.ONEDNN_DTYPES``): without AVX-512 it refuses bf16 (a RuntimeError),
    and MKL's product, emulated, is the bf16 peak there is."""
    n = n or matmul_peak_size(device.type)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    forms = [lambda: a @ b]
    if device.type == "cpu" and dtype in products.ONEDNN_DTYPES:
        forms.append(lambda: products.onednn_linear(a, b, None))
    return max(_gflops(form, 2 * n**3, device, budget_s) for form in forms)


def matmul_peak_size(device_type: str) -> int:
    return 8192 if device_type == "cuda" else 2048


def _gflops(fn: Callable[[], object], flops: int, device: torch.device, budget_s: float) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    first = time.perf_counter() - start
    if first > budget_s:  # an unaccelerated dtype: one call says enough
        return flops / first / 1e9
    times = []
    for _ in range(5):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return flops / median(times) / 1e9


def describe_machine(device: torch.device) -> Dict[str, object]:
    import fairseq

    info: Dict[str, object] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "fairseq": fairseq.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "cpu": _cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "git_commit": _git_commit(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def add_malloc_flag(p) -> None:
    """``--keep-freed-memory``, the malloc setting a CPU benchmark runs its models under."""
    p.add_argument(
        "--keep-freed-memory",
        action="store_true",
        help="have malloc keep freed memory, as python -m fairseq_convs2s.train does on a CPU (for every model); "
        "by default glibc's own setting, as stock fairseq-train runs",
    )


def machine_line(kept: bool) -> str:
    """One line for a CPU benchmark's output: the CPU, torch's threads, torch, the commit and the malloc setting."""
    m = describe_machine(torch.device("cpu"))
    return (
        f"{m['cpu']}, {m['torch_threads']} threads, torch {m['torch']}, commit {m['git_commit']}, "
        f"freed memory kept: {kept}"
    )


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class PeakRSS:
    """Samples this process's resident set size every few milliseconds while in the ``with`` block (MiB)."""

    def __init__(self, interval_s: float = 0.005):
        self.interval_s, self.peak_mib, self._stop = interval_s, 0.0, threading.Event()

    @staticmethod
    def rss_mib() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    def _poll(self):
        while not self._stop.is_set():
            self.peak_mib = max(self.peak_mib, self.rss_mib())
            time.sleep(self.interval_s)

    def __enter__(self):
        self.peak_mib = self.rss_mib()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak_mib = max(self.peak_mib, self.rss_mib())


def gpu_peak_mib(device: torch.device) -> Optional[float]:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


# ---- what bounds the speed-up ------------------------------------------------------------------------------


class Stopwatch:
    """Accumulates the wall time spent in chosen methods, each given as (object, method name). fairseq's
    generator calls the encoder's and decoder's ``forward`` directly, past any hooks, so the instance's method
    is wrapped instead."""

    def __init__(self, methods: Dict[str, Tuple[object, str]], device: torch.device):
        self.total = {name: 0.0 for name in methods}
        self.device = device
        self._wrapped = list(methods.values())
        for name, (owner, method) in methods.items():
            setattr(owner, method, self._timed(name, getattr(owner, method)))

    def _timed(self, name: str, method: Callable) -> Callable:
        def timed(*args, **kwargs):
            sync(self.device)
            start = time.perf_counter()
            out = method(*args, **kwargs)
            sync(self.device)
            self.total[name] += time.perf_counter() - start
            return out

        return timed

    def remove(self):
        for owner, method in self._wrapped:
            delattr(owner, method)  # the class's method again


def vocabulary_projection(model) -> Tuple[object, str]:
    """The method a model's decoder multiplies by the output vocabulary in: fconv's ``fc3``; convs2s's
    ``output_layer`` (its fast decoding steps call the projection's product there, not the module)."""
    fc3 = getattr(model.decoder, "fc3", None)
    return (fc3, "forward") if fc3 is not None else (model.decoder, "output_layer")


def generation_split(model, run: Callable[[], object], device) -> Dict[str, float]:
    """Seconds of one generation run spent in the encoder, in the decoder's vocabulary projection, in the rest
    of the decoder, and outside the model (fairseq's beam search: log-softmax, top-k, bookkeeping)."""
    methods = {
        "encoder": (model.encoder, "forward"),
        "decoder": (model.decoder, "forward"),
        "vocab": vocabulary_projection(model),
    }
    watch = Stopwatch(methods, device)
    start = time.perf_counter()
    run()
    total = time.perf_counter() - start
    watch.remove()
    t = watch.total
    return {
        "total": total,
        "encoder": t["encoder"],
        "vocab_projection": t["vocab"],
        "decoder_body": t["decoder"] - t["vocab"],
        "beam_search": total - t["encoder"] - t["decoder"],
    }


def vocabulary_step_seconds(sample, out_embed_dim: int, vocab: int, pad: int, repeats: int, device) -> Dict:
    """Median seconds of the part of a training update that does not depend on the model body: dropout, the
    vocabulary projection, the label-smoothed loss, forward and backward, on features of the decoder output's
    shape: through the log-softmax (``stock``), fused from the logits (``fused``), and, on a CPU in fp32,
    projection and loss a chunk of rows at a time (``projected``, what the fused criterion runs there). The
    logits' product is the model's (``training_linear``: oneDNN on a CPU). Any implementation of the body pays
    this part; it bounds the training speed-up."""
    target = sample["target"].view(-1)
    features = torch.randn(target.numel(), out_embed_dim, device=device, requires_grad=True)  # B*T x out_embed
    projection = torch.nn.Linear(out_embed_dim, vocab).to(device)

    def step(loss_form: str):
        x = torch.nn.functional.dropout(features, 0.2, training=True)
        if loss_form == "projected":
            targets = ProjectedLossTargets(target, 0.1, pad)
            loss = projected_label_smoothed_loss(x, projection.weight, projection.bias, targets).loss
        else:
            logits = training_linear(x, projection.weight, projection.bias)  # B*T x V
            if loss_form == "fused":
                loss, _ = label_smoothed_nll_loss_from_logits(logits, target, 0.1, pad)
            else:
                lprobs = torch.log_softmax(logits.float(), dim=-1)
                loss, _ = label_smoothed_nll_loss(lprobs, target.unsqueeze(1), 0.1, ignore_index=pad)
        loss.backward()

    forms = ["stock", "fused"] + (["projected"] if device.type == "cpu" else [])
    times = alternate({form: functools.partial(step, form) for form in forms}, repeats, warmup=1, device=device)
    return {name: median(ts) for name, ts in times.items()}
