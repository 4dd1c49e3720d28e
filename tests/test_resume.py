"""Crash and resume: training killed with SIGKILL mid-epoch restarts from its last checkpoint with the same command,
loses at most ``--save-interval-updates`` updates, and ends with the parameters of a run that was never killed;
training stopped by SIGINT or SIGTERM saves where it is and loses nothing.

fairseq saves a checkpoint by writing ``<name>.tmp`` and renaming it (``checkpoint_utils.torch_persistent_save``),
so a kill during ``torch.save`` leaves the previous file whole; it then *copies* that file to the save's other names
(``checkpoint_last.pt``, ``checkpoint_best.pt``) in place with ``shutil.copyfile``, which a kill can leave truncated.
``python -m fairseq_convs2s.train`` makes those copies atomic too; the last test shows the difference.
"""

import os
import shutil
import signal
import subprocess

import pytest
import torch
from cli_helpers import (
    PLUGIN_DIR,
    check_ok,
    checkpoint_updates,
    launcher_cmd,
    load_checkpoint,
    make_splits,
    max_param_difference,
    preprocess,
    run_launcher,
    update_records,
)

from fairseq_convs2s.compat.saving import _atomic_copy
from fairseq_convs2s.train import free_port

INTERVAL = 4  # --save-interval-updates
UPDATES = 16  # 300 sentences at --max-tokens 200: 13 updates an epoch, so the run crosses into epoch 2
KILL_AFTER = 10  # mid-epoch 1, after checkpoint_1_8.pt
FLAGS = ["--max-tokens", "200", "--max-update", str(UPDATES), "--save-interval-updates", str(INTERVAL)]


def _train_until_killed(folder, save_dir):
    """Start the launcher, read its log as it runs, SIGKILL it once it has logged update KILL_AFTER; return the
    highest update it logged (a lower bound on how far it got) and its log."""
    proc = subprocess.Popen(
        launcher_cmd("bin", save_dir, *FLAGS),
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    log, seen = [], 0
    try:
        for line in proc.stdout:
            log.append(line)
            records = update_records(line)
            if records:
                seen = max(seen, int(records[0]["num_updates"]))
            if seen >= KILL_AFTER:
                proc.send_signal(signal.SIGKILL)
                break
        proc.stdout.read()  # what it wrote before it died
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return seen, proc.returncode, "".join(log)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("resume")
    make_splits(folder, {"train": 300})
    preprocess(folder, "bin", trainpref="train")
    return folder


def test_killed_run_resumes_from_its_last_checkpoint_and_ends_where_an_uninterrupted_run_does(folder):
    """SIGKILL mid-epoch: every checkpoint on disk loads, checkpoint_last.pt is the newest of them, the restart
    (same command) loads it, continues at the next update, loses at most INTERVAL updates, and ends with the same
    parameters as a run that was never killed (fairseq's data order and seeds are deterministic)."""
    seen, returncode, first_log = _train_until_killed(folder, "killed")
    assert returncode == -signal.SIGKILL, first_log[-3000:]
    assert KILL_AFTER <= seen < UPDATES, first_log[-3000:]

    saved = sorted((folder / "killed").glob("*.pt"))
    states = {path.name: load_checkpoint(path) for path in saved}  # raises on a truncated or corrupted file
    assert "checkpoint_last.pt" in states, sorted(states)
    interval_updates = [checkpoint_updates(s) for name, s in states.items() if name != "checkpoint_last.pt"]
    last = checkpoint_updates(states["checkpoint_last.pt"])
    assert last == max(interval_updates) and last % INTERVAL == 0 and last > 0, (sorted(states), last)
    assert states["checkpoint_last.pt"]["extra_state"]["train_iterator"]["iterations_in_epoch"] == last  # epoch 1
    assert seen - last <= INTERVAL, f"logged update {seen} before the kill, resumable from {last}"
    print(f"[figure] SIGKILL after update {seen}: {len(states)} checkpoints on disk all load, resumed from {last}")

    resumed = check_ok(run_launcher(folder, "bin", "killed", *FLAGS))  # the same command again
    resumed_log = resumed.stdout + resumed.stderr
    assert f"(epoch 1 @ {last} updates)" in resumed_log and "Loaded checkpoint" in resumed_log, resumed_log[-3000:]
    steps = [int(r["num_updates"]) for r in update_records(resumed_log)]
    assert steps == list(range(last + 1, UPDATES + 1)), steps

    straight = check_ok(run_launcher(folder, "bin", "straight", *FLAGS))
    assert [int(r["num_updates"]) for r in update_records(straight.stdout)] == list(range(1, UPDATES + 1))
    a = load_checkpoint(folder / "killed/checkpoint_last.pt")
    b = load_checkpoint(folder / "straight/checkpoint_last.pt")
    assert checkpoint_updates(a) == checkpoint_updates(b) == UPDATES
    # measured: 0.0, bit for bit (the same operations on the same batches in the same order)
    difference = max_param_difference(a, b)
    print(f"[figure] killed + resumed vs uninterrupted, {UPDATES} updates: max |param difference| {difference}")
    assert difference == 0.0
    # the logged losses after the restart are the uninterrupted run's
    straight_losses = {int(r["num_updates"]): r["loss"] for r in update_records(straight.stdout)}
    assert all(r["loss"] == straight_losses[int(r["num_updates"])] for r in update_records(resumed_log))


class _Killed(BaseException):
    """Stands for SIGKILL arriving half-way through a file copy."""


def _copy_half_then_die(src, dst, *args, **kwargs):
    data = open(src, "rb").read()
    with open(dst, "wb") as f:
        f.write(data[: len(data) // 2])
    raise _Killed()


def test_checkpoint_copies_survive_a_kill_mid_copy(tmp_path, monkeypatch):
    """A copy interrupted half-way: fairseq's own copy (``PathManager.copy``) leaves a truncated
    checkpoint_last.pt that no longer loads; the launcher's copy leaves the previous checkpoint_last.pt whole."""
    from fairseq.file_io import PathManager

    stock_copy = PathManager.copy
    if getattr(stock_copy, "__wrapped__", None) is not None:  # patched in this process already
        stock_copy = stock_copy.__wrapped__
    new = tmp_path / "checkpoint_1_8.pt"
    torch.save({"model": {"w": torch.arange(10000.0)}, "num_updates": 8}, new)
    for name, copy in [("stock", stock_copy), ("launcher", _atomic_copy(stock_copy))]:
        last = tmp_path / f"{name}_checkpoint_last.pt"
        torch.save({"model": {"w": torch.zeros(10000)}, "num_updates": 4}, last)
        with monkeypatch.context() as m:
            m.setattr(shutil, "copyfile", _copy_half_then_die)
            with pytest.raises(_Killed):
                copy(str(new), str(last), overwrite=True)
        if name == "stock":
            with pytest.raises(Exception):  # noqa: B017  (torch raises RuntimeError or EOFError by position)
                torch.load(last)
        else:
            assert torch.load(last)["num_updates"] == 4
            assert not (tmp_path / f"{name}_checkpoint_last.pt.tmp").exists()  # (an error's partial copy: removed)
    # uninterrupted, the launcher's copy replaces the file
    _atomic_copy(stock_copy)(str(new), str(tmp_path / "launcher_checkpoint_last.pt"), overwrite=True)
    assert torch.load(tmp_path / "launcher_checkpoint_last.pt")["num_updates"] == 8


# a test-only plugin: rank 0 sends the signals of STOP_SIGNALS ("SIGINT", "SIGINT,SIGINT", "parent:SIGTERM") during
# update STOP_AT, where a terminal's Ctrl-C or a scheduler's SIGTERM would land, at a known update; then it waits
# until one has reached it (sent to the parent, it arrives forwarded), so that the update it stops after is known
SIGNAL_PLUGIN = """
import os, signal, time

import fairseq_convs2s  # noqa: F401  (the convs2s model)
from fairseq.trainer import Trainer

step = Trainer.train_step


def train_step(self, samples, raise_oom=False):
    if self.get_num_updates() + 1 == int(os.environ["STOP_AT"]) and self.data_parallel_rank == 0:
        for target in os.environ["STOP_SIGNALS"].split(","):
            to, _, name = target.rpartition(":")
            os.kill(os.getppid() if to == "parent" else os.getpid(), getattr(signal, name))
        request = signal.getsignal(signal.SIGTERM).__self__  # (the launcher's StopRequest)
        for _ in range(30000):
            if request.signal is not None:
                break
            time.sleep(0.01)
    return step(self, samples, raise_oom)


Trainer.train_step = train_step
"""
STOP_AT = 6  # mid-epoch 1 (13 updates an epoch), no checkpoint saved before it
NO_INTERVAL = FLAGS[:4]  # (no --save-interval-updates: stock fairseq would lose every update of the epoch)


@pytest.fixture(scope="module")
def signal_plugin(tmp_path_factory):
    path = tmp_path_factory.mktemp("plugins") / "signal_plugin"
    path.mkdir()
    (path / "__init__.py").write_text(SIGNAL_PLUGIN)
    return path


def _stopped(folder, save_dir, signals, plugin, monkeypatch, *flags, run=run_launcher):
    """Train until the launcher stops at a signal of ``signals``; assert it said so in one line, without a traceback,
    saved checkpoint_last.pt after update STOP_AT (epoch 1, with the iterator's position) and exited 130."""
    monkeypatch.setenv("STOP_AT", str(STOP_AT))
    monkeypatch.setenv("STOP_SIGNALS", signals)
    stopped = run(folder, "bin", save_dir, *NO_INTERVAL, *flags, user_dir=plugin)
    log = stopped.stdout + stopped.stderr
    assert stopped.returncode == 130 and "Traceback" not in log, log[-3000:]
    assert f"after update {STOP_AT} (epoch 1, batch {STOP_AT} of " in log and "Terminating" not in log, log[-3000:]
    state = load_checkpoint(folder / save_dir / "checkpoint_last.pt")
    assert checkpoint_updates(state) == STOP_AT
    return log


def test_a_signal_saves_where_training_is_and_the_same_command_resumes_there(folder, signal_plugin, monkeypatch):
    """SIGINT (Ctrl-C), SIGTERM or SIGHUP during update 6: the update finishes, checkpoint_last.pt is saved at it
    (epoch 1, batch 6), exit 130 with one line and no traceback; the same command resumes at update 7 and ends with the
    parameters of a run never stopped, bit for bit. A second Ctrl-C stops at once, unsaved, also in one line."""
    for name in ("SIGTERM", "SIGHUP", "SIGINT"):  # (SIGHUP: a terminal closed; fairseq died unsaved)
        log = _stopped(folder, f"stopped_{name}", name, signal_plugin, monkeypatch)
        assert f"stopped by {name} after update {STOP_AT} (epoch 1, batch {STOP_AT} of 13): saved " in log
        assert [int(r["num_updates"]) for r in update_records(log)] == list(range(1, STOP_AT + 1))

    resumed = check_ok(run_launcher(folder, "bin", "stopped_SIGINT", *NO_INTERVAL))  # the same command again
    assert [int(r["num_updates"]) for r in update_records(resumed.stdout)] == list(range(STOP_AT + 1, UPDATES + 1))
    check_ok(run_launcher(folder, "bin", "never_stopped", *NO_INTERVAL))
    a = load_checkpoint(folder / "stopped_SIGINT/checkpoint_last.pt")
    b = load_checkpoint(folder / "never_stopped/checkpoint_last.pt")
    assert checkpoint_updates(a) == checkpoint_updates(b) == UPDATES
    assert max_param_difference(a, b) == 0.0  # (as the killed run's in the test above)

    monkeypatch.setenv("STOP_SIGNALS", "SIGINT,SIGINT")
    twice = run_launcher(folder, "bin", "stopped_twice", *NO_INTERVAL, user_dir=signal_plugin)
    log = twice.stdout + twice.stderr
    assert twice.returncode == 130 and "Traceback" not in log, log[-3000:]
    assert (
        "interrupted again: stopped at once" in log and not (folder / "stopped_twice" / "checkpoint_last.pt").exists()
    )


def test_a_signal_ignored_when_training_starts_stays_ignored():
    """Under ``nohup`` (SIGHUP ignored) a closed terminal stopped the training nohup was meant to keep going: the
    stop handler replaced the ignored disposition. SIGTERM and SIGINT are still handled."""
    from fairseq_convs2s.compat.training import stop_signals_handled_by

    def handler(signum, frame):
        pass

    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop_signals_handled_by(handler):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is handler and signal.getsignal(signal.SIGINT) is handler
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


def test_the_stop_names_the_flags_a_resume_must_leave_out(folder, signal_plugin, monkeypatch):
    """A command with --reset-dataloader (or --restore-file of another checkpoint) run again would not resume from
    the checkpoint it stopped at, as the line said it would: it would start the epoch (or the other checkpoint)
    over."""
    log = _stopped(folder, "stopped_reset", "SIGINT", signal_plugin, monkeypatch, "--reset-dataloader")
    assert "the same command without --reset-dataloader resumes from it" in log, log[-3000:]


def test_a_signal_in_the_last_update_of_an_epoch_validates_it_before_saving(folder, signal_plugin, monkeypatch):
    """SIGINT during the epoch's last update: the epoch is validated, as at every epoch's end, before the save.
    Saved unvalidated, the resume started the next epoch, and that epoch's validation and its checkpoint_best.pt
    never came."""
    monkeypatch.setenv("STOP_AT", "13")  # (13 updates an epoch)
    monkeypatch.setenv("STOP_SIGNALS", "SIGINT")
    preprocess(folder, "validated", trainpref="train", validpref="train")
    cmd = launcher_cmd("validated", "stopped_at_the_end", *NO_INTERVAL, user_dir=signal_plugin)
    cmd.remove("--disable-validation")
    stopped = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=600)
    log = stopped.stdout + stopped.stderr
    assert stopped.returncode == 130, log[-3000:]
    assert "stopped by SIGINT after update 13 (epoch 1, batch 13 of 13)" in log, log[-3000:]
    assert '"valid_num_updates": "13"' in log, log[-3000:]  # (the epoch validated: its json record)
    assert checkpoint_updates(load_checkpoint(folder / "stopped_at_the_end" / "checkpoint_best.pt")) == 13


def test_a_finished_run_run_again_trains_no_more(folder):
    """The same command after a run reached its --max-update: nothing trained, the checkpoints as they were (fairseq
    trained one more update, past the limit, and rewrote them)."""
    check_ok(run_launcher(folder, "bin", "finished", *FLAGS))
    before = (folder / "finished" / "checkpoint_last.pt").read_bytes()
    again = check_ok(run_launcher(folder, "bin", "finished", *FLAGS))
    assert update_records(again.stdout) == [] and "its --max-update 16 updates already" in again.stdout
    assert (folder / "finished" / "checkpoint_last.pt").read_bytes() == before


# a test-only plugin: the second checkpoint save writes a few bytes, then finds the disk full
FULL_DISK_PLUGIN = """
import errno

import fairseq_convs2s  # noqa: F401  (the convs2s model)
import torch

save, saves = torch.save, []


def save_until_the_disk_is_full(obj, f, *args, **kwargs):
    saves.append(f)
    if len(saves) < 2:
        return save(obj, f, *args, **kwargs)
    f.write(b"partial")
    raise OSError(errno.ENOSPC, "No space left on device", getattr(f, "name", str(f)))


torch.save = save_until_the_disk_is_full
"""


def test_a_full_disk_is_named_in_one_line_and_its_partial_files_removed(folder, tmp_path):
    """The disk fills up during the second save (update 8): training ends in one line saying so, that the checkpoints
    before are whole and how to go on, exit 1, the partial checkpoint_1_8.pt.tmp removed; checkpoint_last.pt (update
    4) loads. Stock fairseq: a traceback (logged by its save, then raised), and the partial file left, still filling
    the disk."""
    plugin = tmp_path / "full_disk_plugin"
    plugin.mkdir()
    (plugin / "__init__.py").write_text(FULL_DISK_PLUGIN)
    proc = run_launcher(folder, "bin", "full_disk", *FLAGS, user_dir=plugin)
    log = proc.stdout + proc.stderr
    errors = [line for line in log.splitlines() if "| ERROR |" in line]
    assert "Traceback" not in log and len(errors) == 1, log[-3000:]  # (before: fairseq's save logged its own)
    last = errors[0]
    assert proc.returncode == 1 and "No space left on device writing " in last, log[-3000:]
    assert "checkpoint_1_8.pt.tmp (after update 8): the checkpoints saved before it are whole" in last
    assert last.endswith("run the same command to go on from checkpoint_last.pt")
    assert sorted(p.name for p in (folder / "full_disk").iterdir()) == ["checkpoint_1_4.pt", "checkpoint_last.pt"]
    assert checkpoint_updates(load_checkpoint(folder / "full_disk" / "checkpoint_last.pt")) == INTERVAL


def test_a_data_loading_worker_leaves_the_stop_to_the_trainer():
    """A worker forked from the trainer (--num-workers N) inherits its handler and, from a terminal, its Ctrl-C: each
    announced the stop again, N + 1 warnings for one Ctrl-C. In another process than the trainer's it does
    nothing."""
    from fairseq_convs2s.compat.training import StopRequest

    stop = StopRequest()
    stop.pid = os.getpid() + 1  # (as seen from a worker: the trainer is another process)
    stop.ask(signal.SIGINT)
    stop.ask(signal.SIGINT)  # (not a second Ctrl-C either)
    assert stop.signal is None
    stop.pid = os.getpid()
    stop.ask(signal.SIGINT)
    assert stop.signal == "SIGINT"
    with pytest.raises(KeyboardInterrupt):
        stop.ask(signal.SIGINT)


def test_two_ranks_stop_after_the_same_update(folder, signal_plugin, monkeypatch):
    """Two gloo ranks: a SIGINT to rank 0 alone, or a SIGTERM to the launcher alone (forwarded to the ranks), stops
    both after update 6 (they agree after each update), checkpoint_last.pt saved there; the same command resumes
    (stock fairseq under torch >= 2.6 cannot: rank 1 refused the checkpoint rank 0 sent it) and ends where two
    ranks never stopped do, bit for bit."""
    two = ("--distributed-world-size", "2")
    log = _stopped(folder, "two_stopped_SIGINT", "SIGINT", signal_plugin, monkeypatch, *two)
    assert f"stopped by SIGINT after update {STOP_AT}" in log
    log = _stopped(folder, "two_stopped_SIGTERM", "parent:SIGTERM", signal_plugin, monkeypatch, *two)
    assert f"stopped by SIGTERM after update {STOP_AT}" in log

    check_ok(run_launcher(folder, "bin", "two_stopped_SIGTERM", *NO_INTERVAL, *two))
    check_ok(run_launcher(folder, "bin", "two_never_stopped", *NO_INTERVAL, *two))
    a = load_checkpoint(folder / "two_stopped_SIGTERM/checkpoint_last.pt")
    b = load_checkpoint(folder / "two_never_stopped/checkpoint_last.pt")
    assert checkpoint_updates(a) == checkpoint_updates(b) == UPDATES
    assert max_param_difference(a, b) == 0.0


# fairseq's own spawn of one rank per GPU (distributed_utils.call_main), on this CPU: the launcher is told there are
# two GPUs; the ranks, seeing no CUDA, train on the CPU over gloo
PRETEND_TWO_GPUS = "import torch; torch.cuda.device_count = lambda: 2; from fairseq_convs2s.train import main; main()"


def _run_gpu_spawn(folder, data, save_dir, *extra, user_dir):
    cmd = launcher_cmd(data, save_dir, *extra, user_dir=user_dir)
    cmd[1:3] = ["-c", PRETEND_TWO_GPUS]  # (instead of -m fairseq_convs2s.train)
    cmd.remove("--cpu")
    ranks = ["--distributed-world-size", "2", "--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp"]
    cmd += [*ranks, "--num-workers", "0", "--distributed-init-method", f"tcp://127.0.0.1:{free_port()}"]
    return subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=600)


def test_ranks_spawned_one_per_gpu_stop_as_the_cpu_ranks_do(folder, signal_plugin, monkeypatch):
    """fairseq's spawn of a rank per GPU, supervised by the launcher: a SIGTERM to the launcher alone (a scheduler's)
    or a SIGINT to rank 0 alone stops both ranks after update 6, saved, in one line, exit 130. Under fairseq's
    own spawn the first killed the launcher and the ranks stopped unsaved; the second ended in torch's traceback
    (process 0 terminated with exit code 130). The same command then trains on from update 7."""
    log = _stopped(folder, "gpu_stopped_SIGTERM", "parent:SIGTERM", signal_plugin, monkeypatch, run=_run_gpu_spawn)
    assert f"stopped by SIGTERM after update {STOP_AT}" in log
    log = _stopped(folder, "gpu_stopped_SIGINT", "SIGINT", signal_plugin, monkeypatch, run=_run_gpu_spawn)
    assert f"stopped by SIGINT after update {STOP_AT}" in log

    resumed = check_ok(_run_gpu_spawn(folder, "bin", "gpu_stopped_SIGINT", *NO_INTERVAL, user_dir=PLUGIN_DIR))
    assert [int(r["num_updates"]) for r in update_records(resumed.stdout)] == list(range(STOP_AT + 1, UPDATES + 1))


def test_a_run_resumed_mid_epoch_with_another_number_of_ranks_takes_the_next_batches(folder):
    """A run of one process with --update-freq 2 saved after update 4 (mid-epoch) resumes as two ranks, and the same
    checkpoint as two ranks would have saved it resumes as one process with --update-freq 2: each takes the batches
    that come next and ends with the parameters of the run never stopped (two ranks equal --update-freq 2,
    test_distributed.py). fairseq saves the position as the batches each rank has taken: the two ranks stopped in
    "RuntimeError: Cannot resume training due to dataloader mismatch", and the one process trained the batches of
    updates 3 and 4 again."""
    flags, two, one = (
        ["--max-tokens", "200", "--max-update", "8"],
        ["--distributed-world-size", "2"],
        ["--update-freq", "2"],
    )
    never = check_ok(run_launcher(folder, "bin", "ranks_never_stopped", *flags, "--save-interval-updates", "4", *one))
    expected = [(r["num_updates"], r["bsz"], r["wpb"]) for r in update_records(never.stdout)[4:]]
    saved = torch.load(folder / "ranks_never_stopped/checkpoint_1_4.pt", weights_only=False)
    position = saved["extra_state"]["train_iterator"]
    assert position["epoch"] == 1 and position["iterations_in_epoch"] == 8  # (8 batches of one process)
    as_two_ranks = {**position, "iterations_in_epoch": 4, "convs2s_num_shards": 2}
    for name, state, ranks in (("one_then_two", position, two), ("two_then_one", as_two_ranks, one)):
        (folder / name).mkdir()
        torch.save(
            {**saved, "extra_state": {**saved["extra_state"], "train_iterator": state}},
            folder / name / "checkpoint_last.pt",
        )
        resumed = run_launcher(folder, "bin", name, *flags, *ranks)
        assert resumed.returncode == 0, name + resumed.stderr[-3000:]
        assert [(r["num_updates"], r["bsz"], r["wpb"]) for r in update_records(resumed.stdout)] == expected, name
        a = load_checkpoint(folder / name / "checkpoint_last.pt")
        b = load_checkpoint(folder / "ranks_never_stopped/checkpoint_last.pt")
        assert checkpoint_updates(a) == 8 and max_param_difference(a, b) < 1e-5, name


# a test-only plugin: rank 1 is killed (SIGKILL, as by the kernel's OOM killer) during update KILLED_AT
RANK_KILLER = """
import os, signal

import fairseq_convs2s  # noqa: F401  (the convs2s model)
from fairseq.trainer import Trainer

step = Trainer.train_step


def train_step(self, samples, raise_oom=False):
    if self.get_num_updates() + 1 == 3 and self.data_parallel_rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return step(self, samples, raise_oom)


Trainer.train_step = train_step
"""


def test_a_rank_killed_by_a_signal_ends_the_run_in_one_line(folder, tmp_path):
    """Rank 1 of two SIGKILLed during update 3: the run ends in one line naming the rank and the signal, with the
    shell's status for it (137), and the checkpoint saved after update 2 is there to resume from. The launcher
    ended in its own traceback (ProcessExitedException: process 1 terminated with signal SIGKILL)."""
    plugin = tmp_path / "rank_killer"
    plugin.mkdir()
    (plugin / "__init__.py").write_text(RANK_KILLER)
    flags = ["--max-tokens", "200", "--max-update", "8", "--save-interval-updates", "2"]
    proc = run_launcher(folder, "bin", "rank_killed", *flags, "--distributed-world-size", "2", user_dir=plugin)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 137 and "Traceback" not in log, log[-3000:]
    assert "rank 1 was killed by SIGKILL (out of memory?) and the other ranks were stopped: the same command " in log
    assert checkpoint_updates(load_checkpoint(folder / "rank_killed/checkpoint_last.pt")) == 2
