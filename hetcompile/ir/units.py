"""Lenient parsing of the units users write in specs into canonical SI numbers.

The spec accepts what people type ("80GB", "10Gbps", "$2.99/h", "150ms", "4/s"); the IR stores
SI only: bytes, bytes/s, seconds, $/s, 1/s. Decimal prefixes (k, M, G, T) are powers of 1000,
binary ones (Ki, Mi, Gi, Ti) powers of 1024, as in NVIDIA datasheets and cloud network specs.
Every parser raises `UnitError` with a message saying what forms are accepted; the spec
loader turns it into a `SpecError` with the YAML line and column.
"""

from __future__ import annotations

import re

_DEC = {"": 1.0, "k": 1e3, "K": 1e3, "m": 1e6, "M": 1e6, "G": 1e9, "g": 1e9, "T": 1e12, "t": 1e12}
_BIN = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}
_NUM = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"


class UnitError(ValueError):
    """A value could not be read as the expected quantity."""


def _number(value: object, what: str, example: str) -> float | None:
    if isinstance(value, bool):
        raise UnitError(f"expected {what} like {example!r}, got a boolean")
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        raise UnitError(f"expected {what} like {example!r}, got {type(value).__name__}")
    return None


def parse_bytes(value: object) -> float:
    """'80GB' / '80 GiB' / '512MB' / plain number of bytes -> bytes."""
    n = _number(value, "a size", "80GB")
    if n is not None:
        return n
    m = re.fullmatch(r"\s*" + _NUM + r"\s*(Ki|Mi|Gi|Ti|[kKmMgGtT]?)\s*[Bb]?\s*", str(value))
    if not m:
        raise UnitError(f"cannot read {value!r} as a size; write e.g. '80GB', '24GiB' or '512MB'")
    unit = m.group(2)
    return float(m.group(1)) * (_BIN[unit] if unit in _BIN else _DEC[unit])


def parse_bandwidth(value: object) -> float:
    """Network or memory bandwidth -> bytes/s.

    Bits: '10Gbps', '100 Mbit/s', '196Mbps'. Bytes: '2TB/s', '900GB/s', '25GBps'. A plain number is
    bytes/s.
    """
    n = _number(value, "a bandwidth", "10Gbps")
    if n is not None:
        return n
    s = str(value).strip()
    m = re.fullmatch(_NUM + r"\s*(Ki|Mi|Gi|Ti|[kKmMgGtT]?)\s*(bps|bit/s|b/s|Bps|B/s|byte/s|bytes/s)", s)
    if not m:
        raise UnitError(f"cannot read {value!r} as a bandwidth; write e.g. '10Gbps', '100Mbps' or '900GB/s'")
    num, prefix, unit = m.groups()
    scale = _BIN[prefix] if prefix in _BIN else _DEC[prefix]
    bits = unit in ("bps", "bit/s", "b/s")
    return float(num) * scale / (8.0 if bits else 1.0)


_TIME = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: object) -> float:
    """'150ms' / '2s' / '1.5 min' / plain seconds -> seconds."""
    n = _number(value, "a duration", "150ms")
    if n is not None:
        return n
    m = re.fullmatch(r"\s*" + _NUM + r"\s*(ns|us|µs|ms|sec|s|min|m|h)\s*", str(value))
    if not m:
        raise UnitError(f"cannot read {value!r} as a duration; write e.g. '150ms', '2s' or '1min'")
    return float(m.group(1)) * _TIME[m.group(2)]


def parse_latency_target(value: object) -> float:
    """'80ms' / '2s' -> seconds; a bare number is refused: '2' could be seconds or milliseconds, and
    guessing wrong makes a target 1000x off."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise UnitError(f"a latency target needs a unit, got {value!r}: write e.g. '{value:g}s' or '{value:g}ms'")
    if isinstance(value, str) and re.fullmatch(r"\s*" + _NUM + r"\s*", value):
        raise UnitError(f"a latency target needs a unit, got {value!r}: write e.g. '{value.strip()}s' or '{value.strip()}ms'")
    return parse_duration(value)


def parse_price_per_hour(value: object) -> float:
    """'$2.99/h' / '2.99' / '$0.85/hr' / 0 -> dollars per hour (the spec's natural unit).

    The IR stores $/s; see `per_hour_to_per_second`. Prices are per GPU-hour for offers and
    per hour in total for the budget.
    """
    n = _number(value, "a price", "$2.99/h")
    if n is not None:
        return n
    m = re.fullmatch(r"\s*\$?\s*" + _NUM + r"\s*(?:/\s*(h|hr|hour|s|min))?\s*", str(value))
    if not m:
        raise UnitError(f"cannot read {value!r} as a price; write e.g. '$2.99/h' or '2.99'")
    amount = float(m.group(1))
    per = m.group(2) or "h"
    return amount * {"h": 1.0, "hr": 1.0, "hour": 1.0, "min": 60.0, "s": 3600.0}[per]


def parse_rate(value: object) -> float:
    """'4/s' / '240/min' / '4 rps' / plain requests per second -> 1/s."""
    n = _number(value, "a rate", "4/s")
    if n is not None:
        return n
    m = re.fullmatch(r"\s*" + _NUM + r"\s*(?:/\s*(s|sec|min|h)|\s*(rps|req/s))?\s*", str(value))
    if not m:
        raise UnitError(f"cannot read {value!r} as a request rate; write e.g. '4/s' or '240/min'")
    per = m.group(2) or "s"
    return float(m.group(1)) / {"s": 1.0, "sec": 1.0, "min": 60.0, "h": 3600.0}[per]


def parse_fraction(value: object) -> float:
    """'1%' / '0.01' -> 0.01."""
    n = _number(value, "a fraction", "1%")
    if n is not None:
        return n
    m = re.fullmatch(r"\s*" + _NUM + r"\s*(%)?\s*", str(value))
    if not m:
        raise UnitError(f"cannot read {value!r} as a fraction; write e.g. '1%' or '0.01'")
    return float(m.group(1)) / (100.0 if m.group(2) else 1.0)


def per_hour_to_per_second(dollars_per_hour: float) -> float:
    return dollars_per_hour / 3600.0
