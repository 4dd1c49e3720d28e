"""Find the lines of text files that are not valid UTF-8, before fairseq-preprocess (which stops at the first one
with a UnicodeDecodeError that names a byte offset inside an 8 KB chunk, not the line).

    python scripts/check_utf8.py train.de train.en ...

Prints ``FILE:LINE: invalid UTF-8 at byte N of the line: <the line>`` for each bad line (``FILE: cannot be read
(...)`` for a file that is missing or a folder) and exits 1 if there is one. To repair: ``iconv -f LATIN1 -t UTF-8``
when the file is really Latin-1, or ``iconv -c -f UTF-8 -t UTF-8`` to drop the invalid bytes (then re-check the line
count of each side of the parallel data).
"""

import sys
from typing import Iterator, Tuple


def invalid_lines(path: str) -> Iterator[Tuple[int, int, bytes]]:
    """(line number from 1, byte offset in the line, the raw line) for every line that does not decode as UTF-8."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                yield number, e.start, line.rstrip(b"\r\n")


def main(paths) -> int:
    bad = 0
    for path in paths:
        try:
            for number, offset, line in invalid_lines(path):
                bad += 1
                text = line.decode("utf-8", errors="backslashreplace")
                print(f"{path}:{number}: invalid UTF-8 at byte {offset} of the line: {text}")
        except OSError as e:  # missing, a folder, unreadable: say so and go on with the other files
            bad += 1
            print(f"{path}: cannot be read ({e.strerror or e})")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
