"""Bench: wall time of the chain search (`place(mode="chains")`, depth-aware) on the Helix setups.

    python bench/chain_search_speed.py [--setups single24,geo24,highhet42,cluster10] [--root CHECKOUT]

The search stops on work budgets, not the clock, so two checkouts do the same amount of work and
their times compare the cost of one chain evaluation: run this once here and once with `--root`
pointing at another checkout (e.g. `git worktree add /tmp/old <rev>`), in the same session, and
compare the ratios (this machine is shared and noisy). Prints per setup: seconds, the search's
fast-mode value, chains and their depths.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("--setups", default="single24,geo24,highhet42,cluster10")
ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
a = ap.parse_args()
sys.path.insert(0, str(a.root.resolve()))

from hetcompile.placement import SolverOptions, place  # noqa: E402
from hetcompile.placement.helix.artifact import load_setup  # noqa: E402

print(f"root {a.root}")
for name in a.setups.split(","):
    p = load_setup(name)
    t = time.perf_counter()
    res = place(p, mode="chains", options=SolverOptions(time_limit_s=600, mip_gap=1e-4))
    dt = time.perf_counter() - t
    print(f"{name:10s} {dt:7.2f} s  value {res.depth_aware_capacity:9.1f}  chains {len(res.chains)} "
          f"depths {[c.depth for c in res.chains]}")
