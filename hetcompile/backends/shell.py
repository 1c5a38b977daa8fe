"""The one place user strings become shell text: `quote` for words, `comment` for `#` lines.

Every spec string that reaches an emitted script (served names, weights, model, region and GPU
names) goes through one of these, registered as the jinja filters `q` and `comment`.
"""

from __future__ import annotations

import shlex


def quote(value: object) -> str:
    """One shell word that expands to exactly `value` (shlex.quote; no expansion, no splitting)."""
    return shlex.quote(str(value))


def comment(value: object) -> str:
    """`value` safe inside a `#` comment: no line breaks (they would end the comment)."""
    return " ".join(str(value).splitlines()) if value is not None else ""
