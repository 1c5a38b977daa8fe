"""Bench: `hetcompile build` wall time per example, here and in another checkout, interleaved.

    python bench/build_time.py [--base /work/main] [--repeat 3] [--examples quickstart,llama70b-pp]

Issue 20 added bounded compose re-solves (what it would take, the budget sweep, runners-up) and
the SVG charts; this measures what they cost. Each example is built `--repeat` times with this
checkout and with `--base` (PYTHONPATH pointing at it, same interpreter), alternating, and the
minimum of each is printed with the difference and, from timings.json, compose's own time (the
machine is shared and noisy: compare in one session, read the minimum).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(root: Path, spec: Path, out: Path) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    t = time.perf_counter()
    # cwd = the checkout: `python -m` puts the cwd first on sys.path, ahead of PYTHONPATH and of an
    # editable install's finder, so this is the code that runs
    subprocess.run([sys.executable, "-m", "hetcompile.cli", "build", str(spec), "-q", "-o", str(out)], env=env,
                   cwd=root, check=True, capture_output=True)
    wall = time.perf_counter() - t
    compose = next(p["time_s"] for p in json.loads((out / "timings.json").read_text())["passes"] if p["name"] == "compose")
    return wall, compose


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, default=Path("/work/main"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--examples", default=",".join(sorted(p.parent.name for p in (ROOT / "examples").glob("*/spec.yaml"))))
    a = ap.parse_args()
    print(f"{'example':22s} {'base s':>8s} {'this s':>8s} {'diff s':>8s}   compose base -> this s")
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.examples.split(","):
            spec = ROOT / "examples" / name / "spec.yaml"
            base, this = [], []
            for k in range(a.repeat):
                base.append(build(a.base, spec, Path(tmp) / f"base-{name}-{k}"))
                this.append(build(ROOT, spec, Path(tmp) / f"this-{name}-{k}"))
            b, t = min(base), min(this)
            print(f"{name:22s} {b[0]:8.2f} {t[0]:8.2f} {t[0] - b[0]:+8.2f}   {min(x[1] for x in base):.3f} -> "
                  f"{min(x[1] for x in this):.3f}")


if __name__ == "__main__":
    main()
