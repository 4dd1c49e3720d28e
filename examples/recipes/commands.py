"""Running a recipe's commands: each stage's header, the fairseq tools as this Python runs them, and a failed or
interrupted command as one line (``run.py: error: ...``, exit 1; 130 on an interrupt), not a traceback."""

import contextlib
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence

from recipes import text
from recipes.settings import SettingsChanged

USER_DIR = Path(__file__).resolve().parent.parent.parent / "fairseq_convs2s"


def stage(name: str, done: Path) -> bool:
    """Print the stage header; False (skip the stage) when its output ``done`` already exists."""
    if done.exists():
        print(f"== {name}: already done ({done})", flush=True)
        return False
    print(f"== {name}", flush=True)
    return True


def fairseq(tool: str) -> List[str]:
    return [sys.executable, "-m", f"fairseq_cli.{tool}"]


class CommandFailed(Exception):
    """A stage's command exited with an error (its own output, printed above, says why); the message names the
    command, how it ended and where its output is kept."""


def command_name(cmd: Sequence[str]) -> str:
    """``fairseq-train`` for ``python -m fairseq_cli.train ...``, ``python -m fairseq_convs2s.train`` for the
    plugin's entry; the program otherwise."""
    if len(cmd) > 2 and cmd[1] == "-m":
        module = cmd[2]
        return "fairseq-" + module.split(".", 1)[1] if module.startswith("fairseq_cli.") else f"python -m {module}"
    return Path(cmd[0]).name


def failure(cmd: Sequence[str], returncode: int, log: Optional[Path]) -> CommandFailed:
    """The error for a command that exited with ``returncode`` (negative: killed by that signal)."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:  # a number Python has no name for
            name = f"signal {-returncode}"
        how = f"was killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    else:
        how = f"exited with status {returncode}"
    kept = f" (its output is also in {log})" if log is not None else ""
    return CommandFailed(
        f"{command_name(cmd)} {how}{kept}; once fixed, run the same command again: the stages already done are "
        "skipped and an interrupted training resumes from its last checkpoint"
    )


class InUse(Exception):
    """Another command is running in the same ``--out``: the two would write the same files, resume the same
    checkpoints twice, and record each other's settings."""


LOCK = "run.lock"


class OutLock:
    """``OUT/run.lock`` as a driver holds it (:func:`alone_in`): its open descriptor, which each command the driver
    starts inherits (:func:`child_options`), and in which each is named (:meth:`name`), so that a training the
    driver left behind holds the out too and is named to the next command. ``fd`` None: held by no one (no
    ``fcntl``, a file system without locks, or no ``alone_in`` at all)."""

    def __init__(self, fd: Optional[int] = None):
        self.fd = fd

    def name(self, pid: int, name: str) -> None:
        """Record process ``pid`` as one of those holding the lock."""
        if self.fd is not None:
            os.write(self.fd, f"{pid} {name}\n".encode())


@contextlib.contextmanager
def alone_in(out: Path) -> Iterator[OutLock]:
    """This command alone in ``out``: an exclusive lock on ``OUT/run.lock``, held by the driver and by every command
    it starts with the :class:`OutLock` this yields, so that a training the driver left behind holds it too;
    :class:`InUse`, naming who holds it, when another command does. (Where there is no ``fcntl``, no lock.)"""
    try:
        import fcntl
    except ImportError:
        yield OutLock()
        return
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise InUse(_holders(path)) from None
    except OSError:  # a file system without locks: run unlocked, as before
        os.close(fd)
        yield OutLock()
        return
    os.ftruncate(fd, 0)
    lock = OutLock(fd)
    lock.name(os.getpid(), Path(sys.argv[0]).name)  # (and each command started: run())
    try:
        yield lock
    finally:
        lock.fd = None
        os.close(fd)


def _holders(path: Path) -> str:
    """The message for a lock another command holds: its processes still running (driver, then commands)."""
    running = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        pid, _, name = line.partition(" ")
        if pid.isdigit() and _alive(int(pid)):
            running.append((pid, name))
    who = ", ".join(f"{name} (pid {pid})" for pid, name in running) or "another command"
    stop = f"kill -INT {running[0][0]}" if running else "Ctrl-C"
    return (
        f"{path.parent} is in use by {who}, of another command into the same --out: wait for it to end, or stop it "
        f"({stop}; a training saves where it is), then run this command again"
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (another user's)
        return True
    return True


class Stopped(KeyboardInterrupt):
    """SIGTERM (``kill``, a job scheduler) or SIGHUP (the terminal closed) sent to the driver, raised where it is, as
    an interrupt is: the command running is stopped with it (training saves where it is) before the driver exits.
    By default either signal ended the driver at once, and its training went on unseen beside the rerun."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _raise_stopped(signum, frame) -> None:
    for signum_ in STOP_SIGNALS:  # once: a second signal must not cut short the wait for the command to save
        signal.signal(signum_, signal.SIG_IGN)
    raise Stopped(signum)


@contextlib.contextmanager
def errors_in_one_line(prog: str) -> Iterator[None]:
    """Ends a driver's run on a corpus it cannot use or a command that failed with one line, ``PROG: error:
    ...`` (exit 1; what went wrong was printed above it), and on an interrupt with one line saying how to go on
    (exit 130; 128 + the signal for SIGTERM or SIGHUP, handled as an interrupt), not a traceback. A signal ignored
    when the driver started (SIGHUP under ``nohup``) stays ignored, in the driver and in the commands it starts."""
    in_main = threading.current_thread() is threading.main_thread()  # (signal handlers: the main thread's only)
    handled = [signum for signum in STOP_SIGNALS if in_main and signal.getsignal(signum) is not signal.SIG_IGN]
    with _signals_handled_by(handled, _raise_stopped):
        try:
            yield
        except (text.DataError, CommandFailed, SettingsChanged, InUse) as e:
            sys.exit(f"{prog}: error: {e}")
        except KeyboardInterrupt as e:
            how = f"stopped by {e}" if isinstance(e, Stopped) else "interrupted"
            try:
                print(f"\n{prog}: {how}; run the same command again to go on from here", file=sys.stderr)
            except OSError:  # (the terminal is gone: SIGHUP)
                pass
            sys.exit(128 + e.signum if isinstance(e, Stopped) else 130)


@contextlib.contextmanager
def _signals_handled_by(signums: Sequence[int], handler) -> Iterator[None]:
    """Inside, the signals ``signums`` call ``handler``; the handlers before are put back on the way out."""
    previous = {signum: signal.signal(signum, handler) for signum in signums}
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)


PR_SET_PDEATHSIG = 1  # (linux/prctl.h)


def _stop_with_the_driver() -> Optional[Callable[[], None]]:
    """Where the kernel offers it (Linux), a ``preexec_fn`` that has a command sent SIGTERM when the driver dies,
    even by SIGKILL, which the driver cannot handle: training saves where it is and stops instead of going on,
    unseen, beside the rerun."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    driver, sigterm = os.getpid(), int(signal.SIGTERM)

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, sigterm)
        if os.getppid() != driver:  # the driver died before the request: it will never be sent
            os._exit(128 + sigterm)

    return hook


def child_options(lock: Optional[OutLock] = None) -> Dict[str, object]:
    """``subprocess`` options for a stage's command: it stops when the driver dies (:func:`_stop_with_the_driver`),
    and holds the driver's ``lock`` on OUT while it runs (:func:`alone_in`)."""
    hook = _stop_with_the_driver()
    held = () if lock is None or lock.fd is None else (lock.fd,)
    return {"pass_fds": held, **({} if hook is None else {"preexec_fn": hook})}


def run(
    cmd: Sequence,
    log: Optional[Path] = None,
    append: bool = False,
    quiet: Sequence[str] = (),
    lock: Optional[OutLock] = None,
) -> None:
    """Run a command; :class:`CommandFailed` when it fails. Its output goes to the console and, when given, all of
    it into ``log`` (the lines starting with one of ``quiet`` into ``log`` only). The command holds the driver's
    ``lock`` on OUT, if any, while it runs."""
    cmd = [str(c) for c in cmd]
    print("$ " + shlex.join(cmd), flush=True)
    if log is None:
        returncode = subprocess.run(cmd, **child_options(lock)).returncode  # (an interrupt kills the child)
        if returncode != 0:
            raise failure(cmd, returncode, None)
        return
    with open(log, "a" if append else "w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, **child_options(lock)
        )
        if lock is not None:  # (a command that outlives this driver is named to the next one)
            lock.name(proc.pid, command_name(cmd))
        console = [sys.stdout]

        def copy_output() -> None:
            for line in proc.stdout:
                out.write(line)
                if console and not line.startswith(tuple(quiet)):
                    try:
                        console[0].write(line)
                    except OSError:  # the terminal is gone (closed: SIGHUP): the log keeps the rest
                        console.clear()

        stops: List[int] = []

        def forward(signum, frame) -> None:  # (SIGTERM or SIGHUP: the command stops, its output is read to its end)
            stops.append(signum)
            proc.terminate()

        # SIGTERM and SIGHUP call forward where errors_in_one_line would raise Stopped: raised while a line of the
        # command's output is in hand, between reading and writing it, it lost that line (the last ones, what
        # training saved, when a terminal's hang-up reached both)
        stopping = [signum for signum in STOP_SIGNALS if signal.getsignal(signum) is _raise_stopped]
        try:
            with _signals_handled_by(stopping, forward):
                copy_output()
        except BaseException:
            # a Ctrl-C in the terminal reached the child too; an interrupt sent to this process alone did not, and
            # the child would go on training, unseen, beside the rerun. Training saves where it is and stops
            # (python -m fairseq_convs2s.train, on SIGINT, SIGTERM or SIGHUP): its last lines say what it saved
            proc.terminate()
            copy_output()
            proc.wait()
            raise
        proc.wait()
        if stops:
            raise Stopped(stops[0])
        if proc.returncode != 0:
            raise failure(cmd, proc.returncode, log)


def train_command() -> List[str]:
    """The plugin's entry to fairseq-train, ``python -m fairseq_convs2s.train``, on every device: the same flags and
    training loop, and an interrupt or SIGTERM saves where training is before it stops (fairseq-train stops at once,
    losing every update since its last save: up to an epoch, hours of a WMT run on GPUs); ``--bf16`` is bfloat16 on
    a GPU too (fairseq-train takes it for a TPU); on a CPU it keeps the memory an update frees for the next
    (BENCHMARKS.md, "What bounds them")."""
    return [sys.executable, "-m", "fairseq_convs2s.train"]


def device_flags() -> List[str]:
    """``--cpu`` where torch sees no GPU (fairseq would fail without it); nothing where it does, so that
    fairseq-train uses every visible GPU."""
    import torch  # here, not at the top: a run whose stages are all done never pays for the import

    return [] if torch.cuda.is_available() else ["--cpu"]
