"""observe: sample the router's and every replica's /metrics over a window -> ObservedDoc.

Each target (the router, each replica with an endpoint in the routing table) is scraped `rounds`
times, `interval` seconds apart. Counters and histograms are read as the difference between a
target's first and last good scrape (prom.py), gauges as the mean over its scrapes, so a window of
10 minutes measures 10 minutes, not one instant.

The correction of replica r is the step-time factor k_r under which the plan's step model,
replayed by the simulator at the replica's own measured load (its arrival rate lambda_r = (requests
finished + the change in requests running or waiting) / window, at its measured lengths), shows
the replica's measured mean inter-token latency ITL_r:

    ITL_sim(k_r x model; lambda_r, I_r, O_r) = ITL_r          (solved by secant steps on log k)

At the same arrival rate a faster engine also runs smaller batches, so ITL is not proportional to
k; comparing at the measured load through the model's own replay measures the speed, not the load.
`predicted_itl_s` is ITL_sim at k = 1: what the plan's model predicts at that measured load. Pooled
per (GPU, TP) over single-type replicas, weighted by their inter-token intervals n_r:

    k_{g,t} = exp(sum_r n_r log k_r / sum_r n_r)

bounded to [1/3, 3] and, with a previous observation, smoothed geometrically
(k = k_prev^(1-a) k_new^a, a = SMOOTHING), and only where sum n_r >= MIN_TOKENS.
"""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from hetcompile.errors import HetcompileError
from hetcompile.observe import prom
from hetcompile.plan.observed import MIN_REQUESTS, Dist, ObservedDoc, ObservedReplica, ObservedWorkload, StepCorrection
from hetcompile.perf.stepmodel import scaled
from hetcompile.plan.doc import PlanDoc, PlanReplica, PlanWorkload
from hetcompile.plan.routing import ROUTER_TOKEN_ENV, SECRET_FILES, VLLM_KEY_ENV, RoutingTable
from hetcompile.simulate.run import finished_at, mix_requests

MIN_TOKENS = 200  # inter-token intervals a correction needs (fewer: noise, not a speed)
FACTOR_BOUNDS = (1.0 / 3.0, 3.0)  # a correction beyond these is a broken deployment, not a model error
SMOOTHING = 0.5  # weight of this window's correction against the previous observation's
SECANT_STEPS = 8  # replays per replica at most when solving for k_r
TOLERANCE = 0.01  # |log(ITL_sim / ITL_r)| that counts as solved (a window's own noise is larger)
MAX_REPLAY_S = 600.0  # seconds of arrivals each replay simulates (the window, up to this)

# vLLM V1's metric names (vllm/v1/metrics/loggers.py), and the router's (router/metrics.py)
PROMPT, OUTPUT = "vllm:request_prompt_tokens", "vllm:request_generation_tokens"
TTFT, ITL, TPOT = "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:request_time_per_output_token_seconds"
SUCCESS = "vllm:request_success_total"
RUNNING, WAITING, KV = "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"
ROUTER_REQUESTS = "hetcompile_router_requests_total"


class ObserveError(HetcompileError):
    kind = "observe error"


class ScrapeError(Exception):
    """One /metrics read failed; `text` says why in words."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


Fetch = Callable[[str, dict[str, str]], str]  # url, headers -> body, or ScrapeError


def http_fetch(url: str, headers: dict[str, str], timeout: float = 5.0) -> str:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as r:  # noqa: S310 - the plan's endpoints
            return r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        if e.code == 401:
            raise ScrapeError(f"401 unauthorized: pass the key deploy generated ({VLLM_KEY_ENV} for replicas, {ROUTER_TOKEN_ENV} for "
                              f"the router; `observe` also reads OUT/{SECRET_FILES[VLLM_KEY_ENV]} and OUT/{SECRET_FILES[ROUTER_TOKEN_ENV]})") from None
        raise ScrapeError(f"HTTP {e.code}") from None
    except (OSError, ValueError) as e:
        raise ScrapeError(f"unreachable ({getattr(e, 'reason', None) or e})") from None


@dataclass(frozen=True)
class Target:
    name: str  # "router" or a replica id
    url: str  # .../metrics
    headers: dict[str, str]


Scrapes = dict[str, list[tuple[float, prom.Samples]]]


def sample(targets: list[Target], fetch: Fetch, rounds: int, interval: float,
           clock: Callable[[], float], sleep: Callable[[float], None]) -> tuple[Scrapes, dict[str, str]]:
    """`rounds` scrapes of every target, `interval` s apart: (good scrapes per target, the last error
    per target that had one)."""
    got: Scrapes = {t.name: [] for t in targets}
    errors: dict[str, str] = {}
    for i in range(rounds):
        if i:
            sleep(interval)
        for t in targets:
            try:
                got[t.name].append((clock(), prom.parse(fetch(t.url, t.headers))))
            except ScrapeError as e:
                errors[t.name] = e.text
            except prom.ExpositionError as e:
                errors[t.name] = f"malformed /metrics: {e}"
    return got, errors


def _dist(h: prom.Hist | None) -> Dist | None:
    if h is None or h.count <= 0 or h.mean is None:
        return None
    pct = h.count >= MIN_REQUESTS
    return Dist(mean=h.mean, p50=h.quantile(0.5) if pct else None, p90=h.quantile(0.9) if pct else None,
                p99=h.quantile(0.99) if pct else None, samples=int(h.count))


def _window_hist(scrapes: list[tuple[float, prom.Samples]], name: str) -> prom.Hist | None:
    if len(scrapes) < 2:
        return None
    a, b = prom.histogram(scrapes[0][1], name), prom.histogram(scrapes[-1][1], name)
    return b.minus(a) if a is not None and b is not None else None


def _gauge_mean(scrapes: list[tuple[float, prom.Samples]], name: str) -> float | None:
    vals = [v for _, s in scrapes if (v := prom.total(s, name)) is not None]
    return sum(vals) / len(vals) if vals else None


def split_lengths(weighted: list[tuple[PlanWorkload, float]], I: float, O: float) -> dict[str, tuple[float, float, float]]:
    """name -> (its share of the weights, I_w, O_w): each workload's planned lengths times (measured
    mean / the plan's mean over `weighted`), so the mix keeps the plan's spread between workloads
    and has the measured means I and O (vLLM's histograms are per model, not per workload; near
    capacity the spread matters, the means alone do not carry it). {} when the weights sum to 0."""
    tot = sum(x for _, x in weighted)
    if tot <= 0:
        return {}
    mi = sum(x * w.input_tokens for w, x in weighted) / tot
    mo = sum(x * w.output_tokens for w, x in weighted) / tot
    return {w.name: (x / tot, w.input_tokens * I / mi, w.output_tokens * O / mo) for w, x in weighted}


def replica_mix(plan: PlanDoc, r: PlanReplica, rate: float, I: float, O: float) -> list[tuple[float, int, int]]:
    """[(rate, I, O)] of the workloads routed to r: the plan's shares of them at the measured rate,
    with split_lengths's lengths."""
    split = split_lengths([(w, plan.routing.get(w.name, {}).get(r.id, 0.0) * w.served_requests_per_s) for w in plan.workloads], I, O)
    if not split:
        return [(rate, max(1, round(I)), max(2, round(O)))]
    return [(rate * s, max(1, round(i)), max(2, round(o))) for s, i, o in split.values() if s > 0]


def _sim_itl(rm, k: float, mix: list[tuple[float, int, int]], duration: float) -> float | None:
    """Mean inter-token latency of `rm` with step times x k, one replica under the workload mix."""
    reqs = mix_requests(scaled(rm, k), mix, duration, seed=0)
    n = sum(q.output_tokens - 1 for q in reqs if q.first_token is not None)
    return sum(finished_at(q) - q.first_token for q in reqs if q.first_token is not None) / n if n else None


def step_factor(plan: PlanDoc, r: PlanReplica, itl: float, rate: float, I: float, O: float,
                duration: float, guess: float | None = None) -> tuple[float | None, float | None]:
    """(ITL_sim at k = 1, k_r): the module docstring's fixed point, ITL within TOLERANCE or after SECANT_STEPS."""
    rm = r.replica_model()
    if rm is None or rate <= 0:
        return None, None
    lo, hi = (math.log(x) for x in FACTOR_BOUNDS)
    mix = replica_mix(plan, r, rate, I, O)
    base = _sim_itl(rm, 1.0, mix, duration)
    if base is None:
        return None, None
    x0, f0 = 0.0, math.log(base / itl)
    # first guess: the previous window's k (a steady fleet: often already within tolerance), else ITL proportional to k
    x1 = min(max(math.log(guess) if guess else -f0, lo), hi)
    for _ in range(SECANT_STEPS):
        if abs(f0) < TOLERANCE:
            return base, math.exp(x0)
        got = _sim_itl(rm, math.exp(x1), mix, duration)
        if got is None:
            return base, None
        f1 = math.log(got / itl)
        if abs(f1 - f0) < 1e-12:
            x0, f0 = x1, f1
            break
        x0, f0, x1 = x1, f1, min(max(x1 - f1 * (x1 - x0) / (f1 - f0), lo), hi)
    return base, math.exp(x0)


def _replica(plan: PlanDoc, r: PlanReplica, scrapes: list[tuple[float, prom.Samples]],
             guess: float | None = None) -> tuple[ObservedReplica, dict[str, prom.Hist | None]]:
    hists = {n: _window_hist(scrapes, n) for n in (PROMPT, OUTPUT, TTFT, ITL, TPOT)}
    done = 0
    if len(scrapes) >= 2:
        a, b = prom.total(scrapes[0][1], SUCCESS), prom.total(scrapes[-1][1], SUCCESS)
        done = int(b - a) if a is not None and b is not None and b >= a else 0
    running = _gauge_mean(scrapes, RUNNING)
    span = scrapes[-1][0] - scrapes[0][0] if len(scrapes) >= 2 else 0.0
    hi = hists[ITL]
    decoding = hi.sum / span if hi is not None and span > 0 else None  # C by Little's law (module docstring)
    hp, ho = hists[PROMPT], hists[OUTPUT]
    I = hp.mean if hp is not None else None
    O = ho.mean if ho is not None else None
    itl = _dist(hists[ITL])
    pred, corr, reason = None, None, None
    if len(scrapes) < 2:
        reason = "fewer than two scrapes"
    elif itl is None or decoding is None or I is None or O is None:
        reason = "no inter-token latency or token-length metrics in the window"
    else:
        if itl.samples < MIN_TOKENS:
            reason = f"{itl.samples} inter-token intervals in the window, fewer than {MIN_TOKENS}"
        else:
            # arrivals = completions + the change in requests held (running + waiting): a window that
            # starts on an emptier engine than it ends on would otherwise read a lower rate than arrived
            held = [(prom.total(x, RUNNING) or 0.0) + (prom.total(x, WAITING) or 0.0) for _, x in (scrapes[0], scrapes[-1])]
            rate = max(done + held[1] - held[0], 0.0) / span
            pred, corr = step_factor(plan, r, itl.mean, rate, I, O, min(span, MAX_REPLAY_S), guess)
            if pred is None or corr is None:
                reason = "the plan carries no step model for it, or it finished no request"
    rep = ObservedReplica(id=r.id, model=r.model, gpu=r.stages[0].gpu, tp=r.tp, pp=r.pp, scrapes=len(scrapes), requests=done,
                          running=running, decoding=decoding, waiting=_gauge_mean(scrapes, WAITING), kv_usage=_gauge_mean(scrapes, KV),
                          input_tokens=I, output_tokens=O, ttft_s=_dist(hists[TTFT]), itl_s=itl, predicted_itl_s=pred,
                          correction=corr, reason=reason)
    return rep, hists


def pooled_corrections(plan: PlanDoc, reps: list[ObservedReplica], previous: ObservedDoc | None) -> list[StepCorrection]:
    """k_{g,t} per (GPU, TP) over single-type replicas with a correction (module docstring)."""
    mixed = {r.id for r in plan.replicas if r.mixed}
    groups: dict[tuple[str, int], list[ObservedReplica]] = {}
    for o in reps:
        if o.correction is not None and o.id not in mixed:
            groups.setdefault((o.gpu, o.tp), []).append(o)
    before = {(c.gpu, c.tp): c.factor for c in (previous.corrections if previous else ())}
    out = []
    lo, hi = FACTOR_BOUNDS
    for (gpu, tp), rs in sorted(groups.items()):
        n = sum(o.itl_s.samples for o in rs if o.itl_s)
        if n < MIN_TOKENS:
            continue
        raw = math.exp(sum(math.log(o.correction or 1.0) * o.itl_s.samples for o in rs if o.itl_s) / n)
        k = min(max(raw, lo), hi)
        if (gpu, tp) in before:
            k = math.exp((1 - SMOOTHING) * math.log(before[(gpu, tp)]) + SMOOTHING * math.log(k))
        out.append(StepCorrection(gpu=gpu, tp=tp, factor=k, raw=raw, tokens=n, replicas=tuple(sorted(o.id for o in rs))))
    return out


def summarize(plan: PlanDoc, scrapes: Scrapes, errors: dict[str, str], interval: float, rounds: int,
              previous: ObservedDoc | None = None, not_deployed: tuple[str, ...] = ()) -> ObservedDoc:
    """The ObservedDoc of one window's scrapes (module docstring)."""
    missing = [f"{r}: no endpoint in router/routing.json (not deployed)" for r in not_deployed]
    missing += [f"{name}: {text}" + (f" ({len(scrapes.get(name, []))} of {rounds} scrapes read)" if scrapes.get(name) else "")
                for name, text in sorted(errors.items())]
    guesses = {o.id: o.correction for o in (previous.replicas if previous else ()) if o.correction}
    reps: list[ObservedReplica] = []
    by_model: dict[str, dict[str, prom.Hist | None]] = {}
    for r in plan.replicas:
        got = scrapes.get(r.id)
        if got is None:
            continue
        if len(got) < 2 and r.id not in errors:
            missing.append(f"{r.id}: fewer than two scrapes")
        o, hists = _replica(plan, r, got, guesses.get(r.id))
        reps.append(o)
        acc = by_model.setdefault(r.model, {})
        for name, h in hists.items():
            acc[name] = h if (prev := acc.get(name)) is None else prev.plus(h)
    router = scrapes.get("router", [])
    spans = [s[-1][0] - s[0][0] for s in scrapes.values() if len(s) >= 2]
    window = max(spans) if spans else 0.0
    if window <= 0:
        raise ObserveError("no target was scraped twice, so nothing was measured over a window"
                           + "".join(f"\n  {m}" for m in missing),
                           hint="check the endpoints in OUT/router/routing.json and the router URL")
    rspan = router[-1][0] - router[0][0] if len(router) >= 2 else 0.0
    if rspan <= 0:
        missing.append("router: not read twice; per-workload request rates are unknown (pass --router URL)")
    classes: dict[str, list[str]] = {}
    for w in plan.workloads:
        classes.setdefault(w.model, []).append(w.name)
    works = []
    rates: dict[str, float | None] = {}
    counts: dict[str, int] = {}
    for w in plan.workloads:
        n, rate = 0, None
        if rspan > 0:
            def ok(s: prom.Samples, name: str = w.name) -> float:
                return sum(v for (m, ls), v in s.items() if m == ROUTER_REQUESTS and dict(ls).get("class") == name
                           and dict(ls).get("code", "").startswith("2"))
            n = max(0, round(ok(router[-1][1]) - ok(router[0][1])))
            rate = n / rspan
        rates[w.name], counts[w.name] = rate, n
    for w in plan.workloads:
        acc = by_model.get(w.model, {})
        inp, outp = _dist(acc.get(PROMPT)), _dist(acc.get(OUTPUT))
        notes: tuple[str, ...] = ()
        if len(classes[w.model]) > 1:
            inp, outp = _class_lengths(plan, w, inp, outp, rates)
            notes = (f"vLLM counts per model: model {w.model} serves {len(classes[w.model])} workload classes, so its measured mean "
                     "lengths are split over them in the plan's proportions (no percentiles), and TTFT and TPOT are the model's",)
        works.append(ObservedWorkload(name=w.name, model=w.model, requests=counts[w.name], rate_per_s=rates[w.name],
                                      input_tokens=inp, output_tokens=outp,
                                      ttft_s=_dist(acc.get(TTFT)), tpot_s=_dist(acc.get(TPOT)), notes=notes))
    missing += [f"{o.id}: no correction: {o.reason}" for o in reps if o.reason and o.scrapes >= 2]
    return ObservedDoc(plan=plan.plan, spec_hash=plan.spec_hash, window_s=window, interval_s=interval, samples=rounds,
                       workloads=tuple(works), replicas=tuple(reps),
                       corrections=tuple(pooled_corrections(plan, reps, previous)), missing=tuple(missing))


def _class_lengths(plan: PlanDoc, w: PlanWorkload, inp: Dist | None, outp: Dist | None,
                   rates: dict[str, float | None]) -> tuple[Dist | None, Dist | None]:
    """Workload w's mean lengths when vLLM measured only its model's (`inp`, `outp`): split_lengths
    over the model's workloads, weighted by their observed rates (the plan's served rates where the
    router was not read); no percentiles."""
    weighted = [(x, r if (r := rates.get(x.name)) is not None else x.served_requests_per_s) for x in plan.workloads
                if x.model == w.model]
    split = split_lengths(weighted, inp.mean if inp else 1.0, outp.mean if outp else 1.0)
    if w.name not in split:
        return None, None
    _, i, o = split[w.name]
    return (Dist(mean=i, samples=inp.samples) if inp else None), (Dist(mean=o, samples=outp.samples) if outp else None)


def targets(table: RoutingTable, router_url: str | None, vllm_key: str | None, router_token: str | None) -> tuple[list[Target], tuple[str, ...]]:
    """(what to scrape, replica ids without an endpoint)."""
    out, absent = [], []
    if router_url:
        h = {"Authorization": f"Bearer {router_token}"} if router_token else {}
        out.append(Target("router", router_url.rstrip("/") + "/metrics", h))
    h = {"Authorization": f"Bearer {vllm_key}"} if vllm_key else {}
    for r in table.replicas:
        if r.endpoint:
            out.append(Target(r.id, r.endpoint.rstrip("/") + "/metrics", h))
        else:
            absent.append(r.id)
    return out, tuple(sorted(absent))
