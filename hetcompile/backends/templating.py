"""The one jinja2 environment of the backends: templates only lay out text, StrictUndefined."""

from __future__ import annotations

import jinja2

from hetcompile.backends.shell import comment, quote

env = jinja2.Environment(
    loader=jinja2.PackageLoader("hetcompile.backends", "templates"),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,
)

env.filters["q"] = quote
env.filters["comment"] = comment


def render(name: str, **context: object) -> str:
    return env.get_template(name).render(**context)
