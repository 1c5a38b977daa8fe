"""Numbers and words for people: SI suffixes, money, plurals. Never scientific notation.

Every human output (error messages, build lines, plan.md, `explain` text/md, diffs) formats
numbers through these functions, so `23.4k tokens/s` and `$0.0005/h` read the same everywhere;
machine outputs (plan.json, routing.json, explain json) keep their canonical floats.

Notation: `sig` is the number of significant digits kept; a value v with |v| >= 1000 is written
v / 1000^k with the suffix k, M, G, T (k = 1..4) and `sig` significant digits.
"""

from __future__ import annotations

import math

_SUFFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def _fixed(x: float, sig: int) -> str:
    """`x` with `sig` significant digits in positional notation, trailing zeros dropped."""
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    decimals = max(0, sig - 1 - math.floor(math.log10(abs(x))))
    s = f"{x:.{decimals}f}"
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def si(x: float | None, sig: int = 3) -> str:
    """A count or rate for a person: 23390 -> '23.4k', 9.555 -> '9.56', 2.9e-05 -> '0.000029'."""
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "unbounded" if x > 0 else "-unbounded"
    for scale, suffix in _SUFFIXES:
        # round first, so 999.96 reads '1k' and not '1000'
        if abs(float(_fixed(x, sig))) >= scale:
            return _fixed(x / scale, sig) + suffix
    return _fixed(x, sig)


def number(x: float | None, sig: int = 4) -> str:
    """A plain number (a ratio, a weight, a solver objective) without a unit suffix or exponent."""
    if x is None:
        return "-"
    if abs(x) >= 1e4:
        return si(x, sig)
    return _fixed(x, sig)


def money(per_hour: float | None) -> str:
    """Dollars per hour: cents when they are not zero, else the first two significant digits
    ($0.0005/h, never $0.00/h for a price that is not zero)."""
    if per_hour is None:
        return "-"
    if per_hour != 0 and abs(per_hour) < 0.005:
        return f"{'-' if per_hour < 0 else ''}${_fixed(abs(per_hour), 2)}/h"
    return f"{'-' if per_hour < -0.004999 else ''}${abs(per_hour):,.2f}/h"


def plural(n: float, word: str, many: str | None = None) -> str:
    """'1 replica', '2 replicas', '1 node', '0 nodes' (the count through `si`)."""
    one = n == 1
    return f"{si(n)} {word if one else (many or word + 's')}"


def percent(x: float | None, sig: int = 3) -> str:
    """A fraction as a percentage: 0.1332 -> '13.3%'."""
    if x is None:
        return "-"
    if x != 0 and abs(100 * x) < 1e-4:  # solver tolerances (a gap of 3e-14): not a figure to read
        return "<0.0001%" if x > 0 else "-<0.0001%"
    return _fixed(100 * x, sig) + "%"
