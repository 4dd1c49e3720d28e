"""A recipe's driver stopped by a signal other than Ctrl-C while one of its commands runs: the command must stop
with it (training saves where it is), not go on unseen beside the rerun. A stand-in driver runs a stand-in
command through ``recipes.commands``, as the recipes run fairseq-train."""

import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest
from cli_helpers import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "examples"))

from recipes import commands, pipeline  # noqa: E402

# a stand-in for python -m fairseq_convs2s.train: on SIGINT, SIGTERM or SIGHUP it "saves" (into the file named by
# its argument too) and exits 130
COMMAND = """
import os, signal, sys, time
def stop(signum, frame):
    with open(sys.argv[1], "w") as saved:  # (first: after a driver's death its output goes nowhere)
        saved.write(signal.Signals(signum).name)
    print("saved on", signal.Signals(signum).name, flush=True)
    sys.exit(130)
for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(signum, stop)
print("pid", os.getpid(), flush=True)
while True:
    time.sleep(1)
"""
DRIVER = """
import contextlib, pathlib, sys
sys.path.insert(0, {examples!r})
from recipes import commands
with commands.errors_in_one_line("t.py"), {lock} as lock:
    commands.run([sys.executable, "-c", {command!r}, {saved!r}], log={log!r}, lock=lock)
"""


def start_driver(log: Path, out: Optional[Path] = None) -> subprocess.Popen:
    """The stand-in driver, in a session of its own (a terminal's process group), holding the lock on ``out`` when
    given; returns once its command runs. The command writes ``saved`` beside ``log`` when it stops."""
    lock = f"commands.alone_in(pathlib.Path({str(out)!r}))" if out else "contextlib.nullcontext()"
    code = DRIVER.format(
        examples=str(REPO_ROOT / "examples"), lock=lock, command=COMMAND, saved=str(log.parent / "saved"), log=str(log)
    )
    driver = subprocess.Popen(
        [sys.executable, "-u", "-c", code],  # (unbuffered: the command's lines reach this test as it prints them)
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    for line in driver.stdout:  # (after the "$ command" lines, the command's first: its handlers are set)
        if line.startswith("pid "):
            driver.command_pid = int(line.split()[1])
            return driver
    driver.kill()
    raise AssertionError(f"the driver ended before its command ran: {driver.communicate()[1]}")


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("to_group", [False, True], ids=["SIGTERM to the driver", "SIGHUP to the terminal's group"])
def test_a_driver_stopped_by_a_signal_stops_its_command_first(to_group, tmp_path):
    """``kill PID`` (SIGTERM) of the driver ended it at once and its training went on, unseen and no longer logged,
    beside the rerun; a closed terminal (SIGHUP to the group) ended the driver before the training's last lines
    (what it saved) reached train.log. Now either is handled as an interrupt: the command stops first, its output
    is all in the log, and the driver exits in one line with 128 + the signal."""
    log = tmp_path / "train.log"
    driver = start_driver(log)
    try:
        if to_group:
            os.killpg(driver.pid, signal.SIGHUP)
        else:
            driver.send_signal(signal.SIGTERM)
        _, err = driver.communicate(timeout=120)
        name, code = ("SIGHUP", 129) if to_group else ("SIGTERM", 143)
        assert driver.returncode == code, err
        assert err.splitlines()[-1] == f"t.py: stopped by {name}; run the same command again to go on from here", err
        assert "Traceback" not in err
        assert gone(driver.command_pid)  # stopped and reaped before the driver exited
        assert log.read_text().splitlines()[-1].startswith("saved on SIG")  # its last line kept
    finally:
        if not gone(driver.command_pid):
            os.kill(driver.command_pid, signal.SIGKILL)
        if driver.poll() is None:
            driver.kill()


def test_a_hangup_ignored_by_nohup_stays_ignored(tmp_path):
    """Under ``nohup`` (SIGHUP ignored) a closed terminal must stop neither the driver nor its training."""
    reports = "import signal; print(signal.getsignal(signal.SIGHUP) is signal.SIG_IGN)"
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with commands.errors_in_one_line("t.py"):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # (SIGTERM is handled)
            commands.run([sys.executable, "-c", reports], log=tmp_path / "log")
        assert (tmp_path / "log").read_text() == "True\n"  # (the command inherits it)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


def test_a_console_that_is_gone_leaves_the_log_whole(tmp_path, monkeypatch):
    """A console write that fails (a terminal closed) ended the recipe's command with a traceback, and the log
    lost the rest of its output; now the log keeps every line and the command runs to its end."""
    printing = "for i in range(5): print('line', i, flush=True)"

    class ClosedTerminal(io.StringIO):
        def write(self, text):
            if text.startswith("line 1"):
                raise OSError(5, "Input/output error")
            return super().write(text)

    console = ClosedTerminal()
    monkeypatch.setattr(sys, "stdout", console)
    log = tmp_path / "log"
    commands.run([sys.executable, "-c", printing], log=log)
    assert log.read_text().splitlines() == [f"line {i}" for i in range(5)]
    assert console.getvalue().endswith("line 0\n")  # (the console only until it failed)


def test_a_driver_killed_outright_stops_its_command(tmp_path):
    """``kill -9`` of the driver (or the kernel's OOM killer), which no handler sees, left its training running,
    unseen and unlogged, to be resumed a second time by the rerun beside it. Now the command is sent SIGTERM when
    the driver dies: training saves where it is and stops."""
    driver = start_driver(tmp_path / "train.log")
    saved = tmp_path / "saved"
    try:
        driver.kill()
        driver.wait(timeout=60)
        for _ in range(600):  # (an event to wait for, up to a minute: the command's handler writes the file)
            if saved.exists() and saved.read_text():
                break
            time.sleep(0.1)
        assert saved.read_text() == "SIGTERM"
    finally:
        if not gone(driver.command_pid):
            os.kill(driver.command_pid, signal.SIGKILL)


def test_a_second_command_into_the_same_out_is_refused_while_the_first_runs(tmp_path, monkeypatch):
    """A rerun started while the first command still ran (in another terminal, or beside a training its killed
    driver left behind) resumed the same checkpoints a second time, both writing the same files. Now it stops in
    one line naming what runs there and how to stop it; once that has ended, the out is free."""
    out = tmp_path / "out"
    driver = start_driver(tmp_path / "train.log", out)
    try:
        monkeypatch.setattr(sys, "argv", ["run.py"])
        recipe = pipeline.Recipe(name="t", langs=("en", "de"), raw_prefixes={"train": "train"})
        with pytest.raises(SystemExit) as ended:
            pipeline.main(recipe, "doc", ["--out", str(out), "--raw-dir", str(tmp_path / "nowhere")])
        holders = rf"-c \(pid {driver.pid}\), python[\d.]* \(pid {driver.command_pid}\)"
        expected = rf"run.py: error: {out} is in use by {holders}, of another command into the same --out: wait "
        assert re.fullmatch(expected + rf".*\(kill -INT {driver.pid}; .*", str(ended.value.code)), ended.value.code
        assert sorted(path.name for path in out.iterdir()) == ["run.lock"]  # nothing else made
    finally:
        driver.send_signal(signal.SIGTERM)
        driver.wait(timeout=120)
        if not gone(driver.command_pid):
            os.kill(driver.command_pid, signal.SIGKILL)
    with commands.alone_in(out):
        assert (out / "run.lock").read_text().startswith(f"{os.getpid()} ")


def test_a_command_started_under_the_lock_holds_it_after_the_driver(tmp_path):
    """The lock passes to each command the driver starts: a training that outlives its driver keeps the out."""
    with commands.alone_in(tmp_path) as lock:
        sleeper = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"], **commands.child_options(lock)
        )
    try:
        with pytest.raises(commands.InUse, match=r" is in use by "):
            with commands.alone_in(tmp_path):
                pass
    finally:
        sleeper.kill()
        sleeper.wait()
    with commands.alone_in(tmp_path):
        pass
