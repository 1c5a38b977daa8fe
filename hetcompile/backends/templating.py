"""The one jinja2 environment of the backends: templates only lay out text, StrictUndefined.

Compiling the templates (jinja2's lexer, parser and code generator) took about 0.35 s of every
build, a tenth of a small one; the compiled code is cached as jinja2 does it
(FileSystemBytecodeCache: a per-user 0700 folder in the temp directory, keyed by each template's
source checksum and the Python version), so an edited template recompiles. Where no such folder
can be had, or a write fails, templates compile every time as before: the output is the same.
"""

from __future__ import annotations

import jinja2

from hetcompile.backends.shell import comment, quote


class _BestEffortCache(jinja2.FileSystemBytecodeCache):
    """jinja2's file cache, where a failed write (a full or read-only temp directory) only costs a
    recompile next time."""

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().dump_bytecode(bucket)
        except OSError:
            pass


def _cache() -> jinja2.BytecodeCache | None:
    try:
        return _BestEffortCache()
    except (OSError, RuntimeError):  # no private temp folder to be had (jinja2 refuses an unsafe one)
        return None


env = jinja2.Environment(
    loader=jinja2.PackageLoader("hetcompile.backends", "templates"),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,
    bytecode_cache=_cache(),
)

env.filters["q"] = quote
env.filters["comment"] = comment


def render(name: str, **context: object) -> str:
    return env.get_template(name).render(**context)
