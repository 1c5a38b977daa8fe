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


def rich_renderables(doc: Doc) -> list[RenderableType]:
    out: list[RenderableType] = [Rule(_rich_line(doc.title), align="left")]
    out += [_rich_line(s) for s in doc.intro]
    for sec in doc.sections:
        out.append(Rule(Text(sec.title, style="bold"), align="left"))
        for b in sec.blocks:
            if isinstance(b, Table):
                t = RichTable(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
                for h in b.headers:
                    t.add_column(h, overflow="fold")
                for r in b.rows:
                    t.add_row(*[Text(c) for c in r])
                out.append(t)
            else:
                out.append(_rich_line(b))
    return out


def text(doc: Doc, width: int = 120) -> str:
    """The terminal rendering as plain text (no colour), for tests and pipes."""
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, highlight=False).print(Group(*rich_renderables(doc)))
    return buf.getvalue()


def render_explanation(e: Explanation, fmt: Format) -> str | Doc:
    """md/json/dot as text; text as the Doc (the CLI prints it through its own console)."""
    if fmt == "json":
        # explanations of plans without a selection keep their bytes
        out = e.model_dump(mode="json", exclude={"primary_workers"} if e.primary_workers is None else None)
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
