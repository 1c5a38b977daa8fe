"""Calibrating the analytic step model on published measurements: split, least squares, error summary.

Pure functions (numpy only); bench/fidelity.py supplies the rows and the predictor.

Notation:
    theta = (log eta_m[g], log eta_c[g] for each GPU g with training rows; log o, log q, log r,
             log o0, log q0, log r0, log ri)
            eta_m, eta_c: achieved fractions of memory bandwidth and tensor FLOP/s (perf/analytic.py),
            o: step overhead per engine step, q: host work per sequence per step, r: per-request
            overhead before the first token (perf/stepmodel.py); o0, q0, r0: o, q and r of rows
            measured on vLLM's V0 engine (before 0.8), whose host costs are larger, so that those rows
            inform the efficiencies without biasing the V1 overheads that plans use; ri: r of V1 rows
            measured through the in-process AsyncLLM engine (no HTTP server, no separate
            tokenization round trip), so that a benchmark harness's cheaper path does not pull down
            the r of the OpenAI server that plans deploy
    e_j(theta) = log(pred_j(theta) / meas_j)    residual of one measured number j (a row's
                                                throughput, TPOT or TTFT), so every metric counts in
                                                relative error alike; TTFT gets weight TTFT_WEIGHT
    rho(e) = 2 d^2 (sqrt(1 + (e/d)^2) - 1)      soft-L1 loss (d = SOFT_L1): quadratic for small
                                                errors, linear for the few rows measured in a queue
                                                (TTFT 10x off), so those cannot drag every GPU
    theta* = argmin sum_j w_j rho(e_j(theta)) + lam ||theta - theta_0||^2   (Levenberg-Marquardt on
            the residuals sqrt(rho), forward-difference Jacobian; lam a small ridge toward the prior
            theta_0, which keeps a GPU with few rows near the defaults instead of at a bound)
    bounds: eta_m in [0.60, 0.92], eta_c in [0.45, 0.80] (perf/analytic.ETA_BOUNDS: what measured
            kernels reach; a fit that wants more or less is absorbing something else), o in
            [0.1, 20] ms, q in [1, 500] us, r in [0.1, 100] ms (clipped).
    Only GPUs the roofline predicts carry eta: GPUs with measured kernel tables (perf/kernels.py)
    have no fitted GPU term at all.

The split is deterministic: within each GPU, rows sorted by sha1(id); the first
round(TRAIN_SHARE * n) train, the rest are held out (a GPU with one row trains on it).
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from hetcompile.perf import analytic, kernels

TRAIN_SHARE = 0.7
TTFT_WEIGHT = 0.5  # TTFT depends on the frontend and queueing the step model sees least; it must not
                   # pull the decode efficiencies away from the throughput/TPOT rows
RIDGE = 0.05
SOFT_L1 = 0.25
FD_STEP = 0.02  # in log space (2%): the simulator's discrete steps make smaller differences noisy
# (eta_memory, eta_compute) the fit starts from and is pulled toward: what the measured kernel tables
# imply on the GPUs that have them (perf/kernels.roofline_defaults)
PRIOR_ETA = (kernels.roofline_defaults()["eta_memory"], kernels.roofline_defaults()["eta_compute"])
BOUNDS = {"eta_m": analytic.ETA_BOUNDS["memory"], "eta_c": analytic.ETA_BOUNDS["compute"],
          "o": (1e-4, 20e-3), "q": (1e-6, 500e-6), "r": (1e-4, 100e-3), "g": (1e-6, 2e-3)}


@dataclass(frozen=True)
class Params:
    """One calibration: per-GPU (eta_memory, eta_compute) and the three host overheads (seconds)."""

    eta: dict[str, tuple[float, float]] = field(default_factory=dict)
    step_overhead_s: float = 0.5e-3
    seq_overhead_s: float = 42e-6
    request_overhead_s: float = 10e-3
    v0_step_overhead_s: float = 2e-3
    v0_seq_overhead_s: float = 100e-6
    v0_request_overhead_s: float = 10e-3
    inproc_request_overhead_s: float = 10e-3
    step_gpu_s: float = 0.3e-3  # g: GPU work per step outside the per-layer kernels (perf/stepmodel.py)


def split(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(train, held-out): per GPU, the first TRAIN_SHARE of the rows ordered by sha1 of their id."""
    by_gpu: dict[str, list[dict]] = {}
    for r in rows:
        by_gpu.setdefault(r["gpu"], []).append(r)
    train, held = [], []
    for g in sorted(by_gpu):
        rs = sorted(by_gpu[g], key=lambda r: hashlib.sha1(r["id"].encode()).hexdigest())
        k = max(1, round(TRAIN_SHARE * len(rs)))
        train += rs[:k]
        held += rs[k:]
    return train, held


def _pack(p: Params, gpus: list[str]) -> np.ndarray:
    v = []
    for g in gpus:
        v += [math.log(p.eta[g][0]), math.log(p.eta[g][1])]
    return np.array(v + [math.log(p.step_overhead_s), math.log(p.seq_overhead_s), math.log(p.request_overhead_s),
                         math.log(p.v0_step_overhead_s), math.log(p.v0_seq_overhead_s),
                         math.log(p.v0_request_overhead_s), math.log(p.inproc_request_overhead_s),
                         math.log(p.step_gpu_s)])


def _unpack(x: np.ndarray, gpus: list[str]) -> Params:
    eta = {g: (float(np.clip(math.exp(x[2 * i]), *BOUNDS["eta_m"])), float(np.clip(math.exp(x[2 * i + 1]), *BOUNDS["eta_c"])))
           for i, g in enumerate(gpus)}
    o, q, r, o0, q0, r0, ri, g = (float(np.clip(math.exp(x[-8 + i]), *BOUNDS[k])) for i, k in enumerate("oqroqrrg"))
    return Params(eta=eta, step_overhead_s=o, seq_overhead_s=q, request_overhead_s=r,
                  v0_step_overhead_s=o0, v0_seq_overhead_s=q0, v0_request_overhead_s=r0,
                  inproc_request_overhead_s=ri, step_gpu_s=g)


Residuals = Callable[[Params], list[tuple[float, float, float]]]  # [(pred, meas, weight)]


def _vector(res: Residuals, p: Params) -> np.ndarray:
    out = []
    for pred, meas, w in res(p):
        ratio = pred / meas if pred > 0 and math.isfinite(pred) else 1e3
        e = math.log(max(ratio, 1e-3))
        rho = 2 * SOFT_L1**2 * (math.sqrt(1 + (e / SOFT_L1) ** 2) - 1)
        out.append(math.sqrt(w * rho) * (1 if e >= 0 else -1))
    return np.array(out)


def fit(res: Residuals, gpus: list[str], prior: Params, iterations: int = 12, ridge: float = RIDGE,
        log: Callable[[str], None] | None = None, hold_host: bool = False) -> Params:
    """theta* of the module docstring: Levenberg-Marquardt on the log residuals, from `prior`.
    `hold_host`: only the GPUs' efficiencies move; the overheads stay at the prior's."""
    x0 = _pack(prior, gpus)
    x = x0.copy()
    mu = 1e-2
    ridge = math.sqrt(ridge)
    free = np.arange(2 * len(gpus) if hold_host else x.size)

    def full(z: np.ndarray) -> np.ndarray:
        return np.concatenate([_vector(res, _unpack(z, gpus)), ridge * (z - x0)])

    e = full(x)
    for it in range(iterations):
        J = np.zeros((e.size, x.size))
        for i in free:
            z = x.copy()
            z[i] += FD_STEP
            J[:, i] = (full(z) - e) / FD_STEP
        improved = False
        for _ in range(6):
            step = np.linalg.solve(J.T @ J + mu * np.diag(np.diag(J.T @ J) + 1e-9), -J.T @ e)
            cand = _pack(_unpack(x + step, gpus), gpus)  # clip into the bounds
            ec = full(cand)
            if ec @ ec < e @ e:
                x, e, mu, improved = cand, ec, mu / 3, True
                break
            mu *= 4
        if log is not None:
            log(f"iteration {it + 1}: loss {float(e @ e):.4f}")
        if not improved or np.abs(step).max() < 1e-4:
            break
    return _unpack(x, gpus)


def abs_rel_errors(items: list[tuple[float, float]]) -> list[float]:
    """|pred - meas| / meas for each (pred, meas)."""
    return [abs(p - m) / m for p, m in items]


def median_interval(items: list[tuple[float, float]], reps: int = 2000, level: float = 0.9,
                    seed: int = 0) -> tuple[float, float]:
    """Bootstrap interval of the median absolute relative error: the (1 - level) / 2 and (1 + level) / 2
    quantiles of the median over `reps` resamples of the rows with replacement (seeded, so the same
    rows give the same interval). Says how far a median over a few dozen rows can be trusted."""
    errs = np.array(abs_rel_errors(items))
    rng = np.random.default_rng(seed)
    meds = np.median(errs[rng.integers(0, errs.size, size=(reps, errs.size))], axis=1)
    lo, hi = np.quantile(meds, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def summary(items: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(median, p90) of the absolute relative errors; None without items."""
    if not items:
        return None
    errs = sorted(abs_rel_errors(items))
    return statistics.median(errs), float(np.percentile(errs, 90))
