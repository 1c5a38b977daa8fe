"""The simulator against the analytic capacity (perf/capacity.py) at saturation, per example plan.

For every replica shape of a plan (its step model) and every workload it serves, one replica is
offered Poisson arrivals of that workload alone at 1.3x the formula's h_{c,w}, for 12 request
lifetimes (TTFT + O x TPOT of the formula); completions per second after the first 30% are the
simulated capacity. Shared by tests/test_simulate.py and bench/simulate_capacity.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hetcompile.ir.plan import PlanDoc
from hetcompile.perf.capacity import chain_capacity
from hetcompile.simulate.run import saturation_throughput

OVERLOAD = 1.3
LIFETIMES = 12


@dataclass(frozen=True)
class CapacityCase:
    plan: str
    replica: str
    workload: str
    pp: int
    binding: str
    formula_rps: float
    simulated_rps: float

    @property
    def ratio(self) -> float:
        return self.simulated_rps / self.formula_rps


def capacity_cases(plan: PlanDoc, seed: int = 0) -> list[CapacityCase]:
    out: list[CapacityCase] = []
    seen: set[tuple[str, str]] = set()
    for r in sorted(plan.replicas, key=lambda r: r.id):
        rm = r.step_model
        if rm is None:
            continue
        for w in sorted(plan.workloads, key=lambda w: w.name):
            key = (rm.model_dump_json(), w.name)
            if w.name not in r.workloads or key in seen:
                continue
            seen.add(key)
            I, O = max(1, round(w.input_tokens)), max(1, round(w.output_tokens))
            est = chain_capacity(rm, I, O)
            duration = LIFETIMES * (est.ttft_s + O * est.tpot_s)
            sim = saturation_throughput(rm, I, O, OVERLOAD * est.requests_per_s, duration, seed)
            out.append(CapacityCase(plan.plan, r.id, w.name, rm.depth, est.binding, est.requests_per_s, sim))
    return out


def example_plans(golden: Path) -> list[Path]:
    return sorted(p for p in Path(golden).glob("*/plan.json"))
