"""Running a recipe's commands: each stage's header, the fairseq tools as this Python runs them, and a failed or
interrupted command as one line (``run.py: error: ...``, exit 1; 130 on an interrupt), not a traceback."""

import contextlib
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Optional, Sequence

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


@contextlib.contextmanager
def errors_in_one_line(prog: str) -> Iterator[None]:
    """Ends a driver's run on a corpus it cannot use or a command that failed with one line, ``PROG: error:
    ...`` (exit 1; what went wrong was printed above it), and on an interrupt with one line saying how to go on
    (exit 130), not a traceback."""
    try:
        yield
    except (text.DataError, CommandFailed, SettingsChanged) as e:
        sys.exit(f"{prog}: error: {e}")
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted; run the same command again to go on from here", file=sys.stderr)
        sys.exit(130)


def run(cmd: Sequence, log: Optional[Path] = None, append: bool = False, quiet: Sequence[str] = ()) -> None:
    """Run a command; :class:`CommandFailed` when it fails. Its output goes to the console and, when given, all of
    it into ``log`` (the lines starting with one of ``quiet`` into ``log`` only)."""
    cmd = [str(c) for c in cmd]
    print("$ " + shlex.join(cmd), flush=True)
    if log is None:
        returncode = subprocess.run(cmd).returncode  # on an exception (Ctrl-C) subprocess.run kills the child
        if returncode != 0:
            raise failure(cmd, returncode, None)
        return
    with open(log, "a" if append else "w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)

        def copy_output() -> None:
            for line in proc.stdout:
                if not line.startswith(tuple(quiet)):
                    sys.stdout.write(line)
                out.write(line)

        try:
            copy_output()
        except BaseException:
            # a Ctrl-C in the terminal reached the child too; an interrupt sent to this process alone did not,
            # and the child would go on training, unseen, beside the rerun. Training saves where it is and stops
            # (python -m fairseq_convs2s.train, on SIGINT or SIGTERM): its last lines say what it saved
            proc.terminate()
            copy_output()
            proc.wait()
            raise
        if proc.wait() != 0:
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
