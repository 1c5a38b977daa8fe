"""The backends' jinja2 environment: its bytecode cache only saves time, never changes or breaks output."""

from __future__ import annotations

import jinja2

from hetcompile.backends import templating


def _render_with(cache: jinja2.BytecodeCache | None) -> str:
    env = templating.env.overlay(bytecode_cache=cache)
    return env.get_template("teardown.sh.j2").render(version="0.0", plan="p")


def test_cached_render_equals_uncached(tmp_path) -> None:
    cache = templating._BestEffortCache(str(tmp_path))
    first = _render_with(cache)  # compiles and writes the cache
    assert list(tmp_path.iterdir()), "the compiled template was not cached"
    assert _render_with(templating._BestEffortCache(str(tmp_path))) == first == _render_with(None)


def test_a_failed_cache_write_still_renders(tmp_path) -> None:
    missing = tmp_path / "gone"  # a folder that does not exist: every write fails with an OSError
    assert _render_with(templating._BestEffortCache(str(missing))) == _render_with(None)
