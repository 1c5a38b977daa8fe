"""Simulated saturation throughput vs the analytic capacity formula, per example plan.

    .venv/bin/python bench/simulate_capacity.py [tests/golden]

For every replica shape and workload of the bundled example plans (tests/golden/*/plan.json,
kept current by tests/test_examples.py): the formula's h_{c,w} (perf/capacity.py) and what the
discrete-event simulator (hetcompile/simulate) completes per second at 1.3x that load. The
baseline is the formula, computed in the same run from the same step model.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hetcompile.ir.plan_io import read_plan_doc  # noqa: E402
from hetcompile.simulate.capacity_check import capacity_cases, example_plans  # noqa: E402


def main() -> None:
    golden = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "golden"
    print(f"{'plan':22} {'rep':4} {'workload':10} {'pp':>2} {'binding':17} {'formula/s':>10} {'sim/s':>10} {'sim/formula':>11}")
    ratios = []
    for path in example_plans(golden):
        plan = read_plan_doc(path)
        cases = capacity_cases(plan)
        if not cases:
            print(f"{plan.plan:22} (no step models: mixed pipelines from layer profiles)")
        for c in cases:
            ratios.append(c.ratio)
            print(f"{c.plan:22} {c.replica:4} {c.workload:10} {c.pp:>2} {c.binding:17} {c.formula_rps:>10.4g} "
                  f"{c.simulated_rps:>10.4g} {c.ratio:>11.3f}")
    within = sum(1 for r in ratios if abs(r - 1) <= 0.10)
    print(f"\n{len(ratios)} cases: median sim/formula {statistics.median(ratios):.3f}, min {min(ratios):.3f}, "
          f"max {max(ratios):.3f}; within 10%: {within}/{len(ratios)}")


if __name__ == "__main__":
    main()
