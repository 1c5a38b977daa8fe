"""Pictures of the pipelines: a Mermaid flowchart (inside the markdown) and Graphviz DOT.

One box per replica holding its stages in pipeline order; the router feeds each replica's first
stage with its routing weights; the heaviest stage of a multi-stage chain is drawn thick, and a
hop that leaves its region is labelled with the two regions. The diff's DOT puts the old and the
new plan side by side with an edge per matched replica.
"""

from __future__ import annotations

import re

from hetcompile.explain.doc import num, pct
from hetcompile.explain.model import Explanation, PlanDiff, ReplicaView


def _id(*parts: object) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", "_".join(str(p) for p in parts))


def _q(text: str) -> str:
    """Text safe inside a double-quoted Mermaid or DOT label."""
    return text.replace("\\", "/").replace('"', "'")


def _weights(r: ReplicaView) -> str:
    return ", ".join(f"{ld.workload} {pct(ld.weight)}" for ld in r.workloads if ld.weight > 0)


def mermaid(e: Explanation) -> str:
    """router -> replicas -> stages; replicas inside one region are grouped in a box per region
    and cloud; GPU types, routing weights and busy % on the labels; the heaviest stage thick."""
    lines = ["flowchart LR", '  router(["router"])']
    hot = []
    cloud = {o.region: o.cloud for o in e.cost.by_offer if o.cloud}
    groups: dict[str, list[ReplicaView]] = {}
    for r in e.replicas:
        groups.setdefault(r.regions[0] if len(r.regions) == 1 else "", []).append(r)
    for region in sorted(groups):
        pad = "  " if region else ""
        if region:
            lines.append(f'  subgraph {_id("region", region)}["{_q(region)} ({_q(cloud.get(region, "-"))})"]')
        for r in groups[region]:
            rid = _id("r", r.id)
            lines.append(f'{pad}  subgraph {rid}["{_q(r.id)}: {_q(r.gpu)} tp{r.tp} pp{r.pp}, {pct(r.utilisation)} busy"]')
            lines.append(f"{pad}    direction LR")
            for st in r.stages:
                lines.append(f'{pad}    {_id(rid, st.index)}["{_q(st.node)}<br/>{_q(st.gpu)} x{st.tp}, layers '
                             f'{st.layers[0]}-{st.layers[1]}"]')
                if st.bottleneck and r.pp > 1:
                    hot.append(_id(rid, st.index))
            for a, b in zip(r.stages, r.stages[1:]):
                label = f'|"{_q(a.region)} to {_q(b.region)}"|' if a.region != b.region else ""
                lines.append(f"{pad}    {_id(rid, a.index)} -->{label} {_id(rid, b.index)}")
            lines.append(f"{pad}  end")
        if region:
            lines.append("  end")
    for r in e.replicas:
        if r.stages:
            w = _weights(r)
            rid = _id("r", r.id)
            lines.append(f'  router -->|"{_q(w)}"| {_id(rid, 0)}' if w else f"  router -.-> {_id(rid, 0)}")
    if hot:
        lines.append("  classDef heaviest stroke-width:3px")
        lines.append(f"  class {','.join(hot)} heaviest")
    return "\n".join(lines) + "\n"


def _dot_replica(r: ReplicaView, prefix: str, color: str | None = None) -> list[str]:
    cid = _id("cluster", prefix, r.id)
    out = [f'  subgraph "{cid}" {{',
           f'    label="{_q(r.id)}: {_q(r.gpu)} tp{r.tp} pp{r.pp}, {pct(r.utilisation)} busy, ${r.price_per_hour:.2f}/h";']
    if color:
        out.append(f'    color="{color}";')
    for st in r.stages:
        extra = ", penwidth=3" if st.bottleneck and r.pp > 1 else ""
        out.append(f'    "{_id(prefix, r.id, st.index)}" [label="{_q(st.node)}\\n{_q(st.region)}, layers '
                   f'{st.layers[0]}-{st.layers[1]}"{extra}];')
    for a, b in zip(r.stages, r.stages[1:]):
        label = f' [label="{_q(a.region)} -> {_q(b.region)}"]' if a.region != b.region else ""
        out.append(f'    "{_id(prefix, r.id, a.index)}" -> "{_id(prefix, r.id, b.index)}"{label};')
    out.append("  }")
    return out


def dot(e: Explanation) -> str:
    lines = [f'digraph "{_q(e.plan)}" {{', "  rankdir=LR;", '  node [shape=box, fontname="Helvetica"];',
             '  router [shape=oval, label="router"];']
    for r in e.replicas:
        lines += _dot_replica(r, "p")
        if r.stages:
            w = _weights(r)
            style = f'label="{_q(w)}"' if w else "style=dashed"
            lines.append(f'  router -> "{_id("p", r.id, 0)}" [{style}];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def diff_dot(d: PlanDiff, old: Explanation, new: Explanation) -> str:
    """Old and new plans side by side; matched replicas joined, added green, removed red."""
    added = {r.id for r in d.added}
    removed = {r.id for r in d.removed}
    lines = [f'digraph "{_q(d.old.plan)} to {_q(d.new.plan)}" {{', "  rankdir=LR;", "  compound=true;",
             '  node [shape=box, fontname="Helvetica"];']
    for side, e, gone in (("old", old, removed), ("new", new, added)):
        lines.append(f'  subgraph "cluster_{side}" {{')
        lines.append(f'    label="{side}: {_q(e.plan)}, ${num(e.summary.price_per_hour)}/h, {num(e.summary.requests_per_s)} req/s";')
        for r in e.replicas:
            color = ("red" if side == "old" else "darkgreen") if r.id in gone else None
            lines += ["  " + x for x in _dot_replica(r, side, color)]
        lines.append("  }")
    for kind, pairs in (("untouched", d.untouched), ("changed", d.changed)):
        for p in pairs:
            style = "" if kind == "untouched" else ", style=dashed"
            lines.append(f'  "{_id("old", p.old, 0)}" -> "{_id("new", p.new, 0)}" [label="{kind}", '
                         f'ltail="{_id("cluster", "old", p.old)}", lhead="{_id("cluster", "new", p.new)}"{style}];')
    lines.append("}")
    return "\n".join(lines) + "\n"
