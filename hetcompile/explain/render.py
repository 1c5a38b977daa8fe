"""Lay an explanation or a diff out: `text` (rich), `md` (markdown + Mermaid), `json`, `dot`.

What to say is decided once in doc.py; here it is only typeset. JSON is the pydantic model
through `dumps_json` (canon: 6 significant digits, sorted keys), valid against
schemas/explain.schema.json.
"""

from __future__ import annotations

import io
import re
from typing import Literal

from rich import box
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.rule import Rule
from rich.table import Table as RichTable
from rich.text import Text

from hetcompile.plan.canon import dumps_json
from hetcompile.explain import diagram
from hetcompile.explain.doc import Doc, Table, diff_doc, explanation_doc
from hetcompile.explain.model import Explanation, PlanDiff

Format = Literal["text", "md", "json", "dot"]
FORMATS: tuple[str, ...] = ("text", "md", "json", "dot")


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def _md_table(t: Table) -> str:
    head = "| " + " | ".join(_md_cell(h) for h in t.headers) + " |"
    rule = "|" + "|".join("---" for _ in t.headers) + "|"
    rows = ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in t.rows]
    return "\n".join([head, rule, *rows])


def markdown(doc: Doc, mermaid: str | None = None) -> str:
    parts = [f"# {doc.title}", "\n".join(doc.intro)]
    if mermaid:
        parts.append("## Pipelines\n\n```mermaid\n" + mermaid + "```")
    for sec in doc.sections:
        body: list[str] = []
        lines: list[str] = []
        for b in sec.blocks:
            if isinstance(b, Table):
                if lines:
                    body.append("\n".join(lines))
                    lines = []
                body.append(_md_table(b))
            else:
                lines.append(b)
        if lines:
            body.append("\n".join(lines))
        parts.append(f"## {sec.title}\n\n" + "\n\n".join(body))
    return "\n\n".join(parts) + "\n"


def _rich_line(s: str) -> Text:
    marked = re.sub(r"\*\*(.+?)\*\*", r"[bold]\1[/bold]", escape(s))
    marked = re.sub(r"`([^`]+)`", r"[cyan]\1[/cyan]", marked)
    return Text.from_markup(marked)


def _longest_word(s: str) -> int:
    return max((len(w) for w in s.split()), default=0)


GAP = 3  # characters between two columns: a pad either side of the box's blank separator


def column_widths(t: Table, width: int) -> list[int] | None:
    """Content widths that fit `width` with every word whole, or None when the longest words alone
    do not fit. Starts from each column's natural width (its longest cell) and narrows the column
    with the most room above its longest word, one character at a time (deterministic)."""
    cols = range(len(t.headers))
    floor = [max([_longest_word(t.headers[i])] + [_longest_word(r[i]) for r in t.rows]) for i in cols]
    widths = [max([len(t.headers[i])] + [len(r[i]) for r in t.rows]) for i in cols]
    room = width - GAP * (len(t.headers) - 1)
    if sum(floor) > room:
        return None
    while sum(widths) > room:
        i = max(cols, key=lambda j: (widths[j] - floor[j], widths[j], -j))
        widths[i] -= 1
    return widths


def fits_without_splitting(t: Table, width: int) -> bool:
    """Whether a table can be laid out in `width` columns with every word whole."""
    return column_widths(t, width) is not None


def _records(t: Table) -> list[RenderableType]:
    """A table too wide for the terminal as one record per row ('header: value'), so no word is split."""
    out: list[RenderableType] = []
    for r in t.rows:
        out.append(Text("- " + "; ".join(f"{h}: {c}" for h, c in zip(t.headers, r) if c != "")))
    return out


def rich_renderables(doc: Doc, width: int = 80) -> list[RenderableType]:
    """The document for a terminal `width` columns wide: tables wrap only between words; a table
    whose words alone do not fit becomes one line per row (header: value)."""
    out: list[RenderableType] = [Rule(_rich_line(doc.title), align="left")]
    out += [_rich_line(s) for s in doc.intro]
    for sec in doc.sections:
        out.append(Rule(Text(sec.title, style="bold"), align="left"))
        for b in sec.blocks:
            if isinstance(b, Table):
                widths = column_widths(b, width)
                if widths is None:
                    out += _records(b)
                    continue
                t = RichTable(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
                for h, w in zip(b.headers, widths):
                    # a fixed width no narrower than the column's longest word: rich wraps only at spaces
                    t.add_column(h, overflow="fold", width=w)
                for r in b.rows:
                    t.add_row(*[Text(c) for c in r])
                out.append(t)
            else:
                out.append(_rich_line(b))
    return out


def text(doc: Doc, width: int = 120) -> str:
    """The terminal rendering as plain text (no colour), for tests and pipes."""
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, highlight=False).print(Group(*rich_renderables(doc, width)))
    return buf.getvalue()


def render_explanation(e: Explanation, fmt: Format) -> str | Doc:
    """md/json/dot as text; text as the Doc (the CLI prints it through its own console)."""
    if fmt == "json":
        # explanations of plans without these blocks keep their bytes
        drop = {k for k in ("primary_workers",) if getattr(e, k) is None}
        drop |= {k for k in ("what_it_would_take", "alternatives", "disaggregation") if not getattr(e, k)}
        out = e.model_dump(mode="json", exclude=drop or None)
        return dumps_json(out)
    if fmt == "dot":
        return diagram.dot(e)
    doc = explanation_doc(e)
    return markdown(doc, diagram.mermaid(e)) if fmt == "md" else doc


def render_diff(d: PlanDiff, fmt: Format, old: Explanation, new: Explanation) -> str | Doc:
    if fmt == "json":
        return dumps_json(d.model_dump(mode="json"))
    if fmt == "dot":
        return diagram.diff_dot(d, old, new)
    doc = diff_doc(d)
    return markdown(doc) if fmt == "md" else doc
