"""Fetching and unpacking the public corpora. Kept apart from everything else: it is the only part that needs
the internet, and ``--raw-dir`` skips it entirely.

``--mirror URL`` fetches every file as ``URL/<file name>`` instead of from its home (a local mirror, a proxy, or
``file:///path`` to archives downloaded by hand).
"""

import http.client
import re
import shutil
import tarfile
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, Tuple

from .text import DataError, find_raw_file, read_pairs

_SEG = re.compile(r"<seg.*?>(.*)</seg>")


def fetch(url: str, folder: Path, name: Optional[str] = None, mirror: Optional[str] = None) -> Path:
    """Download ``url`` into ``folder`` (as ``name``, default: the URL's last part) unless it is already there."""
    name = name or url.rstrip("/").rsplit("/", 1)[-1]
    target = folder / name
    if target.exists():
        print(f"   {name}: already downloaded")
        return target
    if mirror:
        url = mirror.rstrip("/") + "/" + name
    folder.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(name + ".partial")
    print(f"   downloading {url}", flush=True)
    request = urllib.request.Request(url, headers={"User-Agent": "fairseq-convs2s-recipes"})
    try:
        with urllib.request.urlopen(request) as response, open(partial, "wb") as out:
            shutil.copyfileobj(response, out, length=1 << 20)
    except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException) as e:
        partial.unlink(missing_ok=True)
        reason = e if isinstance(e, urllib.error.HTTPError) else getattr(e, "reason", None) or e  # HTTP Error 404: ...
        raise DataError(
            f"could not download {url} ({reason}): give --raw-dir with the corpus's files, or --mirror with a "
            "folder or server that holds them"
        ) from None
    partial.rename(target)  # only a complete file gets the final name, so an interrupted run downloads again
    return target


def extract(archive: Path, folder: Path) -> Path:
    """Unpack a .tar/.tgz/.tar.gz archive into ``folder`` once (a marker file records that it was done)."""
    marker = folder / f".extracted-{archive.name}"
    if not marker.exists():
        print(f"   extracting {archive.name}", flush=True)
        folder.mkdir(parents=True, exist_ok=True)
        try:
            with tarfile.open(archive) as tar:
                if hasattr(tarfile, "data_filter"):  # Python >= 3.8.17: refuse absolute paths, links out, devices
                    tar.extractall(folder, filter="data")
                else:
                    tar.extractall(folder)
        except (tarfile.TarError, EOFError, zlib.error) as e:  # not an archive, or one cut short
            reason = str(e).splitlines()[0].rstrip(":") if str(e) else type(e).__name__
            raise DataError(
                f"{archive} cannot be unpacked ({reason}): delete it and run again to download it"
            ) from None
        marker.touch()
    return folder


def sgm_segments(path: Path) -> Iterator[str]:
    """The sentences of a WMT ``.sgm`` file, one per ``<seg id=...>`` line.

    Read exactly as sacrebleu reads them (entities left as they are, whitespace collapsed), so the references
    scored here are the ones ``sacrebleu -t wmt14/full`` uses.
    """
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = _SEG.search(line) if line.startswith("<seg ") else None
            if m:
                yield " ".join(m.group(1).split())


def split_train_valid(
    corpora: Sequence[Tuple[Path, Path]], out: Path, langs: Tuple[str, str], valid_every: int
) -> Tuple[int, int]:
    """Concatenate parallel corpora into ``out/train.<lang>``, holding out every ``valid_every``-th pair (counted
    over the concatenation) as ``out/valid.<lang>``: how fairseq's prepare-wmt14 scripts make their valid set.
    Returns (train pairs, valid pairs)."""
    out.mkdir(parents=True, exist_ok=True)
    a, b = langs
    counts = {"train": 0, "valid": 0}
    files = {
        (split, lang): open(out / f"{split}.{lang}.partial", "w", encoding="utf-8")
        for split in counts
        for lang in langs
    }
    n = 0
    for src, tgt in corpora:
        print(f"   {src.name} + {tgt.name}", flush=True)
        for s, t in read_pairs(src, tgt):
            n += 1
            split = "valid" if n % valid_every == 0 else "train"
            files[split, a].write(s + "\n")
            files[split, b].write(t + "\n")
            counts[split] += 1
    for (split, lang), f in files.items():
        f.close()
        (out / f"{split}.{lang}.partial").rename(out / f"{split}.{lang}")
    return counts["train"], counts["valid"]


def write_lines(lines: Iterator[str], path: Path) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
            n += 1
    return n


def wmt14_downloader(
    archives: Sequence[str], corpora: Sequence[str], langs: Tuple[str, str], test_sgm: Tuple[str, str], valid_every: int
) -> Callable[[Path, Optional[str]], Path]:
    """A recipe's ``download``: fetch the statmt.org archives, then write ``prepared/{train,valid,test}.<lang>``.

    ``corpora`` are file stems inside the unpacked archives (``training/europarl-v7.de-en`` for
    ``training/europarl-v7.de-en.en`` and ``.de``; a ``.gz`` next to the stem is read as is); ``test_sgm`` the
    source and reference ``.sgm`` of newstest2014 in ``test-full/``.
    """

    def download(folder: Path, mirror: Optional[str] = None) -> Path:
        orig, prepared = folder / "orig", folder / "prepared"
        if (prepared / f"test.{langs[1]}").exists():
            return prepared
        for url in archives:
            extract(fetch(url, folder, mirror=mirror), orig)
        pairs = []
        for stem in corpora:  # (plain, or .gz as giga-fren is shipped)
            pairs.append(tuple(find_raw_file((orig / stem).parent, f"{Path(stem).name}.{lang}") for lang in langs))
        sgm_files = [orig / "test-full" / name for name in test_sgm]
        for path in sgm_files:  # (before the training corpora are split, not after)
            if not path.is_file():
                raise DataError(f"{path} not found: no archive held it; put it there and run again, or give --raw-dir")
        n_train, n_valid = split_train_valid(pairs, prepared, langs, valid_every)
        print(f"   {n_train} training pairs, every {valid_every}th pair held out: {n_valid} valid pairs")
        test = [prepared / f"test.{lang}" for lang in langs]
        for sgm, path in zip(sgm_files, test):
            n = write_lines(sgm_segments(sgm), path.with_name(path.name + ".partial"))
        for path in test:  # (the target's last: it marks the download prepared, so only once both are whole)
            path.with_name(path.name + ".partial").rename(path)
        print(f"   newstest2014: {n} pairs")
        return prepared

    return download
