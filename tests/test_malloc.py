"""The training entry's malloc setting (``keep_freed_memory``): a large tensor comes from malloc's heap instead of a
fresh mapping, and stays there for reuse once freed; left alone where the environment sets malloc's options. And
its data loading on a CPU: batches made in the trainer, no worker forking it, unless workers are asked for."""

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from fairseq_convs2s.train import _load_batches_in_trainer

# in a fresh process: apply (or not) the setting, allocate 100 MB, free it; glibc's own accounting (mallinfo2)
# says whether it was mapped afresh and whether its memory stayed in the heap for the next allocation
_SCRIPT = """
import ctypes, sys
import torch
from fairseq_convs2s.train import keep_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
mapped_before = libc.mallinfo2().hblkhd
x = torch.ones(25_000_000)  # 100 MB
mapped = libc.mallinfo2().hblkhd - mapped_before
del x
kept = libc.mallinfo2().fordblks  # free bytes malloc holds in its heap
print(applied, mapped >> 20, kept >> 20)
"""


def _run(mode, **env):
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode],
        capture_output=True,
        text=True,
        check=True,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}, **env},
    ).stdout.split()
    return out[0] == "True", int(out[1]), int(out[2])  # applied, MiB mapped afresh, MiB kept free in the heap


@pytest.fixture(autouse=True)
def _glibc():
    if not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None:
        pytest.fail("these tests check glibc's malloc; this platform has no glibc")


def test_large_tensors_come_from_the_heap_and_stay_there_when_freed():
    applied, mapped, kept = _run("keep")
    assert applied
    assert mapped == 0 and kept >= 95


def test_by_default_glibc_maps_them_afresh_and_unmaps_them():
    """What the setting changes: each such tensor is a new mapping, returned to the system when freed."""
    applied, mapped, kept = _run("default")
    assert not applied
    assert mapped >= 95 and kept < 95


def test_the_users_own_malloc_options_win():
    applied, mapped, kept = _run("keep", MALLOC_MMAP_MAX_="65536")  # glibc's default value
    assert not applied
    assert mapped >= 95 and kept < 95


@pytest.mark.parametrize(
    "cpu, given, workers",
    [(True, [], 0), (True, ["--num-workers"], 3), (False, [], 3)],
)
def test_a_cpu_trainer_makes_its_batches_itself_unless_told_otherwise(cpu, given, workers, caplog):
    args = SimpleNamespace(cpu=cpu, num_workers=3, data="data-bin")
    _load_batches_in_trainer(args, set(given))
    assert args.num_workers == workers and not caplog.records


@pytest.mark.parametrize("cpu", [True, False])
def test_workers_with_sharded_data_are_warned_about(cpu, caplog):
    args = SimpleNamespace(cpu=cpu, num_workers=2, data=f"shard0{os.pathsep}shard1")
    _load_batches_in_trainer(args, {"--num-workers"})
    assert args.num_workers == 2
    assert "--num-workers 2 with sharded data: fairseq 0.12 keeps each epoch's" in caplog.text
