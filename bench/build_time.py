"""Bench: `hetcompile build` wall time per example, here and in another checkout, interleaved.

    python bench/build_time.py [--base /tmp/ref] [--repeat 3] [--examples quickstart,llama70b-pp]
                               [--spec bench/data/scale1072.yaml ...]

Each example is built `--repeat` times with this checkout and with `--base` (PYTHONPATH pointing at
it, same interpreter), alternating, plus once here with `--no-verify`; the minimum of each is
printed (the machine is shared and noisy: compare in one session, read the minimum and the ratio).
From this checkout's timings.json and plan.json: the verify pass's share of the build (pass 7: the
simulations and the replans it asks for) and how many plans it simulated.

Both checkouts' modules are byte-compiled first (compileall), as any Python that may write its
bytecode cache has them after a first run; where PYTHONDONTWRITEBYTECODE is set (this project's
machines set it) every build would otherwise compile ~150 modules from source, about 0.9 s each.
`--cold` skips that.
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


def build(root: Path, spec: Path, out: Path, *flags: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(root)}
    t = time.perf_counter()
    # cwd = the checkout: `python -m` puts the cwd first on sys.path, ahead of PYTHONPATH and of an
    # editable install's finder, so this is the code that runs
    subprocess.run([sys.executable, "-m", "hetcompile.cli", "build", str(spec), "-q", "-o", str(out), *flags], env=env,
                   cwd=root, check=True, capture_output=True)
    return time.perf_counter() - t


def verify_share(out: Path) -> tuple[float, int]:
    """(seconds in the verify pass, plans simulated) of a build in `out`."""
    passes = json.loads((out / "timings.json").read_text())["passes"]
    seconds = sum(p["time_s"] for p in passes if p["name"] == "verify")
    v = json.loads((out / "plan.json").read_text()).get("verification") or {}
    return seconds, int(v.get("rounds", 0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, default=None, help="another checkout to compare with (default: none)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--examples", default=",".join(sorted(p.parent.name for p in (ROOT / "examples").glob("*/spec.yaml"))))
    ap.add_argument("--spec", type=Path, action="append", default=[],
                    help="a spec file to build too (repeatable); with --examples '' only these")
    ap.add_argument("--cold", action="store_true", help="do not byte-compile the checkouts first")
    a = ap.parse_args()
    if not a.cold:
        for root in [ROOT] + ([a.base] if a.base is not None else []):
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(root) / "hetcompile")], check=True,
                           capture_output=True)
    print(f"{'example':22s} {'base s':>8s} {'this s':>8s} {'ratio':>6s} {'verify s':>9s} {'share':>6s} {'plans':>5s} "
          f"{'no-verify s':>11s}")
    total_base = total_this = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        specs = [(n, ROOT / "examples" / n / "spec.yaml") for n in a.examples.split(",") if n]
        specs += [(p.stem, p.resolve()) for p in a.spec]
        for name, spec in specs:
            base, this = [], []
            for k in range(a.repeat):
                if a.base is not None:
                    base.append(build(a.base, spec, Path(tmp) / f"base-{name}-{k}"))
                this.append(build(ROOT, spec, Path(tmp) / f"this-{name}-{k}"))
            quick = build(ROOT, spec, Path(tmp) / f"quick-{name}", "--no-verify")
            t = min(this)
            v, plans = verify_share(Path(tmp) / f"this-{name}-{this.index(t)}")
            b = min(base) if base else float("nan")
            total_base += b
            total_this += t
            print(f"{name:22s} {b:8.2f} {t:8.2f} {t / b:6.2f} {v:9.2f} {v / t:6.0%} {plans:5d} {quick:11.2f}")
    print(f"{'total':22s} {total_base:8.2f} {total_this:8.2f} {total_this / total_base:6.2f}")


if __name__ == "__main__":
    main()
