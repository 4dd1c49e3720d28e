"""``fairseq-train`` with the fixes stock fairseq 0.12 needs on CPUs and for bfloat16.

    python -m fairseq_convs2s.train DATA --user-dir fairseq_convs2s --arch convs2s_iwslt_de_en [fairseq-train flags]

Every flag is fairseq-train's and means what it means there; this only changes what stock fairseq gets wrong:

- ``--cpu --distributed-world-size N`` starts N local processes that train together over gloo. Stock fairseq spawns
  ``min(GPUs, N)`` processes (none on a CPU), its default ``--ddp-backend pytorch_ddp`` hands GPU device ids to
  torch's DDP, and its torchrun (``env://``) path divides by the GPU count. Here CPU ranks use ``legacy_ddp`` (the
  same all-reduce, no device ids), a free TCP port on 127.0.0.1 unless ``--distributed-init-method`` is given, and
  ``cores / N`` threads each (the cores it may run on); under ``torchrun`` the ranks come from its environment.
- ``--bf16`` means bfloat16 on the device being trained on. Stock fairseq turns ``--bf16`` into ``--tpu`` and then
  fails without torch_xla; ``--tpu`` still asks for a TPU.
- A non-finite gradient under ``--bf16`` (or ``--fp16`` on a CPU) skips its update with a warning, a kill while
  fairseq copies a checkpoint leaves no truncated file, and Ctrl-C, SIGTERM or SIGHUP saves where training is
  before it stops (every rank after the same update): ``compat/training.py`` and ``compat/saving.py``, installed
  in every training process. With several ranks this process supervises them, on a CPU or fairseq's one per GPU
  (:func:`_run_ranks`): a signal sent to it alone reaches them, and the run ends in one line, exit 130; a rank
  killed by a signal (the OOM killer's SIGKILL) ends it in one line too, exit 128 + the signal.
- With ``--cpu``, glibc's malloc keeps the memory that an update frees for the next one
  (:func:`keep_freed_memory`), so that the large per-update tensors are not faulted in page by page at every
  update; the user's own ``MALLOC_MMAP_MAX_`` or ``MALLOC_TRIM_THRESHOLD_`` wins.
- With ``--cpu``, batches are made in the training process (``--num-workers 0``) unless ``--num-workers`` is given:
  a data-loading worker is a fork of the trainer, and keeps its own copy of each page the trainer writes after the
  fork; without one, whole runs are faster and smaller (BENCHMARKS.md, "Data-loading workers"). With sharded data
  (``DATA1:DATA2:...``) and workers, fairseq 0.12 keeps every epoch's workers alive to the end of the run: a
  warning says so.
- With no GPU and no ``--cpu``, fairseq trains fp32 and ``--bf16`` on the CPU, but ``--fp16`` and several ranks
  fail inside torch, and ranks started by torchrun each train alone, into the same folder: a usage error says to
  add ``--cpu``. A missing ``--arch`` is a usage error too (fairseq: a bare ``RuntimeError``), and so is a
  ``--save-dir`` nothing can be written in (fairseq: a traceback), and a ``--ddp-backend`` that cannot be built
  here (``fully_sharded`` with ``--cpu``; it or ``slowmo`` without fairscale; fairseq: a traceback from each rank).
"""

import ctypes
import logging
import multiprocessing.connection
import os
import signal
import socket
import sys
from typing import List, Optional

import torch

from .compat import install_training_fixes
from .compat.training import stop_signals_handled_by
from .errors import InputError, refusal_in

logger = logging.getLogger("fairseq_convs2s.train")


def main(argv: Optional[List[str]] = None) -> None:
    """fairseq-train: its flags, the fixes above, its training loop (in the ranks spawned, if any)."""
    from fairseq import distributed_utils, options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    _configure_logging()
    if argv is not None:  # fairseq reads --user-dir from sys.argv before parsing
        sys.argv = [sys.argv[0], *argv]
    given = set(arg.split("=", 1)[0] for arg in sys.argv[1:] if arg.startswith("--"))
    parser = options.get_training_parser()
    if parser.parse_known_args()[0].arch is None:  # (fairseq: a bare RuntimeError)
        _usage_error(parser, "--arch is required, e.g. --arch convs2s_iwslt_de_en")
    args = options.parse_args_and_arch(parser)
    _refuse_gpu_only_flags_without_gpu(parser, args)
    _refuse_a_save_dir_it_cannot_write(parser, args.save_dir)
    _refuse_a_backend_it_cannot_build(parser, args)
    if args.bf16 and "--tpu" not in given:
        args.tpu = False  # options.py sets tpu whenever bf16
    if args.cpu and args.fp16:
        args.fp16_no_flatten_grads = True  # flat fp32 master weights are allocated with torch.cuda.current_device()
    _load_batches_in_trainer(args, given)
    spawn = _setup_cpu_distributed(args, given)
    cfg = convert_namespace_to_omegaconf(args)
    if spawn:
        _run_ranks(_cpu_rank_main, (cfg, _threads_per_rank(spawn)), spawn)
    elif _spawns_one_rank_per_gpu(cfg.distributed_training):
        dt = cfg.distributed_training  # call_main's spawn as call_main makes it, waited for by _run_ranks
        start_rank, dt.distributed_rank = dt.distributed_rank, None  # (each rank numbers itself from start_rank)
        _run_ranks(_gpu_rank_main, (cfg, start_rank), min(torch.cuda.device_count(), dt.distributed_world_size))
    else:  # one process, or one rank of several launched by the user or torchrun
        try:
            distributed_utils.call_main(cfg, _patched_fairseq_main)
        except InputError as e:  # (the plugin's refusal of a flag or a file, as fairseq-train prints it: one line)
            print(f"{parser.prog}: error: {e}", file=sys.stderr)
            raise SystemExit(1) from None
        _leave_process_group()


def _refuse_gpu_only_flags_without_gpu(parser, args) -> None:
    """Without ``--cpu`` and without a GPU, fairseq trains fp32 and bf16 on the CPU, but ``--fp16`` fails in
    ``torch.cuda``, several ranks fail counting GPUs or starting NCCL, and ranks torchrun started each train alone
    (fairseq keeps the world size at 1): a usage error naming ``--cpu`` instead."""
    if args.cpu or torch.cuda.device_count() > 0:  # (fairseq's own count of GPUs)
        return
    ranks = args.distributed_world_size  # (under torchrun too: fairseq divides by the GPU count)
    launched = int(os.environ["WORLD_SIZE"]) if _under_torchrun() else 1  # (fairseq: each trains alone, silently)
    fp16 = "--memory-efficient-fp16" if getattr(args, "memory_efficient_fp16", False) else "--fp16"
    flag = fp16 if args.fp16 else f"--distributed-world-size {ranks}" if ranks > 1 else None
    flag = flag or (f"torchrun's {launched} ranks" if launched > 1 else None)
    if flag:
        _usage_error(parser, f"{flag} without --cpu needs a GPU, and torch finds none: add --cpu to train on the CPU")


def _refuse_a_save_dir_it_cannot_write(parser, save_dir: str) -> None:
    """A file as ``--save-dir``, or a folder where nothing can be written, is a usage error before anything loads
    (fairseq: a traceback at start, ending in ``Not a directory: 'DIR/dummy'``)."""
    if os.path.exists(save_dir) and not os.path.isdir(save_dir):
        _usage_error(parser, f"--save-dir {save_dir} is a file, not a folder")
    existing = os.path.abspath(save_dir)
    while not os.path.exists(existing):  # (the folders fairseq would make)
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        _usage_error(parser, f"--save-dir {save_dir}: nothing can be written in {existing}")


def _refuse_a_backend_it_cannot_build(parser, args) -> None:
    """``--ddp-backend fully_sharded`` or ``slowmo`` without fairscale, and ``fully_sharded`` on CPUs (fairscale's
    FSDP computes on CUDA), are usage errors before any rank starts (fairseq: an ImportError traceback from each)."""
    backend = args.ddp_backend
    if backend not in ("fully_sharded", "slowmo"):
        return
    if args.cpu and backend == "fully_sharded":
        _usage_error(parser, "--ddp-backend fully_sharded shards over GPUs: with --cpu use legacy_ddp or no_c10d")
    try:
        import fairscale  # noqa: F401
    except ImportError:
        _usage_error(parser, f"--ddp-backend {backend} needs fairscale (pip install fairscale): or use legacy_ddp")


def _usage_error(parser, message: str) -> None:
    """argparse's error line and exit status 2, without the usage of every fairseq flag above it."""
    print(f"{parser.prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _spawns_one_rank_per_gpu(dt) -> bool:
    """Whether fairseq's ``call_main`` would spawn a rank per GPU. Infers the init method as ``call_main`` does (once:
    with a method set, ``call_main``'s own inference does nothing); it spawns unless ``--distributed-no-spawn``."""
    from fairseq import distributed_utils

    if dt.distributed_world_size <= 1:
        return False
    if dt.distributed_init_method is None:
        distributed_utils.infer_init_method(dt)
    return dt.distributed_init_method is not None and not dt.distributed_no_spawn


def _patched_fairseq_main(cfg, **kwargs) -> None:
    """fairseq's training loop with ``compat.install_training_fixes`` applied, in whichever process runs it
    (fairseq's GPU spawn starts fresh interpreters that have not seen the parent's patches)."""
    if cfg.common.cpu:
        keep_freed_memory()
    install_training_fixes()
    from fairseq_cli.train import main as fairseq_main  # (after the fixes: one wraps it)

    fairseq_main(cfg, **kwargs)


def _load_batches_in_trainer(args, given) -> None:
    """``--num-workers 0`` with ``--cpu`` unless the flag is ``given``: no data-loading worker forks the trainer.
    Workers with sharded data get a warning, on any device."""
    if args.cpu and "--num-workers" not in given:
        args.num_workers = 0
    from fairseq import utils

    if args.num_workers > 0 and len(utils.split_paths(args.data)) > 1:  # fairseq's own reading of DATA1:DATA2
        logger.warning(
            "--num-workers %d with sharded data: fairseq 0.12 keeps each epoch's data-loading workers alive until "
            "training ends, one more set an epoch, each holding a copy of the trainer's memory as it changes; "
            "--num-workers 0 makes batches in the trainer",
            args.num_workers,
        )


def _configure_logging() -> None:
    """fairseq-train's log format, on stdout; importing the plugin has already given the root logger a handler, so
    the ``basicConfig`` call in ``fairseq_cli.train`` would otherwise do nothing."""
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        level=os.environ.get("LOGLEVEL", "INFO").upper(),
        stream=sys.stdout,
        force=True,
    )


def _setup_cpu_distributed(args, given) -> int:
    """Fill in the distributed flags for a multi-process CPU run; return how many local ranks to spawn (0: none)."""
    torchrun = _under_torchrun()
    if not args.cpu or (args.distributed_world_size <= 1 and not torchrun):
        return 0
    if args.ddp_backend in ("pytorch_ddp", "c10d"):
        if "--ddp-backend" in given:
            logger.warning(
                "--ddp-backend %s passes GPU device ids to torch; on CPUs using legacy_ddp", args.ddp_backend
            )
        args.ddp_backend = "legacy_ddp"
    if "--distributed-backend" not in given:
        args.distributed_backend = "gloo"
    if torchrun:  # this process is one rank; its number and the world size come from torchrun's environment
        args.distributed_init_method = "env://"
        args.distributed_world_size = int(os.environ["WORLD_SIZE"])
        args.distributed_rank = int(os.environ["RANK"])
        args.device_id = 0
        args.distributed_no_spawn = True
        return 0
    if args.distributed_no_spawn:  # one rank per command, as the user launched it (--distributed-rank R)
        return 0
    if args.distributed_init_method is None:
        args.distributed_init_method = f"tcp://127.0.0.1:{free_port()}"
    args.distributed_no_spawn = True  # each spawned process is one rank; fairseq must not spawn again
    return args.distributed_world_size


def _under_torchrun() -> bool:
    """Whether torchrun (or torch.distributed.launch) started this process as one rank of several."""
    return all(key in os.environ for key in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a local --distributed-init-method)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _threads_per_rank(ranks: int) -> int:
    """``OMP_NUM_THREADS`` where set, else the CPUs this process may run on (taskset, a container's cpuset: what torch
    counts too) shared out among ``ranks``; ``os.cpu_count()`` counts the machine's, and on 2 allowed CPUs of 64 gave
    each of 2 ranks 32 threads."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return int(os.environ.get("OMP_NUM_THREADS", 0)) or max(1, cpus // ranks)


def _run_ranks(rank_main, args: tuple, ranks: int) -> None:
    """Spawn ``ranks`` processes running ``rank_main(rank, *args)`` and wait for them. SIGINT or SIGTERM sent to
    this process reaches them as SIGTERM (they finish the update, save and stop together; a terminal's Ctrl-C
    reaches them itself, and SIGTERM never counts as a second Ctrl-C); their exit status 130 is this process's,
    without the spawn's traceback. Under ``torch.multiprocessing.spawn(join=True)`` a signal killed this process
    with a traceback, and the ranks, told by torch that their parent died, stopped unsaved."""
    context = None

    def forward(signum, frame):
        for process in context.processes if context is not None else ():
            if process.is_alive():
                os.kill(process.pid, signal.SIGTERM)

    with stop_signals_handled_by(forward):
        context = torch.multiprocessing.spawn(rank_main, args=args, nprocs=ranks, join=False)
        running = {process.sentinel: process for process in context.processes}
        while running:
            for sentinel in multiprocessing.connection.wait(list(running)):
                process = running.pop(sentinel)
                process.join()  # (its exit status, once reaped)
                if process.exitcode not in (0, 130):  # a rank failed: torch's join ends the others
                    _join_failed(context)
        if any(process.exitcode == 130 for process in context.processes):  # (stopped by a signal, and saved)
            raise SystemExit(130)
        context.join()


def _join_failed(context) -> None:
    """After a rank failed: torch's join ends the others and raises, with the failed rank's traceback. A rank that
    the plugin's InputError ended, and one killed by a signal (the kernel's OOM killer: SIGKILL), which has none, end
    the run in one line instead of the launcher's own traceback (exit 1; the shell's status for that signal)."""
    try:
        while not context.join():
            pass
    except torch.multiprocessing.ProcessRaisedException as e:
        refusal = refusal_in(str(e))
        if refusal is None:
            raise
        print(f"{os.path.basename(sys.argv[0])}: error: {refusal}", file=sys.stderr)  # (as one process prints it)
        raise SystemExit(1) from None
    except torch.multiprocessing.ProcessExitedException as e:
        if not e.signal_name:
            raise
        hint = " (out of memory?)" if e.exit_code == -signal.SIGKILL else ""
        logger.error(
            "rank %d was killed by %s%s and the other ranks were stopped: the same command resumes from the last "
            "checkpoint saved",
            e.error_index,
            e.signal_name,
            hint,
        )
        raise SystemExit(128 - e.exit_code) from None


def _cpu_rank_main(rank: int, cfg, threads: int) -> None:
    """One spawned CPU rank: fairseq's own per-rank entry point (process group init, then its training loop)."""
    from fairseq import distributed_utils

    _configure_logging()
    torch.set_num_threads(threads)
    cfg.distributed_training.distributed_rank = rank
    cfg.distributed_training.device_id = 0
    distributed_utils.call_main(cfg, _patched_fairseq_main)
    _leave_process_group()


def _gpu_rank_main(device: int, cfg, start_rank: int) -> None:
    """One rank of fairseq's spawn, one per GPU: its own per-rank entry point, in fairseq-train's log format (a
    fresh interpreter has imported the plugin, whose handler on the root logger keeps fairseq's from being set)."""
    from fairseq import distributed_utils

    _configure_logging()
    distributed_utils.distributed_main(device, _patched_fairseq_main, cfg, {"start_rank": start_rank})
    _leave_process_group()


def _leave_process_group() -> None:
    """After fairseq's end of training (every rank past its barrier), close the process group before this rank
    exits, as a stopped rank does (``compat/training.py``): a rank that exited with its gloo connections open was
    once aborted at exit (terminate called without an active exception, SIGABRT) at the end of a whole run."""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4


def keep_freed_memory() -> bool:
    """Have glibc's malloc serve every allocation from its heap and keep what is freed there for reuse; returns
    whether it did (glibc only, and not where the environment sets either option: the user's choice stands).

    By default glibc maps each allocation above 32 MiB (its largest mmap threshold) afresh and unmaps it when freed,
    so the tensors of an update that size (the logits, log-probabilities and their gradients, N x V floats) are
    faulted in and zeroed by the kernel page by page at every update. Kept, whole training runs are faster with the
    same losses (BENCHMARKS.md, "What bounds them"). The cost: the process keeps its
    peak memory until it exits.
    """
    if "MALLOC_MMAP_MAX_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, 2**31 - 1) == 1


if __name__ == "__main__":
    main()
