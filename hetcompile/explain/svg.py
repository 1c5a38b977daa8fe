"""A small SVG writer for plan.md's two charts: axes with round ticks, horizontal bars, lines and markers.

Written by hand instead of through matplotlib: a build drew its two charts in 1-2 s, most of it
importing matplotlib (and Pyomo's hook that finalizes it), for files of a few dozen shapes. These
are plain SVG 1.1 elements, byte-stable (coordinates rounded to 0.1 px, no dates, no ids from a
hash), text left as text in the viewer's sans-serif.

    Frame(width, height, left, right, top, bottom)    the plot area inside margins (px)
    Axis(lo, hi)                                       data -> px along one side, ticks = nice_ticks
    nice_ticks(lo, hi, n)                              about n ticks at 1, 2, 2.5 or 5 x 10^k

Text widths are estimated (TEXT_EM x font size per character), which is what the margins are
sized by: generous enough for DejaVu Sans or Arial.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from xml.sax.saxutils import escape

FONT_PX = 12
TEXT_EM = 0.6  # mean character width, in font sizes (sans-serif, digits and lower case)
GRID = "#b0b0b0"


def text_width(s: str, size: float = FONT_PX) -> float:
    return TEXT_EM * size * len(s)


def _n(x: float) -> str:
    """A coordinate, rounded to 0.1 px, without a trailing '.0'."""
    v = round(x, 1)
    return str(int(v)) if v == int(v) else f"{v:.1f}"


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Ticks covering [lo, hi] at a step of 1, 2, 2.5 or 5 x 10^k, about n of them (the first at or
    below lo, the last at or above hi)."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        lo, hi = 0.0, 1.0
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step + 1e-9) * step
    ticks = []
    k = 0
    while True:
        t = first + k * step
        ticks.append(round(t, 12))
        if t >= hi - 1e-9 * step:
            return ticks
        k += 1


def tick_label(v: float, ticks: list[float]) -> str:
    """A tick's text: as many decimals as the step needs, never '-0'."""
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else 1.0
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) if step < 1 else 0
    if step < 1 and round(step * 10 ** decimals) % 10 and round(step * 10 ** (decimals + 1)) % 10:
        decimals += 1  # 0.25
    text = f"{v:.{decimals}f}"
    return "0" if float(text) == 0 else text


@dataclass(frozen=True)
class Axis:
    """Data values lo..hi onto pixels a..b (b < a for a y axis, which grows upwards)."""

    lo: float
    hi: float
    a: float
    b: float

    def __call__(self, v: float) -> float:
        return self.a + (v - self.lo) / (self.hi - self.lo) * (self.b - self.a)


class Svg:
    """An SVG document built element by element."""

    def __init__(self, width: float, height: float) -> None:
        self.width, self.height = width, height
        self.parts: list[str] = []

    def line(self, x1: float, y1: float, x2: float, y2: float, color: str, width: float = 1.0,
             dash: str | None = None) -> None:
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(f'<line x1="{_n(x1)}" y1="{_n(y1)}" x2="{_n(x2)}" y2="{_n(y2)}" stroke="{color}" '
                          f'stroke-width="{_n(width)}"{d}/>')

    def rect(self, x: float, y: float, w: float, h: float, fill: str, stroke: str | None = None) -> None:
        s = f' stroke="{stroke}"' if stroke else ""
        self.parts.append(f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(max(0.0, w))}" height="{_n(max(0.0, h))}" '
                          f'fill="{fill}"{s}/>')

    def polyline(self, pts: list[tuple[float, float]], color: str, width: float = 1.5) -> None:
        p = " ".join(f"{_n(x)},{_n(y)}" for x, y in pts)
        self.parts.append(f'<polyline points="{p}" fill="none" stroke="{color}" stroke-width="{_n(width)}"/>')

    def marker(self, kind: str, x: float, y: float, color: str, size: float = 6.0) -> None:
        """'o' a dot, 'x' a cross, '*' a five-pointed star (size: its outer radius)."""
        if kind == "o":
            self.parts.append(f'<circle cx="{_n(x)}" cy="{_n(y)}" r="{_n(size / 2)}" fill="{color}"/>')
        elif kind == "x":
            h = size / 2
            self.line(x - h, y - h, x + h, y + h, color, 1.5)
            self.line(x - h, y + h, x + h, y - h, color, 1.5)
        else:
            pts = []
            for k in range(10):
                r = size if k % 2 == 0 else size * 0.4
                a = -math.pi / 2 + k * math.pi / 5
                pts.append(f"{_n(x + r * math.cos(a))},{_n(y + r * math.sin(a))}")
            self.parts.append(f'<polygon points="{" ".join(pts)}" fill="{color}"/>')

    def text(self, x: float, y: float, s: str, anchor: str = "start", size: float = FONT_PX, bold: bool = False,
             rotate: bool = False) -> None:
        extra = ' font-weight="bold"' if bold else ""
        if rotate:
            extra += f' transform="rotate(-90 {_n(x)} {_n(y)})"'
        self.parts.append(f'<text x="{_n(x)}" y="{_n(y)}" font-size="{_n(size)}" text-anchor="{anchor}"{extra}>'
                          f"{escape(s)}</text>")

    def render(self) -> str:
        head = (f'<?xml version="1.0" encoding="utf-8"?>\n<svg xmlns="http://www.w3.org/2000/svg" version="1.1" '
                f'width="{_n(self.width)}" height="{_n(self.height)}" viewBox="0 0 {_n(self.width)} {_n(self.height)}" '
                'font-family="DejaVu Sans, Arial, sans-serif">\n'
                f'<rect x="0" y="0" width="{_n(self.width)}" height="{_n(self.height)}" fill="white"/>\n')
        return head + "\n".join(self.parts) + "\n</svg>\n"


def x_axis(svg: Svg, ax: Axis, ticks: list[float], y0: float, y1: float, label: str) -> None:
    """Vertical grid lines at the ticks between y0 (top) and y1 (bottom), tick labels and the axis label below."""
    for t in ticks:
        x = ax(t)
        svg.line(x, y0, x, y1, GRID, 0.5)
        svg.text(x, y1 + FONT_PX + 2, tick_label(t, ticks), "middle")
    svg.line(ax.a, y1, ax.b, y1, "black")
    svg.text((ax.a + ax.b) / 2, y1 + 2 * FONT_PX + 8, label, "middle")


def y_axis(svg: Svg, ay: Axis, ticks: list[float], x0: float, x1: float, label: str) -> None:
    """Horizontal grid lines at the ticks between x0 (left) and x1 (right), tick labels left of x0 and
    the axis label, turned, left of those."""
    for t in ticks:
        y = ay(t)
        svg.line(x0, y, x1, y, GRID, 0.5)
        svg.text(x0 - 4, y + FONT_PX / 3, tick_label(t, ticks), "end")
    svg.line(x0, ay.a, x0, ay.b, "black")
    widest = max(text_width(tick_label(t, ticks)) for t in ticks)
    svg.text(x0 - widest - 12, (ay.a + ay.b) / 2, label, "middle", rotate=True)


def legend(svg: Svg, x_left: float, y_top: float, items: list[tuple[str, str, str]]) -> None:
    """A boxed legend inside the plot's upper left corner (x_left, y_top): (marker 'o', 'x', '*' or
    '-' for a line or '--' for a dashed one, color, text) per row."""
    row = FONT_PX + 6
    w = 34 + max(text_width(t) for _, _, t in items)
    h = row * len(items) + 6
    x, y = x_left + 6, y_top + 6
    svg.rect(x, y, w, h, "white", GRID)
    for k, (kind, color, t) in enumerate(items):
        cy = y + 3 + row * k + row / 2
        if kind in ("-", "--"):
            svg.line(x + 6, cy, x + 26, cy, color, 1.5, "5,3" if kind == "--" else None)
        else:
            svg.marker(kind, x + 16, cy, color, 8.0 if kind == "*" else 5.0)
        svg.text(x + 32, cy + FONT_PX / 3, t)
