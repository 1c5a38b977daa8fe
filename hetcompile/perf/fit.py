"""Fit the step-time model's coefficients to measurements: non-negative least squares (numpy only).

Seed 004 (§3.2, eq. 3-4) fits a replica's latency as linear in batch size and context length from
a one-time profiling sweep. `hetcompile profile` measures, per sweep point, the mean inter-token
latency (one decode engine step) and, alone on the server, the time to first token (one prefill
step plus the per-request overhead: HTTP, tokenization, scheduling). The linear model is the
memory-bound special case of perf/stepmodel.py (f = a = 0):

    step(n, S)  = o + c * n + k * S          o: fixed cost per engine step (scheduler, sampling,
                                             reading the weights), c: per token in the step,
                                             k: per context token read by decode attention
    ttft(p)     = r + step(p, 0)             r: per-request overhead, p prompt tokens

    e2e(p, n, S, O) = ttft(p) + (O - 1) step(n, S)     a whole request: its prefill, then O - 1
                                                      decode steps among n sequences

so every measured ITL gives a row [1, n, S, 0], every TTFT a row [1, p, 0, 1] and every end-to-end
latency a row [O, p + (O-1) n, (O-1) S, 1] (streamed chunk times are unreliable on a loaded host:
the server coalesces tokens into one chunk when the client lags, so the sweep fits end-to-end
latencies and the TTFT of requests alone); x = (o, c, k, r)
>= 0 solves min ||A x - y|| (Lawson-Hanson active set, as scipy.optimize.nnls, without scipy).
Rows are weighted by 1/y so short and long steps count in relative error alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

COEFFICIENTS = ("step_s", "per_token_s", "per_kv_token_s", "request_s")


def nnls(A: np.ndarray, y: np.ndarray, max_iter: int | None = None, tol: float | None = None) -> np.ndarray:
    """argmin_{x >= 0} ||A x - y||_2 by Lawson and Hanson's active-set method (1974, ch. 23)."""
    A = np.asarray(A, dtype=float)
    y = np.asarray(y, dtype=float)
    m, n = A.shape
    if tol is None:
        tol = 10 * max(m, n) * np.finfo(float).eps * max(1.0, float(np.abs(A).max(initial=0.0)))
    max_iter = max_iter or 3 * n + 30
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = A.T @ (y - A @ x)
    for _ in range(max_iter):
        if passive.all() or (w[~passive] <= tol).all():
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(A[:, passive], y, rcond=None)[0]
            if (z[passive] > tol).all():
                x = z
                break
            # step back towards x until the first passive variable reaches zero, drop it
            mask = passive & (z <= tol)
            denom = x[mask] - z[mask]
            alpha = float(np.min(np.where(denom > 0, x[mask] / np.where(denom > 0, denom, 1.0), 0.0)))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        w = A.T @ (y - A @ x)
    return x


@dataclass(frozen=True)
class Observation:
    """One measured quantity: an inter-token latency ('step'), a time to first token ('ttft') or a
    request's end-to-end latency ('e2e')."""

    kind: str  # "step" | "ttft" | "e2e"
    tokens: float  # n: tokens in a decode step (sequences), or the prompt length for ttft
    kv_tokens: float  # S: context tokens read by a decode step (0 for ttft)
    seconds: float
    prompt_tokens: float = 0.0  # e2e: p
    output_tokens: float = 0.0  # e2e: O

    def row(self) -> list[float]:
        if self.kind == "step":
            return [1.0, self.tokens, self.kv_tokens, 0.0]
        if self.kind == "ttft":
            return [1.0, self.tokens, 0.0, 1.0]
        d = self.output_tokens - 1.0
        return [self.output_tokens, self.prompt_tokens + d * self.tokens, d * self.kv_tokens, 1.0]


@dataclass(frozen=True)
class Fit:
    step_s: float
    per_token_s: float
    per_kv_token_s: float
    request_s: float
    rows: int
    rel_rmse: float  # root mean square of (predicted - measured) / measured

    def predict(self, obs: Observation) -> float:
        return float(np.dot(obs.row(), [self.step_s, self.per_token_s, self.per_kv_token_s, self.request_s]))


def fit_step_model(observations: list[Observation]) -> Fit:
    """The module docstring's (o, c, k, r) by weighted NNLS over `observations`."""
    if not observations:
        raise ValueError("no observations to fit")
    A = np.array([o.row() for o in observations])
    y = np.array([o.seconds for o in observations])
    if (y <= 0).any():
        raise ValueError("measured times must be positive")
    wgt = 1.0 / y
    Aw = A * wgt[:, None]
    # columns differ by ~1e5 in scale (1 vs tokens vs context tokens); NNLS is invariant under
    # positive column scaling, and its tolerances are not, so solve on unit-norm columns
    scale = np.linalg.norm(Aw, axis=0)
    scale[scale == 0] = 1.0
    x = nnls(Aw / scale, y * wgt) / scale
    rel = (A @ x - y) / y
    return Fit(
        step_s=float(x[0]), per_token_s=float(x[1]), per_kv_token_s=float(x[2]), request_s=float(x[3]),
        rows=len(observations), rel_rmse=float(np.sqrt(np.mean(rel**2))),
    )


def roofline_from_tables(decode_time: tuple[tuple[float, float], ...], prefill_time: tuple[tuple[float, float], ...],
                         context_tokens: float):
    """A per-layer roofline (perf/stepmodel.LayerCost) for a measured layer profile's tables, so that a
    stage measured as tables (Helix's decode / prompt time per layer) runs on the one step model.

    Decode points (b sequences at the mean context s, seconds per layer) fit t = w + k b s: w reads
    the weights, k the KV per context token. Prompt points (p tokens) fit t = f p + a p^2 / 2: dense
    compute per token and causal attention per pair. Both by NNLS weighted 1/t (relative error),
    on the points with b, p > 0. The roofline's max(compute, memory) then prices mixed steps."""
    from hetcompile.perf.stepmodel import LayerCost

    dec = [(b, t) for b, t in decode_time if b > 0 and t > 0]
    pre = [(p, t) for p, t in prefill_time if p > 0 and t > 0]
    w = k = f = a = 0.0
    if dec:
        A = np.array([[1.0, b * context_tokens] for b, _ in dec])
        y = np.array([t for _, t in dec])
        w, k = (float(v) for v in _nnls_rel(A, y))
    if pre:
        A = np.array([[p, p * p / 2.0] for p, _ in pre])
        y = np.array([t for _, t in pre])
        f, a = (float(v) for v in _nnls_rel(A, y))
    return LayerCost(weights_s=w, kv_s_per_token=k, flop_s_per_token=f, attn_s_per_pair=a)


def _nnls_rel(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """NNLS in relative error, on unit-norm columns (as fit_step_model)."""
    Aw = A / y[:, None]
    scale = np.linalg.norm(Aw, axis=0)
    scale[scale == 0] = 1.0
    return nnls(Aw / scale, np.ones(len(y))) / scale
