"""Simulated mean TTFT vs the analytic TTFT formula, per example plan and load.

    .venv/bin/python bench/simulate_ttft.py [tests/golden]

For every replica shape and workload of the bundled example plans: one replica offered Poisson
arrivals of that workload alone at 30%, 60% and 85% of the formula's h_{c,w} for 60 request
lifetimes; the simulator's mean TTFT (arrival to first token, the frontend's per-request overhead
included) against perf/capacity.py's at the concurrency the simulator ran at. The baseline in the
same run is the formula without the wait for the step in progress and without the prompts that
arrive beside the request (`no-wait`: what chain_capacity computed before), so the two error
columns are a ratio measured in one run. Queueing for a slot or for the chunk budget near
saturation is the SLO pass's M/D/1 term, not this formula's.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hetcompile.plan.io import read_plan_doc  # noqa: E402
from hetcompile.simulate.capacity_check import example_plans, ttft_cases  # noqa: E402


def main() -> None:
    golden = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "golden"
    print(f"{'plan':22} {'rep':4} {'workload':10} {'load':>5} {'C':>7} {'sim ms':>9} {'formula':>9} {'no-wait':>9}")
    cases = []
    for path in example_plans(golden):
        for c in ttft_cases(read_plan_doc(path)):
            cases.append(c)
            print(f"{c.plan:22} {c.replica:4} {c.workload:10} {c.load:5.2f} {c.concurrency:7.1f} {c.simulated_s * 1e3:9.1f} "
                  f"{c.formula_s * 1e3:9.1f} {c.formula_no_wait_s * 1e3:9.1f}", flush=True)
    for name, f in (("formula", lambda c: c.formula_s), ("no-wait", lambda c: c.formula_no_wait_s)):
        errs = [abs(f(c) - c.simulated_s) / c.simulated_s for c in cases]
        low = [e for c, e in zip(cases, errs) if c.load <= 0.6]
        print(f"{name:8} median |error| {100 * statistics.median(errs):5.1f}% over {len(errs)} cases "
              f"({100 * statistics.median(low):5.1f}% at loads <= 0.6)")


if __name__ == "__main__":
    main()
