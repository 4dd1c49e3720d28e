"""The curve of a recipe's training run: validation perplexity against wall-clock minutes, as TSV and as a PNG drawn
without plotting libraries, so a user sees what more training time would buy.

read_validation_curve() parses a fairseq-train log; write_curve_tsv() and write_curve_png() write the curve out,
write_curves_png() several runs' curves in one picture.
Standard library only: the PNG is assembled by hand (zlib + struct) and its text uses the 5x7 bitmap font below.
"""

import math
import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

WIDTH, HEIGHT = 640, 400
WHITE, INK, GRID = (255, 255, 255), (40, 40, 40), (225, 225, 225)
LINE_COLOUR = (20, 50, 140)
# one colour a run in a picture of several (write_curves_png), the single run's first
SERIES_COLOURS = (LINE_COLOUR, (200, 80, 20), (30, 130, 60), (150, 40, 150), (110, 110, 20), (20, 140, 160))

# 5x7 glyphs, one "char=hex" token each: seven rows of five bits, the leftmost pixel in bit 4.
_GLYPH_TABLE = """
0=0e11131519110e 1=040c040404040e 2=0e11010204081f 3=1f02040201110e 4=02060a121f0202 5=1f101e0101110e
6=0608101e11110e 7=1f010204080808 8=0e11110e11110e 9=0e11110f01020c .=00000000000c0c ,=000000000c0408
:=000c0c000c0c00 -=0000001f000000 (=02040808080402 )=08040202020408 /=00010204081000 _=0000000000001f
%=18190204081303 +=0004041f040400 ==00001f001f0000
A=0e1111111f1111 B=1e11111e11111e C=0e11101010110e D=1c12111111121c E=1f10101e10101f F=1f10101e101010
G=0e11101711110f H=1111111f111111 I=0e04040404040e J=0702020202120c K=11121418141211 L=1010101010101f
M=111b1515111111 N=11111915131111 O=0e11111111110e P=1e11111e101010 Q=0e11111115120d R=1e11111e141211
S=0f10100e01011e T=1f040404040404 U=1111111111110e V=11111111110a04 W=1111111515150a X=11110a040a1111
Y=1111110a040404 Z=1f01020408101f a=00000e010f110f b=1010161911111e c=00000e1010110e d=01010d1311110f
e=00000e111f100e f=0609081c080808 g=000f11110f010e h=10101619111111 i=04000c0404040e j=0200060202120c
k=10101214181412 l=0c04040404040e m=00001a15151111 n=00001619111111 o=00000e1111110e p=00001e111e1010
q=00000d130f0101 r=00001619101010 s=00000e100e011e t=08081c08080906 u=0000111111130d v=00001111110a04
w=0000111115150a x=0000110a040a11 y=000011110f010e z=00001f0204081f
"""
FONT: Dict[str, Tuple[int, ...]] = {t[0]: tuple(bytes.fromhex(t[2:])) for t in _GLYPH_TABLE.split()}
FONT[" "] = (0,) * 7
_BOX = (0x1F, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1F)

_VALID_RE = re.compile(r"\| valid \| epoch (\d+) \| valid on '([^']*)' subset \| (.*)$")
_TRAIN_RE = re.compile(r"\| train \| epoch \d+ \| (.*)$")
_INNER_WALL_RE = re.compile(r"\| train_inner \| .*\bwall=([0-9.]+)")


class CurvePoint(NamedTuple):
    minutes: float
    epoch: int
    num_updates: int
    loss: float
    nll_loss: float
    ppl: float


def _fields(text: str) -> Dict[str, str]:
    """'loss 8.402 | nll_loss 7.651 | ...' as a dict of strings."""
    pairs = (part.strip().partition(" ") for part in text.split("|"))
    return {key: value.strip() for key, _, value in pairs if key}


def train_inner_values(log_text: str, name: str) -> List[float]:
    """The values of one field (``wps``, ``ups``, ...) of a fairseq-train log's ``train_inner`` lines, in order."""
    return [float(value) for value in re.findall(rf"\| train_inner \|.*?\b{re.escape(name)}=([0-9.]+)", log_text)]


def read_validation_curve(log_text: str) -> List[CurvePoint]:
    """The validation points of a fairseq-train log (several appended runs allowed), one per num_updates, in order.

    A point's minutes are the ``wall`` of the epoch's train summary that follows it, or else of the last
    ``train_inner`` line before it; a point with neither is left out. Only the first validation subset seen is used.
    """
    points: Dict[int, CurvePoint] = {}
    pending: List[Tuple[Dict[str, str], int, Optional[float]]] = []  # valid lines awaiting their train summary
    inner_wall: Optional[float] = None
    subset: Optional[str] = None

    def settle(wall: Optional[float], fields: Dict[str, str], epoch: int) -> None:
        if wall is None or "num_updates" not in fields or "loss" not in fields:
            return
        loss = float(fields["loss"])
        nll = float(fields.get("nll_loss", loss))
        ppl = float(fields.get("ppl", 2.0**nll))
        updates = int(float(fields["num_updates"]))
        points[updates] = CurvePoint(wall / 60.0, epoch, updates, loss, nll, ppl)

    for line in log_text.splitlines():
        line = line.rstrip()
        valid, train, inner = _VALID_RE.search(line), _TRAIN_RE.search(line), _INNER_WALL_RE.search(line)
        if valid:
            subset = subset or valid.group(2)
            if valid.group(2) == subset:
                pending.append((_fields(valid.group(3)), int(valid.group(1)), inner_wall))
        elif train:
            summary = _fields(train.group(1))
            for fields, epoch, fallback in pending:
                same = fields.get("num_updates") == summary.get("num_updates") and "wall" in summary
                settle(float(summary["wall"]) if same else fallback, fields, epoch)
            pending = []
        elif inner:
            inner_wall = float(inner.group(1))
    for fields, epoch, fallback in pending:
        settle(fallback, fields, epoch)
    return [points[k] for k in sorted(points)]


def write_curve_tsv(points: Sequence[CurvePoint], path) -> None:
    """Write the points as a tab-separated table with a header line; minutes to 2 decimals."""
    rows = ["minutes\tepoch\tnum_updates\tvalid_loss\tvalid_nll_loss\tvalid_ppl"]
    rows += [f"{p.minutes:.2f}\t{p.epoch}\t{p.num_updates}\t{p.loss}\t{p.nll_loss}\t{p.ppl}" for p in points]
    Path(path).write_text("\n".join(rows) + "\n", encoding="utf-8")


def _label(value: float) -> str:
    value = round(value, 10)
    return f"{int(value):,}" if value >= 1 and value == int(value) else f"{value:g}"


def _nice_step(span: float, target: int = 6) -> float:
    raw = span / target
    magnitude = 10.0 ** math.floor(math.log10(raw))
    return next(f * magnitude for f in (1, 2, 5, 10) if f * magnitude >= raw * (1 - 1e-9))


def _nice_values(lo: float, hi: float) -> List[float]:
    """The values 1, 2 and 5 times a power of ten, from the largest <= lo to the smallest >= hi."""
    decades = range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 2)
    candidates = [m * 10.0**k for k in decades for m in (1, 2, 5)]
    start = max(c for c in candidates if c <= lo * (1 + 1e-9))
    stop = min(c for c in candidates if c >= hi * (1 - 1e-9))
    return [c for c in candidates if start <= c <= stop]


@dataclass(frozen=True)
class PlotArea:
    """Where the data go in the image: the plot rectangle in pixels, the x range from 0 and the log10 y range."""

    left: int
    top: int
    right: int
    bottom: int
    x_max: float
    log_lo: float
    log_hi: float
    x_ticks: Tuple[float, ...]
    y_ticks: Tuple[float, ...]

    def x_pixel(self, minutes: float) -> int:
        return round(self.left + minutes / self.x_max * (self.right - self.left))

    def y_pixel(self, ppl: float) -> int:
        fraction = (math.log10(ppl) - self.log_lo) / (self.log_hi - self.log_lo)
        return round(self.bottom - fraction * (self.bottom - self.top))


def _plottable(points: Sequence[CurvePoint]) -> List[CurvePoint]:
    """The points a log-scale plot can place: a finite positive perplexity at a finite minute."""
    return [p for p in points if math.isfinite(p.ppl) and p.ppl > 0 and math.isfinite(p.minutes)]


def plot_area(points: Sequence[CurvePoint]) -> PlotArea:
    """The axes write_curve_png() draws for these points (raises ValueError when there is nothing to plot)."""
    points = _plottable(points)
    if not points:
        raise ValueError("no validation points with a finite positive perplexity to plot")
    # a budget's last validation comes seconds after its round number of minutes (30.08 of 30): the axis may end
    # up to 1% before the last point, which then lies in the right margin, rather than a whole step after it
    span = (max(max(p.minutes for p in points), 0.0) or 1.0) / 1.01
    step = _nice_step(span)
    x_max = math.ceil(span / step - 1e-9) * step
    lo, hi = min(p.ppl for p in points), max(p.ppl for p in points)
    if hi / lo < 1.01:
        lo, hi = lo / 2, hi * 2
    y_ticks = _nice_values(lo, hi)
    if len(y_ticks) > 12:  # many decades: powers of ten only
        y_ticks = [10.0**k for k in range(math.floor(math.log10(lo) + 1e-9), math.ceil(math.log10(hi) - 1e-9) + 1)]
    x_ticks = tuple(i * step for i in range(round(x_max / step) + 1))
    return PlotArea(
        70, 50, WIDTH - 30, HEIGHT - 55, x_max, math.log10(y_ticks[0]), math.log10(y_ticks[-1]), x_ticks, tuple(y_ticks)
    )


class _Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(WHITE) * (width * height))

    def rect(self, x: int, y: int, w: int, h: int, colour: Tuple[int, int, int]) -> None:
        x0, x1 = max(x, 0), min(x + w, self.width)
        for row in range(max(y, 0), min(y + h, self.height)):
            if x1 > x0:
                start = (row * self.width + x0) * 3
                self.pixels[start : start + (x1 - x0) * 3] = bytes(colour) * (x1 - x0)

    def line(self, x0: int, y0: int, x1: int, y1: int, colour: Tuple[int, int, int], width: int = 2) -> None:
        """Bresenham, stamping a width x width square at each step."""
        dx, dy, sx, sy = abs(x1 - x0), -abs(y1 - y0), 1 if x0 < x1 else -1, 1 if y0 < y1 else -1
        err = dx + dy
        while True:
            self.rect(x0, y0, width, width, colour)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err, x0 = err + dy, x0 + sx
            if e2 <= dx:
                err, y0 = err + dx, y0 + sy

    def text(self, x: int, y: int, text: str, colour: Tuple[int, int, int], scale: int = 1) -> None:
        for i, char in enumerate(text):
            for row, bits in enumerate(FONT.get(char, _BOX)):
                for col in range(5):
                    if bits >> (4 - col) & 1:
                        self.rect(x + (i * 6 + col) * scale, y + row * scale, scale, scale, colour)

    def png(self) -> bytes:
        def chunk(tag: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

        stride = self.width * 3
        raw = b"".join(b"\x00" + self.pixels[y * stride : (y + 1) * stride] for y in range(self.height))
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
        )


def _text_width(text: str, scale: int = 1) -> int:
    return max(len(text) * 6 - 1, 0) * scale


def write_curve_png(points: Sequence[CurvePoint], path, title: str) -> None:
    """Draw validation perplexity (log scale) against training minutes as a 640x400 RGB PNG at ``path``."""
    write_curves_png([("", points)], path, title)


def write_curves_png(series: Sequence[Tuple[str, Sequence[CurvePoint]]], path, title: str) -> None:
    """Draw several runs' curves, ``(name, points)`` each, on one pair of axes: one colour a run
    (``SERIES_COLOURS`` in order), named with its last perplexity in a legend; a single run gets no legend, its
    last perplexity beside its last point."""
    if len(series) > len(SERIES_COLOURS):
        raise ValueError(f"{len(series)} curves: one picture draws at most {len(SERIES_COLOURS)}")
    series = [(name, _plottable(points)) for name, points in series]
    area = plot_area([p for _, points in series for p in points])
    canvas = _Canvas(WIDTH, HEIGHT)
    for value in area.y_ticks:
        y = area.y_pixel(value)
        canvas.rect(area.left, y, area.right - area.left, 1, GRID)
        canvas.rect(area.left - 4, y, 4, 1, INK)
        label = _label(value)
        canvas.text(area.left - 7 - _text_width(label), y - 3, label, INK)
    for value in area.x_ticks:
        x = area.x_pixel(value)
        canvas.rect(x, area.top, 1, area.bottom - area.top, GRID)
        canvas.rect(x, area.bottom, 1, 4, INK)
        label = _label(value)
        canvas.text(x - _text_width(label) // 2, area.bottom + 7, label, INK)
    canvas.rect(area.left, area.top, 1, area.bottom - area.top + 1, INK)
    canvas.rect(area.left, area.bottom, area.right - area.left + 1, 1, INK)
    scale = 2 if _text_width(title, 2) <= WIDTH - 20 else 1
    canvas.text((WIDTH - _text_width(title, scale)) // 2, 10, title, INK, scale)
    canvas.text(10, area.top - 16, "validation perplexity", INK)
    x_title = "training minutes"
    canvas.text((area.left + area.right - _text_width(x_title)) // 2, area.bottom + 27, x_title, INK)
    legend = []
    for (name, points), colour in zip(series, SERIES_COLOURS):
        xy = [(area.x_pixel(p.minutes), area.y_pixel(p.ppl)) for p in points]
        for (x0, y0), (x1, y1) in zip(xy, xy[1:]):
            canvas.line(x0, y0, x1, y1, colour)
        for x, y in xy:
            canvas.rect(x - 2, y - 2, 5, 5, colour)
        last = f"{points[-1].ppl:.2f}" if points else "no points"
        legend.append((f"{name}: {last}", colour))
        if len(series) == 1:  # no legend: the last perplexity beside the last point
            x, y = xy[-1]
            label_x = x + 6 if x + 6 + _text_width(last) < WIDTH - 2 else x - 6 - _text_width(last)
            canvas.text(label_x, y - 12 if y - 12 >= 0 else y + 6, last, colour)
    if len(series) > 1:  # top right, inside the plot, where the falling curves are not
        room = (area.right - area.left - 30) // 6  # characters that fit beside the swatch
        for i, (label, colour) in enumerate(legend):
            label = label if len(label) <= room else ".." + label[len(label) - room + 2 :]  # the name's end shows
            x, y = area.right - 8 - _text_width(label) - 14, area.top + 8 + 12 * i
            canvas.rect(x, y + 2, 9, 3, colour)
            canvas.text(x + 14, y, label, colour)
    Path(path).write_bytes(canvas.png())
