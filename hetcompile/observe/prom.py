"""Prometheus text exposition (version 0.0.4) read back: samples, counters, histograms.

Notation: a scrape is a map (name, labels) -> value. A histogram H of one metric is its cumulative
buckets (le_j, N_j) with N_j the observations <= le_j (the last le_j = +Inf), its sum and its count.
Between two scrapes of one process every counter and bucket only grows, so the window's histogram
is the difference of the two (a smaller value means the process restarted: `Hist.minus` says so).

q-quantile of a histogram, as Prometheus's histogram_quantile computes it: the bucket j where
N_j first reaches q N, linear inside it from le_{j-1} (0 for the first) to le_j; in the +Inf
bucket, the largest finite bound (the histogram cannot say more).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(\s+\S+)?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


class ExpositionError(ValueError):
    """A /metrics body that is not Prometheus's text format."""


def _unescape(v: str) -> str:
    return v.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")


def _labels(text: str, line: str) -> Labels:
    body, out, pos = text[1:-1], [], 0
    while pos < len(body):
        m = _LABEL.match(body, pos)
        if m is None:
            raise ExpositionError(f"bad labels in {line[:120]!r}")
        out.append((m.group(1), _unescape(m.group(2))))
        pos = m.end()
    return tuple(sorted(out))


def parse(text: str) -> Samples:
    """Every sample of an exposition body; comments and blank lines skipped."""
    out: Samples = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            raise ExpositionError(f"not a Prometheus sample line: {line[:120]!r}")
        name, labels, value = m.group(1), m.group(2), m.group(3)
        try:
            v = float(value)
        except ValueError:
            raise ExpositionError(f"bad value {value!r} in {line[:120]!r}") from None
        out[(name, _labels(labels, line) if labels else ())] = v
    return out


def _matches(labels: Labels, match: dict[str, str]) -> bool:
    d = dict(labels)
    return all(d.get(k) == v for k, v in match.items())


def total(samples: Samples, name: str, match: dict[str, str] | None = None) -> float | None:
    """The sum of `name` over its series whose labels include `match` (None: no such series)."""
    vals = [v for (n, ls), v in samples.items() if n == name and _matches(ls, match or {})]
    return sum(vals) if vals else None


@dataclass(frozen=True)
class Hist:
    """A histogram's cumulative buckets (le, N <= le) in increasing le, its sum and count."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def minus(self, earlier: Hist) -> Hist | None:
        """This scrape's histogram less an earlier one of the same process; None when any series
        went down (the process restarted between them) or the bucket bounds differ."""
        if [b for b, _ in self.buckets] != [b for b, _ in earlier.buckets]:
            return None
        d = tuple((le, n - m) for (le, n), (_, m) in zip(self.buckets, earlier.buckets))
        if self.count < earlier.count or any(n < 0 for _, n in d):
            return None
        return Hist(d, self.sum - earlier.sum, self.count - earlier.count)

    def plus(self, other: Hist | None) -> Hist | None:
        """Two processes' histograms of one metric together (None: the bucket bounds differ)."""
        if other is None:
            return self
        if [b for b, _ in self.buckets] != [b for b, _ in other.buckets]:
            return None
        return Hist(tuple((le, n + m) for (le, n), (_, m) in zip(self.buckets, other.buckets)), self.sum + other.sum,
                    self.count + other.count)

    def quantile(self, q: float) -> float | None:
        """histogram_quantile(q) (module docstring); None for an empty histogram."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        lo, below = 0.0, 0.0
        for le, n in self.buckets:
            if n >= rank and n > below:
                if math.isinf(le):
                    return lo
                return lo + (le - lo) * (rank - below) / (n - below)
            if not math.isinf(le):
                lo = le
            below = n
        return lo


def histogram(samples: Samples, name: str, match: dict[str, str] | None = None) -> Hist | None:
    """`name`'s histogram summed over its series whose labels include `match` (None: absent)."""
    match = match or {}
    by_le: dict[float, float] = {}
    for (n, ls), v in samples.items():
        if n == name + "_bucket" and _matches(ls, match):
            le = dict(ls).get("le")
            if le is None:
                continue
            by_le[float(le)] = by_le.get(float(le), 0.0) + v
    count = total(samples, name + "_count", match)
    s = total(samples, name + "_sum", match)
    if not by_le or count is None or s is None:
        return None
    return Hist(tuple(sorted(by_le.items())), s, count)
