"""``python -m fairseq_convs2s.train``: mistakes in its command line end in one usage line that says what to add,
not in an error from inside fairseq or torch; Ctrl-C while it (or another ``python -m`` tool) starts, in one line."""

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from cli_helpers import PLUGIN_DIR, REPO_ROOT, launcher_cmd, make_splits, preprocess, tail, update_records

NO_GPU = "without --cpu needs a GPU, and torch finds none: add --cpu to train on the CPU"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("train_entry")
    make_splits(folder, {"train": 40})
    preprocess(folder, "bin", trainpref="train")
    return folder


def run(folder, cmd):
    return subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=300)


def assert_usage_error(proc, message: str, save_dir=None) -> None:
    """Exit status 2 and argparse's one error line, with no traceback and no usage of every fairseq flag."""
    assert proc.returncode == 2, tail(proc)
    assert proc.stderr.strip().splitlines()[-1] == f"train.py: error: {message}", tail(proc)
    assert "Traceback" not in proc.stderr and "usage:" not in proc.stderr, tail(proc)
    assert save_dir is None or not save_dir.exists()


def test_no_arch_is_a_usage_error_naming_it(corpus):
    """Without --arch fairseq's parser raised a RuntimeError with no message at all."""
    cmd = [sys.executable, "-m", "fairseq_convs2s.train", "bin", "--user-dir", str(PLUGIN_DIR)]
    proc = run(corpus, cmd + ["--cpu", "--max-tokens", "1000", "--save-dir", "no_arch"])
    assert_usage_error(proc, "--arch is required, e.g. --arch convs2s_iwslt_de_en", corpus / "no_arch")


def test_a_save_dir_it_cannot_write_is_a_usage_error(corpus, monkeypatch, capsys):
    """A file as --save-dir (or a folder below one), or a read-only folder: a traceback from inside fairseq at
    start ("Not a directory: 'afile/dummy'", "Read-only file system")."""
    (corpus / "a_file").write_text("")
    below = f"--save-dir a_file/below: nothing can be written in {corpus / 'a_file'}"
    for save_dir, message in (("a_file", "--save-dir a_file is a file, not a folder"), ("a_file/below", below)):
        assert_usage_error(run(corpus, launcher_cmd("bin", save_dir, "--max-update", "1")), message)
    from fairseq_convs2s import train

    monkeypatch.setattr(train.os, "access", lambda path, mode: False)  # (root writes through any mode bits)
    with pytest.raises(SystemExit) as exit_:
        train._refuse_a_save_dir_it_cannot_write(SimpleNamespace(prog="train.py"), str(corpus / "read_only" / "ckpt"))
    assert exit_.value.code == 2
    assert (
        capsys.readouterr().err
        == f"train.py: error: --save-dir {corpus / 'read_only' / 'ckpt'}: nothing can be written in {corpus}\n"
    )


def test_a_setting_the_model_refuses_ends_in_one_line(corpus):
    """A flag the plugin refuses once fairseq has read it (here unequal embedding widths, when the model is built):
    one line and exit status 1, as under fairseq-train, where it ended a traceback through fairseq's loop."""
    line = (
        "train.py: error: --encoder-embed-dim (32) and --decoder-embed-dim (64) must be equal: attention scores are "
        "dot products between the two"
    )
    for ranks in ("1", "2"):  # (two: the failed rank's traceback, handed to the launcher, was printed by it)
        cmd = launcher_cmd("bin", "dims", "--max-update", "1", "--encoder-embed-dim", "32")
        proc = run(corpus, [*cmd, "--distributed-world-size", ranks])
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, tail(proc)
        assert proc.stderr.strip().splitlines()[-1] == line and proc.stderr.count(line) == 1, tail(proc)


def test_a_rank_refusal_is_read_from_its_traceback():
    from fairseq_convs2s.compat.broken_checkpoints import BrokenCheckpoint  # noqa: F401  (loaded, as in a launcher)
    from fairseq_convs2s.errors import refusal_in

    trace = "Traceback (most recent call last):\n  File ...\nfairseq_convs2s.errors.InputError: --x must be 1: a: b\n"
    assert refusal_in(trace) == "--x must be 1: a: b"
    broken = "Traceback ...\nfairseq_convs2s.compat.broken_checkpoints.BrokenCheckpoint: ckpt.pt is empty\n"
    assert refusal_in(broken) == "ckpt.pt is empty"
    for other in ("Traceback ...\nValueError: --x must be 1", "Traceback ...\nos.path: not a class", "KeyError"):
        assert refusal_in(other) is None


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="what happens without a GPU")
def test_without_a_gpu_fp16_and_ranks_need_cpu_and_bf16_still_trains(corpus):
    """With no GPU and no --cpu, --fp16 ended in "AssertionError: Torch not compiled with CUDA enabled" and
    --distributed-world-size 2 in "world size is 2 but have 0 available devices", and each rank torchrun started
    trained alone, into the same folder. fp32 and --bf16 train on the CPU there, as in fairseq, and still do."""

    def without_cpu(*extra):
        return [arg for arg in launcher_cmd("bin", "ckpt", "--max-update", "1", *extra) if arg != "--cpu"]

    for flags, named in ((["--fp16"], "--fp16"), (["--distributed-world-size", "2"], "--distributed-world-size 2")):
        assert_usage_error(run(corpus, without_cpu(*flags)), f"{named} {NO_GPU}", corpus / "ckpt")
    torchrun = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "WORLD_SIZE": "2", "RANK": "0"}
    proc = subprocess.run(without_cpu(), cwd=corpus, capture_output=True, text=True, timeout=300, env=torchrun)
    assert_usage_error(proc, f"torchrun's 2 ranks {NO_GPU}", corpus / "ckpt")  # (each trained alone, silently)
    proc = run(corpus, without_cpu("--bf16"))
    assert proc.returncode == 0, tail(proc)
    assert [int(r["num_updates"]) for r in update_records(proc.stdout + proc.stderr)] == [1], tail(proc)


def test_torchrun_starts_the_ranks_of_one_cpu_training(corpus):
    """The README's torchrun command (``torchrun --nproc-per-node 2 -m fairseq_convs2s.train ... --cpu``): two ranks
    of one training over gloo, its checkpoint saved once with the updates of both."""
    from fairseq_convs2s.train import free_port

    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    torchrun += ["--master-port", str(free_port())]
    cmd = launcher_cmd("bin", "ranks", "--max-update", "2")
    proc = run(corpus, [*torchrun, *cmd[1:]])  # (cmd[1:]: -m fairseq_convs2s.train and its flags)
    assert proc.returncode == 0, tail(proc)
    log = proc.stdout + proc.stderr
    assert "initialized host" in log and "as rank 1" in log and "'distributed_world_size': 2" in log, tail(proc)
    assert [int(r["num_updates"]) for r in update_records(proc.stdout)] == [1, 2], tail(proc)
    assert (corpus / "ranks" / "checkpoint_last.pt").is_file()


@pytest.mark.parametrize("tool", ["fairseq_convs2s.train", "fairseq_convs2s.export", "convs2s_runtime"])
def test_ctrl_c_while_a_tool_imports_torch_is_one_line(tool, tmp_path):
    """Ctrl-C in the seconds a ``python -m`` tool spends importing torch and fairseq ended in Python's traceback;
    here a torch whose import is interrupted stands in for the keypress (no timing). A program that imports the
    package gets the KeyboardInterrupt, to handle as it will."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise KeyboardInterrupt\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)])}
    proc = subprocess.run([sys.executable, "-m", tool, "x"], env=env, capture_output=True, text=True, timeout=120)
    package = tool.split(".")[0]
    assert (proc.returncode, proc.stderr) == (130, f"{package}: interrupted while starting\n"), tail(proc)
    imported = [sys.executable, "-c", f"import {package}"]
    proc = subprocess.run(imported, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and proc.stderr.rstrip().endswith("KeyboardInterrupt"), tail(proc)


def test_a_ddp_backend_it_cannot_build_is_a_usage_error(corpus):
    """--ddp-backend fully_sharded with --cpu, or slowmo without fairscale, ended in an ImportError traceback from
    each rank after they had started (fairscale's FSDP computes on CUDA in any case)."""
    cmd = launcher_cmd("bin", "no_backend", "--max-update", "1", "--distributed-world-size", "2", "--ddp-backend")
    message = "--ddp-backend fully_sharded shards over GPUs: with --cpu use legacy_ddp or no_c10d"
    assert_usage_error(run(corpus, cmd + ["fully_sharded"]), message, corpus / "no_backend")
    try:
        import fairscale  # noqa: F401
    except ImportError:
        message = "--ddp-backend slowmo needs fairscale (pip install fairscale): or use legacy_ddp"
        assert_usage_error(run(corpus, cmd + ["slowmo"]), message, corpus / "no_backend")


# a test-only plugin: each rank prints its torch thread count at its first update
THREADS_PLUGIN = """
import torch

import fairseq_convs2s  # noqa: F401  (the convs2s model)
from fairseq.trainer import Trainer

step = Trainer.train_step


def train_step(self, samples, raise_oom=False):
    if self.get_num_updates() == 0:
        print(f"rank {self.data_parallel_rank} threads {torch.get_num_threads()}", flush=True)
    return step(self, samples, raise_oom)


Trainer.train_step = train_step
"""


def test_ranks_share_the_cpus_the_run_may_use(corpus, tmp_path):
    """Two CPU ranks on a machine of 64 CPUs of which the run may use this machine's (its affinity, as under taskset
    or a container's cpuset) get those CPUs / 2 threads each: they got 64 / 2 each, oversubscribed."""
    plugin = tmp_path / "threads_plugin"
    plugin.mkdir()
    (plugin / "__init__.py").write_text(THREADS_PLUGIN)
    cmd = launcher_cmd("bin", "threads", "--max-update", "1", "--distributed-world-size", "2", user_dir=plugin)
    cmd[1:3] = ["-c", "import os; os.cpu_count = lambda: 64; from fairseq_convs2s.train import main; main()"]
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    proc = subprocess.run(cmd, cwd=corpus, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, tail(proc)
    expected = max(1, len(os.sched_getaffinity(0)) // 2)
    for rank in (0, 1):
        assert f"rank {rank} threads {expected}\n" in proc.stdout, tail(proc)
