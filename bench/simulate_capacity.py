"""Simulated saturation throughput vs the analytic capacity formula, per example plan.

    .venv/bin/python bench/simulate_capacity.py [tests/golden]

For every replica shape and workload of the bundled example plans (tests/golden/*/plan.json,
kept current by tests/test_examples.py): the formula's h_{c,w} (perf/capacity.py) and what the
discrete-event simulator (hetcompile/simulate) completes per second at 1.3x that load, as vLLM
runs the replica (`sim`) and, against the fluid formula, under its assumptions (`fluid`: prefill spread evenly
over the steps, no KV preemption; see hetcompile/simulate/capacity_check.py), and with output
lengths varying +-50% about the mean (`spread`: identical requests lock a pipeline's prompt steps
into history-dependent patterns; capacity_check.py). The baseline is the formula, computed in the
same run from the same step model.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hetcompile.plan.io import read_plan_doc  # noqa: E402
from hetcompile.simulate.capacity_check import SPREAD, capacity_cases, example_plans  # noqa: E402


def main() -> None:
    golden = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "golden"
    print(f"{'plan':22} {'rep':4} {'workload':10} {'pp':>2} {'binding':17} {'formula/s':>10} {'sim/s':>10} "
          f"{'sim/formula':>11} {'spread/formula':>14} {'fluid/formula':>13}")
    ratios, spread, fluid = [], [], []
    for path in example_plans(golden):
        plan = read_plan_doc(path)
        cases = capacity_cases(plan)
        if not cases:
            print(f"{plan.plan:22} (no step models: mixed pipelines from layer profiles)")
        for c, v, f in zip(cases, capacity_cases(plan, spread=SPREAD), capacity_cases(plan, fluid=True)):
            ratios.append(c.ratio)
            spread.append(v.ratio)
            fluid.append(f.ratio)
            print(f"{c.plan:22} {c.replica:4} {c.workload:10} {c.pp:>2} {c.binding:17} {c.formula_rps:>10.4g} "
                  f"{c.simulated_rps:>10.4g} {c.ratio:>11.3f} {v.ratio:>14.3f} {f.ratio:>13.3f}")
    for name, rs in (("sim/formula", ratios), ("spread/formula", spread), ("fluid/formula", fluid)):
        within = sum(1 for r in rs if abs(r - 1) <= 0.10)
        print(f"{len(rs)} cases: median {name} {statistics.median(rs):.3f}, min {min(rs):.3f}, max {max(rs):.3f}; "
              f"within 10%: {within}/{len(rs)}")


if __name__ == "__main__":
    main()
