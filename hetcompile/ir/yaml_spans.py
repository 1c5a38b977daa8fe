"""YAML loading that remembers where every key and value came from, and refuses hostile input.

PyYAML's composer keeps a start mark (line, column) on every node. We build plain Python
data from the node tree and, beside it, a `SourceMap` from a path (tuple of keys and list
indices) to the `Span` of that value and of its key. Spec errors use it to point at the line
and column the user has to fix.

The loader is also the boundary against hostile files, so every way a text can fail becomes a
located `SpecError` ("invalid YAML: ..."), never an internal error:
- bytes: UTF-8 only (a BOM is skipped; UTF-16/32 and invalid bytes are named with their place);
- nesting: at most `MAX_DEPTH` levels, checked while composing (PyYAML's composer recurses);
- aliases: the composer shares an aliased node, but building data expands every occurrence, so
  a few hundred bytes of nested aliases ("billion laughs") would build billions of values.
  Building stops past `ALIAS_SLACK` + `ALIAS_FACTOR` x the nodes the file really has: a large
  file of plain values is fine, a small file that expands a lot is not. Recursive aliases hit
  the depth limit;
- merge keys (`<<: *base`, YAML 1.1) work as in `yaml.safe_load`: the mapping's own keys win,
  then the merged mappings in order;
- scalars PyYAML cannot construct (unknown tags, integers past Python's 4300-digit limit) are
  located errors.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field

import yaml

from hetcompile.errors import Span, SpecError

Path = tuple

MAX_DEPTH = 32          # a spec nests about 7 deep (layer profile tables); 32 leaves room
ALIAS_SLACK = 10_000    # values an alias may add beyond ALIAS_FACTOR x the file's own nodes
ALIAS_FACTOR = 4

_MERGE_TAG = "tag:yaml.org,2002:merge"


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
        return Span(self.file, line, col, _printable(text))

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


def _printable(text: str) -> str:
    # the caret line is echoed to a terminal: never pass control characters through
    return "".join(c if c.isprintable() or c == "\t" else "?" for c in text)[:300]


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


class _Composer(yaml.SafeLoader):
    """SafeLoader's composer with a nesting limit and a count of the nodes the text holds."""

    def __init__(self, text: str, smap: SourceMap):
        super().__init__(text)
        self.smap = smap
        self.depth = 0
        self.nodes = 0

    def compose_node(self, parent, index):  # noqa: ANN001 - PyYAML's signature
        self.depth += 1
        self.nodes += 1
        if self.depth > MAX_DEPTH:
            mark = self.peek_event().start_mark
            raise SpecError(f"invalid YAML: nested deeper than {MAX_DEPTH} levels",
                            self.smap._span((mark.line + 1, mark.column + 1)),
                            hint="a spec nests a few levels; flatten the value")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _Builder:
    """Plain data and its source map from a composed node tree, within the alias budget."""

    def __init__(self, smap: SourceMap, budget: int):
        self.smap = smap
        self.budget = budget
        self.built = 0
        self.seen: set[int] = set()  # nodes built once: meeting one again is an alias expanding
        self.constructor = yaml.SafeLoader("")

    def _fail(self, msg: str, node: yaml.Node, hint: str | None = None) -> SpecError:
        return SpecError(f"invalid YAML: {msg}", self.smap._span(_mark(node)), hint=hint)

    def scalar(self, node: yaml.Node) -> object:
        try:
            return self.constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise self._fail(problem, node, hint="specs hold plain YAML: mappings, lists, strings and numbers") from None
        except ValueError:
            # int() past Python's digit limit (sys.get_int_max_str_digits)
            raise self._fail("number too large", node) from None

    def pairs(self, node: yaml.MappingNode, depth: int) -> list[tuple[yaml.Node, yaml.Node]]:
        """The mapping's own pairs, then merged pairs whose key it does not set (`<<`, YAML 1.1)."""
        own, merged = [], []
        for knode, vnode in node.value:
            if knode.tag != _MERGE_TAG:
                own.append((knode, vnode))
                continue
            sources = vnode.value if isinstance(vnode, yaml.SequenceNode) else [vnode]
            for src in sources:
                if not isinstance(src, yaml.MappingNode):
                    raise self._fail("a merge key `<<` takes a mapping or a list of mappings", src)
                if depth > MAX_DEPTH:
                    raise self._fail(f"merge keys nested deeper than {MAX_DEPTH} levels (a recursive alias?)", src)
                merged.extend(self.pairs(src, depth + 1))
        seen = {self.scalar(k) for k, _ in own if isinstance(k, yaml.ScalarNode)}
        out = list(own)
        for knode, vnode in merged:
            key = self.scalar(knode) if isinstance(knode, yaml.ScalarNode) else None
            if key is None or key not in seen:
                seen.add(key)
                out.append((knode, vnode))
        return out

    def build(self, node: yaml.Node, path: Path, depth: int, site: yaml.Node | None = None) -> object:
        """`site`: the node in the text where the alias being expanded is used (errors point there,
        not at the anchor's definition)."""
        self.built += 1
        if id(node) in self.seen:
            site = site or node
        else:
            self.seen.add(id(node))
            site = node
        if self.built > self.budget:
            raise self._fail(f"aliases expand to more than {self.budget:,} values",
                             site, hint="use an alias for a value, not to multiply nested aliases")
        if depth > MAX_DEPTH:
            raise self._fail(f"nested deeper than {MAX_DEPTH} levels (a recursive alias?)", node)
        self.smap.values[path] = _mark(node)
        if isinstance(node, yaml.MappingNode):
            out: dict = {}
            for knode, vnode in self.pairs(node, depth):
                if not isinstance(knode, yaml.ScalarNode):
                    raise SpecError("mapping keys must be plain scalars", self.smap._span(_mark(knode)))
                key = self.scalar(knode)
                if not isinstance(key, (str, int, float, bool)):
                    raise SpecError("mapping keys must be plain scalars", self.smap._span(_mark(knode)))
                if key in out:
                    raise SpecError(f"duplicate key {key!r}", self.smap._span(_mark(knode)),
                                    hint="each key may appear once per mapping")
                self.smap.keys[path + (key,)] = _mark(knode)
                out[key] = self.build(vnode, path + (key,), depth + 1, site)
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.build(v, path + (i,), depth + 1, site) for i, v in enumerate(node.value)]
        return self.scalar(node)


def decode(raw: bytes, file: str) -> str:
    """UTF-8 text of a YAML file, or a located SpecError for any other encoding or a bad byte."""
    for bom, name in ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
                      (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16")):
        if raw.startswith(bom):
            raise SpecError(f"invalid YAML: the file is {name}; hetcompile reads UTF-8", Span(file, 1, 1),
                            hint="save the file as UTF-8")
    if raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8):]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        text = raw.split(b"\n")[line - 1].decode("utf-8", errors="replace")
        raise SpecError(f"invalid YAML: byte 0x{raw[exc.start]:02x} is not UTF-8",
                        Span(file, line, col, _printable(text)), hint="save the file as UTF-8") from None


def load_yaml(text: str, file: str) -> tuple[object, SourceMap]:
    """Parse one YAML document; return its data and source map. Every failure is a SpecError."""
    smap = SourceMap(file=file, lines=text.splitlines())
    loader = None
    try:
        loader = _Composer(text, smap)
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        span = smap._span((mark.line + 1, mark.column + 1)) if mark else None
        what = ", ".join(x for x in (exc.context, exc.problem) if x) or str(exc)
        raise SpecError(f"invalid YAML: {what}", span) from None
    except yaml.reader.ReaderError as exc:
        # a control character or NUL byte: the reader knows its offset into the text
        line = text.count("\n", 0, exc.position) + 1
        col = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        char = exc.character if isinstance(exc.character, int) else ord(str(exc.character)[:1] or "\0")
        raise SpecError(f"invalid YAML: control character U+{char:04X} is not allowed", smap._span((line, col)),
                        hint="remove control characters from the file") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"invalid YAML: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                        smap.value(())) from None
    finally:
        if loader is not None:
            loader.dispose()
    if node is None:
        return None, smap
    builder = _Builder(smap, budget=ALIAS_SLACK + ALIAS_FACTOR * loader.nodes)
    return builder.build(node, (), 1), smap
