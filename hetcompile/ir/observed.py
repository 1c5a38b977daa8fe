"""`build --observed`: the spec's guesses replaced by what `hetcompile observe` measured.

For each workload with a measured rate (router counters) the demand becomes that rate; prompt and
output lengths become the measured means where at least MIN_REQUESTS requests were measured; and
the step-time corrections per (GPU, TP) go to the profile pass, which scales the analytic step
model of every shape on that GPU type and TP (perf/stepmodel.scaled), so a correction learned on
running H100s applies to a new H100 replica. Workloads the observation lacks keep the spec's values
and say so. A share or request-count demand (not a rate) keeps its kind: only its lengths change.
"""

from __future__ import annotations

from hetcompile.ir.problem import Problem, Workload
from hetcompile.plan.observed import MIN_REQUESTS, ObservedChange, ObservedDoc, Observation


def apply_observed(ir: Problem, doc: ObservedDoc) -> Problem:
    seen = {w.name: w for w in doc.workloads}
    notes: list[str] = []
    works: list[Workload] = []
    changes: list[ObservedChange] = []
    for w in ir.workloads:
        o = seen.get(w.name)
        upd: dict = {}
        if o is None:
            notes.append(f"{w.name}: not in the observation; planned at the spec's values")
        else:
            if w.demand_kind == "rate" and o.rate_per_s is not None:
                if o.rate_per_s > 0:
                    upd.update(demand=o.rate_per_s, rate=o.rate_per_s)
                else:
                    notes.append(f"{w.name}: no requests observed; planned at the spec's rate")
            if o.input_tokens is not None and o.input_tokens.samples >= MIN_REQUESTS:
                upd["input_tokens"] = max(1.0, o.input_tokens.mean)
            if o.output_tokens is not None and o.output_tokens.samples >= MIN_REQUESTS:
                upd["output_tokens"] = max(1.0, o.output_tokens.mean)
            if "input_tokens" not in upd:
                notes.append(f"{w.name}: fewer than {MIN_REQUESTS} requests measured; the spec's lengths kept")
        nw = w.model_copy(update=upd)
        works.append(nw)
        changes.append(ObservedChange(workload=w.name, spec_rate=w.rate, rate=nw.rate, spec_input_tokens=w.input_tokens,
                                      input_tokens=nw.input_tokens, spec_output_tokens=w.output_tokens, output_tokens=nw.output_tokens))
    unknown = sorted(set(seen) - {w.name for w in ir.workloads})
    if unknown:
        notes.append(f"observed workloads the spec no longer has, ignored: {', '.join(unknown)}")
    obs = Observation(window_s=doc.window_s, workloads=tuple(changes), corrections=doc.corrections, notes=tuple(notes))
    return ir.model_copy(update={"workloads": tuple(works), "observed": obs})


def correction(ir: Problem, gpu: str, tp: int) -> float:
    """k_{g,t}: the observed factor on step times of `gpu` at TP `tp` (1 where none was measured)."""
    if ir.observed is None:
        return 1.0
    return next((c.factor for c in ir.observed.corrections if c.gpu == gpu and c.tp == tp), 1.0)
