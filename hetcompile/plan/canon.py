"""Canonical serialization shared by every data backend: rounded floats, sorted keys, fixed layout.

Rounding to 6 significant digits hides last-bit noise from floating point and LP solves, so the
same spec gives the same bytes on every run (golden files rely on it).
"""

from __future__ import annotations

import json
import math
import re

import yaml

try:  # libyaml's emitter: the same bytes as PyYAML's own (every golden and scale1072's 814 tasks), 10x faster
    from yaml import CSafeDumper as _SafeDumper
except ImportError:  # PyYAML built without libyaml
    from yaml import SafeDumper as _SafeDumper

SIG_DIGITS = 6


def canon(value: object) -> object:
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        if value == 0:
            return 0.0
        r = float(f"{value:.{SIG_DIGITS}g}")
        return int(r) if r.is_integer() and abs(r) < 1e15 else r
    if isinstance(value, dict):
        return {str(k): canon(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [canon(v) for v in value]
    return value


def natural_key(s: str) -> tuple:
    """Sort key that orders 'r2' before 'r10' (digit runs compare as numbers)."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s))


def dumps_json(value: object) -> str:
    return json.dumps(canon(value), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


class _BlockDumper(_SafeDumper):
    """Multi-line strings as `|` blocks, so run scripts stay readable in task YAML."""


def _str_representer(dumper: _SafeDumper, data: str) -> yaml.ScalarNode:
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_BlockDumper.add_representer(str, _str_representer)


def dumps_yaml(value: object) -> str:
    return yaml.dump(value, Dumper=_BlockDumper, sort_keys=False, default_flow_style=False, width=100)


def dumps_yaml_docs(values: list) -> str:
    return yaml.dump_all(values, Dumper=_BlockDumper, sort_keys=False, default_flow_style=False, width=100, explicit_start=True)
