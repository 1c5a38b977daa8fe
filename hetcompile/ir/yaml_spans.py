"""YAML loading that remembers where every key and value came from.

PyYAML's composer keeps a start mark (line, column) on every node. We build plain Python
data from the node tree and, beside it, a `SourceMap` from a path (tuple of keys and list
indices) to the `Span` of that value and of its key. Spec errors use it to point at the line
and column the user has to fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from hetcompile.ir.errors import Span, SpecError

Path = tuple


@dataclass
class SourceMap:
    """Spans of values (`values[path]`) and mapping keys (`keys[path]`) of one YAML file."""

    file: str
    lines: list[str]
    values: dict[Path, tuple[int, int]] = field(default_factory=dict)
    keys: dict[Path, tuple[int, int]] = field(default_factory=dict)

    def _span(self, pos: tuple[int, int]) -> Span:
        line, col = pos
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        return Span(self.file, line, col, text)

    def value(self, path: Path) -> Span | None:
        """Span of the value at `path`, or of the nearest enclosing value that has one."""
        path = tuple(path)
        while True:
            if path in self.values:
                return self._span(self.values[path])
            if not path:
                return None
            path = path[:-1]

    def key(self, path: Path) -> Span | None:
        """Span of the mapping key that leads to `path` (falls back to the value's span)."""
        path = tuple(path)
        if path in self.keys:
            return self._span(self.keys[path])
        return self.value(path)


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _build(node: yaml.Node, path: Path, smap: SourceMap, loader: yaml.SafeLoader) -> object:
    smap.values[path] = _mark(node)
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for knode, vnode in node.value:
            key = loader.construct_object(knode, deep=True)
            if not isinstance(key, (str, int, float, bool)):
                raise SpecError("mapping keys must be plain scalars", smap._span(_mark(knode)))
            if key in out:
                raise SpecError(
                    f"duplicate key {key!r}", smap._span(_mark(knode)), hint="each key may appear once per mapping"
                )
            smap.keys[path + (key,)] = _mark(knode)
            out[key] = _build(vnode, path + (key,), smap, loader)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(v, path + (i,), smap, loader) for i, v in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def load_yaml(text: str, file: str) -> tuple[object, SourceMap]:
    """Parse one YAML document; return its data and source map. Syntax errors become SpecError."""
    smap = SourceMap(file=file, lines=text.splitlines())
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        span = smap._span((mark.line + 1, mark.column + 1)) if mark else None
        raise SpecError(f"invalid YAML: {exc.problem or exc}", span) from None
    finally:
        loader.dispose()
    if node is None:
        return None, smap
    loader = yaml.SafeLoader("")
    return _build(node, (), smap, loader), smap
