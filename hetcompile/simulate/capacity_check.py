"""The simulator against the analytic capacity (perf/capacity.py) at saturation, per example plan.

For every replica shape of a plan (its step model) and every workload it serves, one replica is
offered Poisson arrivals of that workload alone at 1.3x the formula's h_{c,w}, for 36 request
lifetimes (TTFT + O x TPOT of the formula); completions per second after the first 30% are the
simulated capacity. Shared by tests/test_simulate.py and bench/simulate_capacity.py.

By default the replica is as the plan has it (vLLM's chunked prefill: a whole chunk of up to
`chunk_tokens` in one step, and recompute preemption when the KV cache is full), against
perf/capacity.py's formula, which models both (prefill lumps, preemption, overtake waits).
`fluid=True` replays the older fluid formula's assumptions (`chain_capacity(fluid=True)`), to check
the simulator's mechanics apart from them: the KV cache holds C sequences at full length (no
preemption) and the step budget is b (1 + I/O) tokens, so every engine step carries its even share
of prompt tokens.

`spread` (bench/simulate_capacity.py's second column, SPREAD): every request's output length drawn
uniformly within +-50% of the mean. With identical requests a pipeline's saturation is history
dependent: requests admitted together finish together and are replaced in the same micro-batch
cohort, so prompt steps lock into patterns set by how the backlog formed (helix-highhet42 r1, PP13:
0.59 req/s offered 0.61/s, 0.94 offered 1.40/s). Lengths that vary, as any real trace's do,
break the lockstep: the same chains then give the same throughput at 1.3x and 3x. The mean context
of the sequences in flight moves from I + O/2 to I + 0.54 O, which the formula's KV sizing ignores.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from hetcompile.plan.doc import PlanDoc
from hetcompile.perf.capacity import chain_capacity
from hetcompile.perf.stepmodel import ReplicaModel
from hetcompile.simulate.run import finished_at, poisson_requests, saturation_throughput, ttft_of

OVERLOAD = 1.3
LIFETIMES = 36
SPREAD = 0.5  # +-50% output lengths (module docstring)


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


def fluid_model(rm: ReplicaModel, input_tokens: int, output_tokens: int) -> ReplicaModel:
    """`rm` under the formula's assumptions (module docstring)."""
    C = int(chain_capacity(rm, input_tokens, output_tokens).concurrency)
    budget = max(1, math.ceil(C / rm.depth * (1.0 + input_tokens / output_tokens)))
    stages = tuple(st.model_copy(update={"kv_tokens": 1e12}) for st in rm.stages)
    return rm.model_copy(update={"stages": stages, "max_num_seqs": max(C, 1), "chunk_tokens": budget})


def _shapes(plan: PlanDoc):
    """(replica, workload) once per distinct step model and workload it serves, in id order."""
    seen: set[tuple[str, str]] = set()
    for r in sorted(plan.replicas, key=lambda r: r.id):
        if r.step_model is None:
            continue
        for w in sorted(plan.workloads, key=lambda w: w.name):
            key = (r.step_model.model_dump_json(), w.name)
            if w.name in r.workloads and key not in seen:
                seen.add(key)
                yield r, w


def capacity_cases(plan: PlanDoc, seed: int = 0, fluid: bool = False, spread: float = 0.0) -> list[CapacityCase]:
    """`spread`: output lengths vary uniformly by +-spread about the workload's mean (module docstring)."""
    out: list[CapacityCase] = []
    for r, w in _shapes(plan):
        I, O = max(1, round(w.input_tokens)), max(1, round(w.output_tokens))
        rm = fluid_model(r.step_model.model(), I, O) if fluid else r.step_model.model()
        est = chain_capacity(rm, I, O, fluid=fluid)
        duration = LIFETIMES * (est.ttft_s + O * est.tpot_s)
        sim = saturation_throughput(rm, I, O, OVERLOAD * est.requests_per_s, duration, seed, spread)
        out.append(CapacityCase(plan.plan, r.id, w.name, rm.depth, est.binding, est.requests_per_s, sim))
    return out


def example_plans(golden: Path) -> list[Path]:
    return sorted(p for p in Path(golden).glob("*/plan.json"))


@dataclass(frozen=True)
class TtftCase:
    """Mean TTFT of one replica shape and workload under Poisson arrivals at `load` x h_{c,w}: the
    simulator's against the formula's at the concurrency the simulator ran at."""

    plan: str
    replica: str
    workload: str
    load: float
    concurrency: float  # mean sequences in the engine (Little: rate x mean time from scheduler to finish)
    simulated_s: float
    formula_s: float
    formula_no_wait_s: float  # without the wait for the step in progress (the baseline)


def ttft_cases(plan: PlanDoc, loads: tuple[float, ...] = (0.3, 0.6, 0.85), seed: int = 0) -> list[TtftCase]:
    out: list[TtftCase] = []
    for r, w in _shapes(plan):
        rm = r.step_model.model()
        I, O = max(1, round(w.input_tokens)), max(2, round(w.output_tokens))
        est = chain_capacity(rm, I, O)
        for load in loads:
            reqs = poisson_requests(rm, I, O, load * est.requests_per_s, 60.0 * (est.ttft_s + O * est.tpot_s), seed)
            ttft = statistics.mean(ttft_of(q) for q in reqs)
            engine = statistics.mean(finished_at(q) - q.arrival - rm.request_overhead_s for q in reqs)
            C = max(1.0, load * est.requests_per_s * engine)
            e = chain_capacity(rm, I, O, max_concurrency=C)
            out.append(TtftCase(plan.plan, r.id, w.name, load, C, ttft, e.ttft_s, e.ttft_s - e.step_wait_s))
    return out
