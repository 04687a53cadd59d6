"""Limits a candle CSV must keep before pandas parses it: a hostile file is refused in one line.

pandas reads a line whole and a header of repeated names in quadratic time, so a 2 MB header, or one 200 MB line,
took minutes and gigabytes. Candle rows are short (a timestamp and five numbers: under 200 bytes; exchange exports
with extra columns under a few kilobytes), so the limits below refuse nothing real.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np

from r1trade.errors import DataError

MAX_LINE_BYTES = 64 * 1024
"""Longest line (the header included) a candle CSV may have."""
MAX_COLUMNS = 512
"""Most columns a candle CSV may have."""
_CHUNK_BYTES = 1 << 20
_BREAKS = (ord("\n"), ord("\r"))


def bounded_lines(handle: IO[str], path: Path) -> Iterator[str]:
    """The lines of a text file, each read with a bounded read: a line longer than MAX_LINE_BYTES (counted in
    characters, which are at least a byte each) is an error before it is read whole."""
    number = 0
    while line := handle.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(line.rstrip("\r\n")) > MAX_LINE_BYTES:
            raise DataError(_too_long(path, number))
        yield line


def check_line_lengths(path: Path) -> None:
    """Refuse a file with a line longer than MAX_LINE_BYTES, reading it once in 1 MiB pieces (linear time, memory
    bounded); `\\n` and `\\r` both end a line, as they do for pandas."""
    run = 0  # bytes since the last line break, carried from one piece into the next
    newlines = 0  # `\n` before the current piece, for the line number
    with path.open("rb") as handle:
        while piece := handle.read(_CHUNK_BYTES):
            data = np.frombuffer(piece, dtype=np.uint8)
            breaks = np.flatnonzero((data == _BREAKS[0]) | (data == _BREAKS[1]))  # (k,) positions in the piece
            lengths = np.diff(breaks, prepend=-1) - 1  # (k,) bytes of the line each break ends
            if len(lengths):
                lengths[0] += run
                longest = int(np.argmax(lengths))
                if lengths[longest] > MAX_LINE_BYTES:
                    before = newlines + int(np.count_nonzero(data[: breaks[longest]] == _BREAKS[0]))
                    raise DataError(_too_long(path, before + 1))
                run = len(piece) - int(breaks[-1]) - 1
            else:
                run += len(piece)
            if run > MAX_LINE_BYTES:
                raise DataError(_too_long(path, newlines + int(np.count_nonzero(data == _BREAKS[0])) + 1))
            newlines += int(np.count_nonzero(data == _BREAKS[0]))


def check_columns(cells: list[str], path: Path) -> None:
    """Refuse a header (or first row) of more than MAX_COLUMNS cells."""
    if len(cells) > MAX_COLUMNS:
        raise DataError(
            f"'{path}' has {len(cells):,} columns; a candle file has at most {MAX_COLUMNS} (is it a candle CSV?)"
        )


def check_unique_names(cells: list[str], path: Path) -> None:
    """Refuse a header that names a column twice: which of the two is the close would be a guess."""
    repeated = [name for name, count in Counter(cells).items() if count > 1]
    if repeated:
        raise DataError(f"'{path}': the header names column '{repeated[0][:40]}' more than once")


def _too_long(path: Path, number: int) -> str:
    return (
        f"'{path}': line {number:,} is longer than {MAX_LINE_BYTES:,} bytes, where a candle row takes a few hundred "
        "(is it a candle CSV?)"
    )
