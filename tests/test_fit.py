"""NNLS and the step-model fit on synthetic data with known coefficients (and a brute-force check)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hetcompile.perf.fit import Observation, fit_step_model, nnls


def _brute_nnls(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The optimum over every support set (exact for small n): unconstrained lstsq on the support,
    kept when feasible; the best feasible one is the NNLS solution."""
    best, best_r = np.zeros(A.shape[1]), float(np.linalg.norm(y))
    for k in range(1, A.shape[1] + 1):
        for cols in itertools.combinations(range(A.shape[1]), k):
            z = np.linalg.lstsq(A[:, cols], y, rcond=None)[0]
            if (z >= 0).all():
                x = np.zeros(A.shape[1])
                x[list(cols)] = z
                r = float(np.linalg.norm(A @ x - y))
                if r < best_r - 1e-12:
                    best, best_r = x, r
    return best


@pytest.mark.parametrize("seed", range(20))
def test_nnls_matches_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(8, 4))
    y = rng.normal(size=8)
    x = nnls(A, y)
    assert (x >= 0).all()
    ref = _brute_nnls(A, y)
    assert np.linalg.norm(A @ x - y) == pytest.approx(np.linalg.norm(A @ ref - y), rel=1e-9, abs=1e-12)
    np.testing.assert_allclose(x, ref, atol=1e-8)


def test_nnls_clamps_a_negative_coefficient() -> None:
    A = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
    y = np.array([3.0, 2.0, 1.0])  # least squares slope is -1: NNLS keeps it at 0
    x = nnls(A, y)
    assert x[1] == 0.0 and x[0] == pytest.approx(2.0)


def test_fit_recovers_known_coefficients() -> None:
    o, c, k, r = 0.004, 2e-5, 3e-8, 0.012
    obs = []
    for n in (1, 2, 4, 8):
        for ctx in (32, 128, 512):
            S = n * ctx
            obs.append(Observation("step", n, S, o + c * n + k * S))
    for p in (16, 128, 512):
        obs.append(Observation("ttft", p, 0.0, r + o + c * p))
    fit = fit_step_model(obs)
    assert fit.step_s == pytest.approx(o, rel=1e-6)
    assert fit.per_token_s == pytest.approx(c, rel=1e-6)
    assert fit.per_kv_token_s == pytest.approx(k, rel=1e-6)
    assert fit.request_s == pytest.approx(r, rel=1e-6)
    assert fit.rel_rmse < 1e-9


def test_fit_with_noise_stays_close() -> None:
    rng = np.random.default_rng(4)
    o, c, k, r = 0.004, 2e-5, 3e-8, 0.012
    obs = []
    for n in (1, 2, 4, 8):
        for ctx in (32, 128, 512):
            obs.append(Observation("step", n, n * ctx, (o + c * n + k * n * ctx) * (1 + 0.02 * rng.normal())))
    for p in (16, 128, 512):
        obs.append(Observation("ttft", p, 0.0, (r + o + c * p) * (1 + 0.02 * rng.normal())))
    fit = fit_step_model(obs)
    assert fit.step_s == pytest.approx(o, rel=0.1)
    assert fit.request_s == pytest.approx(r, rel=0.2)
    assert 0.005 < fit.rel_rmse < 0.05


def test_fit_rejects_empty_and_nonpositive() -> None:
    with pytest.raises(ValueError):
        fit_step_model([])
    with pytest.raises(ValueError):
        fit_step_model([Observation("step", 1, 0, 0.0)])


def test_fit_from_end_to_end_latencies() -> None:
    """What the sweep measures: whole-request latencies at (p, c) and TTFTs alone."""
    o, c, k, r = 0.004, 2e-5, 3e-8, 0.012
    O = 32
    obs = []
    for p in (16, 64, 128):
        for n in (1, 4, 16):
            S = n * (p + O / 2)
            e2e = r + (o + c * p) + (O - 1) * (o + c * n + k * S)
            obs.append(Observation("e2e", n, S, e2e, prompt_tokens=p, output_tokens=O))
        obs.append(Observation("ttft", p, 0.0, r + o + c * p))
    fit = fit_step_model(obs)
    assert (fit.step_s, fit.per_token_s, fit.per_kv_token_s, fit.request_s) == pytest.approx((o, c, k, r), rel=1e-6)
    assert fit.predict(obs[0]) == pytest.approx(obs[0].seconds, rel=1e-9)
