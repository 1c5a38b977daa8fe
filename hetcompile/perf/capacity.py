"""Capacity of a replica from its step-time model: the one formula compose and placement share.

Notation (a replica = a chain of d stages; a workload of I prompt and O output tokens):

    s   = I + O/2                         mean context of a sequence over its life
    C   = min(max_num_seqs, KV_min / s)   sequences in flight (vLLM's KV is the minimum over stages)
    b   = C / d                           micro-batch: d batches in flight keep d stages busy

What one engine step of a micro-batch carries, as vLLM's chunked prefill schedules it (the
simulator, hetcompile/simulate/engine.py, replays exactly this):
    B   = chunk_tokens - b                prompt tokens a step has room for after its decode tokens
    k   = ceil(I / B)                     steps a prompt takes; a request holds its slot O - 1 + k steps
    r   = b / (O - 1 + k)                 requests started (= finished) per step; dec = r (O - 1)
    KV full (C from the KV, not max_num_seqs or an SLO cap): vLLM admits greedily and preempts
        the newest sequence (recompute) when a decode token finds no KV slot; the free KV left
        after admission is uniform on [0, I + 1), so a step of dec new tokens preempts dec / (I + 1)
        sequences, each re-prefilling ~I + 1 tokens: dec recomputed prompt tokens per step, and
        each preemption holds a slot k more steps (r = b / (O - 1 + k + (O - 1) k / (I + 1))).
    P   = r I (+ dec when the KV is full)  mean prompt tokens per step
    prefill lumps: a whole prompt (up to B tokens) goes into the step after its request is admitted,
        so a step carries min(K I, B) prompt tokens with K ~ Poisson (prompts arriving during a
        step; the rate raised so that E[min(K I, B)] = P when lumps spill past the budget). Steps
        with a prompt are compute-bound and slow, decode-only steps memory-bound and fast: the
        mean step time is E_K[t_i(dec + lump)], not t_i(dec + P) (the roofline is convex).
        P >= B: prefill-bound, every step full, r = B / I.
    t_i(K) = stage i's step time for the lump (perf/stepmodel.py), with S = dec s context tokens
        read and A = dec s + lump I / 2 attention pairs (decode over its context; prompts causally),
        and m = dec + lump / I sequences for the host's per-sequence work q m
    W   = sum_{i>0} E[(t_n(i) - t_{n+1}(i-1))^+]   a micro-batch waits behind the (independently
        composed) batch ahead of it at every later stage: a prompt lump stalls the pipeline
    tau = max(max_i E[t_i], (sum_i E[t_i] + W + H) / d)   seconds between micro-batch steps: the
        slowest stage, or the round trip (H: hops) shared by d batches; with d >= 3 stages at least
        the lumps' fill and drain (cluster_interval: a lump holds every batch behind it at every
        stage, its round trip T_L less a quiet cycle d s when alone in its lap of d launches, L - s
        when another lump of the lap already stalls it; L its slowest stage, s the quiet interval)
    X   = r O / tau                       output tokens/s;  h = X / O requests/s
    TPOT = d tau                          seconds between a sequence's tokens at full load
    TTFT = o_r + R + sum over the prompt's chunks of the stage times + H, each chunk's step also
           carrying the micro-batch of the C - 1 other sequences' decode tokens, and the last one
           the prompts that arrived beside it (K' ~ Poisson(r), PASTA); R = E[tau^2] / (2 E[tau])
           over the step mix, the wait for the step in progress (length-biased; 0 on an idle
           replica, C <= 1), plus tau on a one-stage replica with async scheduling (vLLM V1's
           default: the next batch was formed when the step in progress launched, so the request
           joins the one after it). o_r: the per-request overhead; queueing for a slot or for the chunk
           budget, and the percentiles, are perf/tail.py's (bench/simulate_ttft.py)
`fluid=True` is the earlier formula (every step carries b decode tokens and b I / O prompt tokens,
no preemption, no waits), kept so the simulator's mechanics can be checked under its assumptions.

Everything is per workload run alone at full load (seed 003's h_{c,w}); compose mixes workloads
linearly through r_{c,w} / h_{c,w}.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hetcompile.perf.stepmodel import ReplicaModel

MIX_POINTS = 24  # most distinct step compositions the mix keeps (merged by quantile past that)


@dataclass(frozen=True)
class ChainEstimate:
    """Capacity of one chain for one workload."""

    concurrency: float
    decode_tokens_per_s: float
    prefill_tokens_per_s: float
    requests_per_s: float
    binding: str  # "bottleneck-stage" | "depth" | "max-num-seqs"
    ttft_s: float
    tpot_s: float
    step_wait_s: float = 0.0  # of ttft_s: the wait for the micro-batch step in progress (R)


@dataclass(frozen=True)
class StepMix:
    """What one micro-batch step carries on average (module docstring, "prefill lumps")."""

    decode: float  # decode sequences per step
    requests: float  # requests that start (and finish) per step: r
    prompt: float  # mean prompt tokens per step: P = r I
    lumps: tuple[tuple[float, float], ...]  # (probability, prompt tokens in the step)
    prefill_bound: bool  # the chunk budget, not the KV cache, limits admissions
    prompt_size: float  # tokens one prompt brings to a step (a lump of x tokens is x / this prompts)
    lump_rate: float = 0.0  # mu: prompts per step of the lumps' Poisson (0: no lumps drawn)
    lump_cap: float = 0.0  # prompt tokens a step has room for (B = chunk_tokens - b)


# --- fast (fluid) mode: placement's search ------------------------------------------------------
# The same step model and the same tau = max(slowest stage, round trip / d), with every micro-batch
# step carrying its even share of prompt tokens (b decode tokens and b I / O prompt tokens) instead
# of the lumps and waits of the full mode: cheap enough for tens of thousands of chain evaluations,
# and ranking chains the way the full mode does. Every number a plan reports comes from the full
# mode (chain_capacity); placement only searches with this one.


def fluid_batch(b: float, input_tokens: float, output_tokens: float) -> tuple[float, float, float, float]:
    """(tokens n, context tokens read S, attention pairs A, sequences m) of one fluid micro-batch
    step of b sequences: b decode tokens over contexts s = I + O/2, and b I / O prompt tokens that
    attend causally over their prompt."""
    s = input_tokens + output_tokens / 2.0
    p = b * input_tokens / output_tokens
    return b + p, b * s, b * s + p * input_tokens / 2.0, b + p / max(input_tokens, 1.0)


def fluid_rate(times: list[float] | tuple[float, ...], hops_s: float, C: float) -> tuple[float, bool]:
    """(X decode tokens/s, True if the slowest stage binds) of a chain whose micro-batch steps take
    `times` per stage and `hops_s` over its hops, with C sequences in flight: b = C / d per step,
    tau = max(max_i t_i, (sum_i t_i + H) / d), X = b / tau (the module docstring's tau without waits)."""
    d = len(times)
    stage, depth = max(times), (sum(times) + hops_s) / d
    tau = max(stage, depth)
    return (C / d / tau if tau > 0 else 0.0), stage >= depth


@dataclass(frozen=True)
class FluidEstimate:
    """A chain's fast-mode capacity for one workload (placement's objective)."""

    decode_tokens_per_s: float  # X
    concurrency: float  # C
    micro_batch: float  # b = C / d
    stage_times: tuple[float, ...]  # t_i of one micro-batch step
    hops_s: float
    stage_bound: bool


def fluid_capacity(rm: ReplicaModel, input_tokens: float, output_tokens: float,
                   max_concurrency: float | None = None) -> FluidEstimate:
    """Fast mode of chain_capacity (the block comment above)."""
    C = concurrency(rm, input_tokens, output_tokens)
    if max_concurrency is not None:
        C = max(min(C, max_concurrency), 1e-9)
    b = C / rm.depth
    n, S, A, m = fluid_batch(b, input_tokens, output_tokens)
    times = tuple(rm.stage_times(n, S, A, m))
    hops = rm.hop_time(n)
    X, stage_bound = fluid_rate(times, hops, C)
    return FluidEstimate(decode_tokens_per_s=X, concurrency=C, micro_batch=b, stage_times=times, hops_s=hops,
                         stage_bound=stage_bound)


def concurrency(rm: ReplicaModel, input_tokens: float, output_tokens: float) -> float:
    s = input_tokens + output_tokens / 2.0
    return max(min(float(rm.max_num_seqs), rm.kv_capacity_tokens / s), 1e-9)


POISSON_CUT = -40.0  # log-weights below this are left out (e^-40 ~ 4e-18)


def _poisson_window(mu: float) -> tuple[int, int, float, float]:
    """(lo, hi, log mu, log-weight of lo) of K ~ Poisson(mu) over k within 8 standard deviations,
    mu > 0: log P(k) = k log mu - mu - log k!, stepped by + log mu - log k from lo (lgamma once).
    _poisson and _mean_lump walk it inline (the latter is a hot loop: no generator)."""
    lo, hi = max(0, int(mu - 8.0 * math.sqrt(mu) - 1)), int(mu + 8.0 * math.sqrt(mu) + 2)
    log_mu = math.log(mu)
    return lo, hi, log_mu, lo * log_mu - mu - math.lgamma(lo + 1)


def _poisson(mu: float) -> list[tuple[int, float]]:
    """(k, P(K = k)) for K ~ Poisson(mu) over _poisson_window (mass kept whole)."""
    if mu <= 0:
        return [(0, 1.0)]
    lo, hi, log_mu, x = _poisson_window(mu)
    out = []
    for k in range(lo, hi + 1):
        if k > lo:
            x += log_mu - math.log(k)
        if x > POISSON_CUT:
            out.append((k, math.exp(x)))
    total = sum(p for _, p in out)
    return [(k, p / total) for k, p in out]


def _lumps(mu: float, size: float, cap: float) -> list[tuple[float, float]]:
    """(probability, tokens) of min(K size, cap), K ~ Poisson(mu); at most MIX_POINTS points
    (Poisson's many points merged by quantile where mu is large: the spread is then small)."""
    pts: dict[float, float] = {}
    for k, p in _poisson(mu):
        v = min(k * size, cap)
        pts[v] = pts.get(v, 0.0) + p
    items = sorted(pts.items())
    if len(items) <= MIX_POINTS:
        return [(p, v) for v, p in items]
    merged, acc, wsum = [], 0.0, 0.0
    per = 1.0 / MIX_POINTS
    for v, p in items:
        acc += p
        wsum += p * v
        if acc >= per - 1e-12:
            merged.append((acc, wsum / acc))
            acc, wsum = 0.0, 0.0
    if acc > 0:
        merged.append((acc, wsum / acc))
    return merged


def _mean_lump(mu: float, size: float, cap: float) -> float:
    """E[min(K size, cap)], K ~ Poisson(mu), over _poisson's points (the mean of _lumps without
    building them): one pass over the same window, normalized once, no list. step_mix's bisection
    calls this 40 times per step mix (scale1072's profile pass: 720,000 calls)."""
    if mu <= 0:
        return 0.0
    lo, hi, log_mu, x = _poisson_window(mu)
    total, acc = 0.0, 0.0
    for k in range(lo, hi + 1):
        if k > lo:
            x += log_mu - math.log(k)
        if x > POISSON_CUT:
            p = math.exp(x)
            total += p
            acc += p * min(k * size, cap)
    return acc / total


def step_mix(rm: ReplicaModel, b: float, input_tokens: float, output_tokens: float, kv_full: bool = False) -> StepMix:
    """How prompts share the engine steps of a micro-batch of b sequences (module docstring).
    `kv_full`: the KV cache binds, so decode growth preempts (recompute) as vLLM does."""
    avail = max(1.0, rm.chunk_tokens - b)
    chunks = math.ceil(input_tokens / avail - 1e-9)
    steps = output_tokens - 1.0 + chunks  # a request occupies its slot for this many steps
    if kv_full:
        # each preemption (rate dec / (I + 1) per step) re-occupies a slot for `chunks` more steps
        steps += (output_tokens - 1.0) * chunks / (input_tokens + 1.0)
    r = b / steps
    P = r * input_tokens + (r * (output_tokens - 1.0) if kv_full else 0.0)  # + recomputed prompts
    if P >= avail * (1.0 - 1e-6):
        r = avail / input_tokens
        return StepMix(decode=r * (output_tokens - 1.0), requests=r, prompt=avail, lumps=((1.0, avail),),
                       prefill_bound=True, prompt_size=min(input_tokens, avail))
    size = min(input_tokens, avail)
    mu = P / size
    if _mean_lump(mu, size, avail) < P * (1.0 - 1e-9):
        # lumps past the budget spill into later steps: raise the lump rate until the work is kept
        lo, hi = mu, mu * 2.0
        while _mean_lump(hi, size, avail) < P:
            lo, hi = hi, hi * 2.0
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if _mean_lump(mid, size, avail) < P else (lo, mid)
        mu = hi
    return StepMix(decode=r * (output_tokens - 1.0), requests=r, prompt=P,
                   lumps=tuple(_lumps(mu, size, avail)), prefill_bound=False, prompt_size=size,
                   lump_rate=mu, lump_cap=avail)


def _lump_times(rm: ReplicaModel, mix: StepMix, tokens: float, input_tokens: float, output_tokens: float) -> list[float]:
    s = input_tokens + output_tokens / 2.0
    return rm.stage_times(mix.decode + tokens, mix.decode * s, mix.decode * s + tokens * input_tokens / 2.0,
                          mix.decode + tokens / max(mix.prompt_size, 1.0))


def point_stage_times(rm: ReplicaModel, mix: StepMix, input_tokens: float, output_tokens: float) -> list[tuple[float, list[float]]]:
    """(probability, t_i per stage) of each step composition: decode tokens read their contexts,
    prompt tokens attend causally over their prompt; the step's sequences are the decode ones and
    the prompts of the lump."""
    return [(p, _lump_times(rm, mix, tokens, input_tokens, output_tokens)) for p, tokens in mix.lumps]


def behind_given_ahead(rm: ReplicaModel, mix: StepMix, points: list[tuple[float, list[float]]],
                       input_tokens: float, output_tokens: float) -> list[list[tuple[float, list[float]]]] | None:
    """For each composition of a micro-batch (points), the distribution of the one launched after it.
    The batch behind takes the prompts that arrived while the one ahead held stage 0, so its lump is
    Poisson(mu t_ahead(0) / E[t(0)]): after a long prompt lump the next batch carries a lump more
    often, and the two overlap on the pipeline instead of stalling it one after the other. None when
    the mix draws no lumps (every batch alike)."""
    if mix.lump_rate <= 0 or mix.prefill_bound or len(points) < 2:
        return None
    g = sum(p * ts[0] for p, ts in points)
    cache: dict[float, list[float]] = {}
    out = []
    for _, ahead in points:
        dist = []
        for q, tokens in _lumps(mix.lump_rate * ahead[0] / g, mix.prompt_size, mix.lump_cap):
            key = round(tokens, 6)
            if key not in cache:
                cache[key] = _lump_times(rm, mix, tokens, input_tokens, output_tokens)
            dist.append((q, cache[key]))
        out.append(dist)
    return out


def mean_stage_times(points: list[tuple[float, list[float]]], depth: int) -> list[float]:
    """E[t_i] over the step mix."""
    return [sum(p * ts[i] for p, ts in points) for i in range(depth)]


def overtake_wait(points: list[tuple[float, list[float]]], depth: int,
                  behind: list[list[tuple[float, list[float]]]] | None = None) -> float:
    """Expected seconds a micro-batch waits, over its trip through the stages, behind the batch
    launched just before it: batch n+1 reaches stage i after t_{n+1}(i-1) and finds it busy for
    t_n(i); E[sum_i (t_n(i) - t_{n+1}(i-1))^+]. `behind[j]`: the distribution of batch n+1 given
    batch n is points[j] (behind_given_ahead); None: consecutive batches independent draws."""
    wait = 0.0
    for j, (p, ahead) in enumerate(points):
        for q, after in (behind[j] if behind is not None else points):
            for i in range(1, depth):
                gap = ahead[i] - after[i - 1]
                if gap > 0:
                    wait += p * q * gap
    return wait


def cluster_interval(rm: ReplicaModel, mix: StepMix, points: list[tuple[float, list[float]]],
                     input_tokens: float, output_tokens: float) -> float:
    """tau of a pipeline of d >= 3 stages from its prompt lumps' fill and drain (module docstring).

    The d micro-batches in flight cycle through the stages in order, so a batch carrying a lump holds
    every batch behind it at every stage: alone in its lap (the d launches that share one cycle), it
    stretches the cycle from d s (s: the quiet step interval) to its own round trip T_L = sum_i t_i + H,
    a cost of T_L - d s (d (L - s) when the stages are alike, L the lump's slowest stage). Another
    lump in the same lap waits inside that stall and costs only its own L - s at the slowest stage.
    With q = P(a launch carries a lump), drawn independently per launch (at saturation a batch's
    prompts replace its cohort's finished sequences, and lengths that vary make those independent),
    a lap of d launches holds at least one lump with probability 1 - (1 - q)^d, so the stall is paid
    by a share phi = (1 - (1 - q)^d) / (d q) of the lumps: a lump costs (L - s) + (T_L - d s - (L - s)) phi.
    (It was d (L - s)(1 + (d - 1)(1 - pi)), pi = P(the next launch carries a lump), a fixed point:
    on the deep chains of unlike stages of the helix examples that charged the slowest stage's lump
    time at every stage and missed lumps sharing a lap: 1.14-1.75x conservative against the simulator
    with geometric output lengths; bench/README.md.)"""
    d = rm.depth
    quiet = _lump_times(rm, mix, 0.0, input_tokens, output_tokens)
    s = max(max(quiet), (sum(quiet) + rm.hop_time(mix.decode)) / d)
    floor = max(mean_stage_times(points, d))
    lumps = [(p, ts, tokens) for (p, ts), (_, tokens) in zip(points, mix.lumps) if max(ts) > s]
    q = sum(p for p, _, _ in lumps)
    phi = (1.0 - (1.0 - q) ** d) / (d * q) if q > 0 else 1.0
    extra = 0.0
    for p, ts, tokens in lumps:
        L = max(ts)
        alone = max(sum(ts) + rm.hop_time(mix.decode + tokens) - d * s, L - s)
        extra += p * ((L - s) + (alone - (L - s)) * phi)
    return max(s + extra, floor)


def step_interval(rm: ReplicaModel, C: float, input_tokens: float, output_tokens: float,
                  fluid: bool = False, kv_full: bool = False) -> tuple[float, StepMix, bool]:
    """(tau: seconds between micro-batch steps, the step mix, True if the slowest stage binds).
    `fluid`: every step carries b decode tokens and its even share b I / O of prompt tokens."""
    tau, mix, stage_bound, _ = _step_interval(rm, C, input_tokens, output_tokens, fluid, kv_full)
    return tau, mix, stage_bound


def _step_interval(rm: ReplicaModel, C: float, input_tokens: float, output_tokens: float, fluid: bool,
                   kv_full: bool) -> tuple[float, StepMix, bool, list[tuple[float, list[float]]]]:
    """step_interval, and the stage times of each step composition (point_stage_times) it used."""
    d = rm.depth
    b = C / d
    if fluid:
        mix = StepMix(decode=b, requests=b / output_tokens, prompt=b * input_tokens / output_tokens,
                      lumps=((1.0, b * input_tokens / output_tokens),), prefill_bound=False,
                      prompt_size=input_tokens)
    else:
        mix = step_mix(rm, b, input_tokens, output_tokens, kv_full)
    points = point_stage_times(rm, mix, input_tokens, output_tokens)
    times = mean_stage_times(points, d)
    stage = max(times)
    wait = 0.0 if fluid or d == 1 else overtake_wait(points, d, behind_given_ahead(rm, mix, points, input_tokens, output_tokens))
    depth = (sum(times) + wait + rm.hop_time(mix.decode + mix.prompt)) / d
    if d >= 3 and not fluid:
        # three or more stages: W understates what a prompt lump costs (bench/simulate_capacity.py)
        depth = max(depth, cluster_interval(rm, mix, points, input_tokens, output_tokens))
    return max(stage, depth), mix, stage >= depth, points


def decode_rate(rm: ReplicaModel, C: float, input_tokens: float, output_tokens: float) -> tuple[float, bool]:
    """(X output tokens/s at C sequences in flight, True if the slowest stage binds)."""
    tau, mix, stage = step_interval(rm, C, input_tokens, output_tokens,
                                    kv_full=C >= concurrency(rm, input_tokens, output_tokens) and C < rm.max_num_seqs)
    return mix.requests * output_tokens / tau, stage


def prefill_time(rm: ReplicaModel, prompt_tokens: float, others: float = 0.0, context: float = 0.0) -> float:
    """TTFT of one request: the per-request overhead, then its prompt in chunks of `chunk_tokens`,
    each chunk's attention over the prompt so far, through every stage, plus the hops. `others`
    decode sequences of mean context `context` share each chunk's step (0: an idle replica)."""
    total, done = rm.request_overhead_s, 0.0
    while done < prompt_tokens - 1e-9:
        n = min(float(rm.chunk_tokens), prompt_tokens - done)
        pairs = n * done + n * n / 2.0 + others * context
        total += sum(rm.stage_times(n + others, done + others * context, pairs, others + 1.0)) + rm.hop_time(n + others)
        done += n
    return total


def step_residual(points: list[tuple[float, list[float]]], rm: ReplicaModel, mix: StepMix) -> float:
    """R = E[tau^2] / (2 E[tau]): the mean time left of the micro-batch step in progress when a
    request arrives at a random instant (steps with a prompt lump are long, so an arrival lands in
    them more often than their share of steps: length-biased)."""
    hop = rm.hop_time(mix.decode + mix.prompt)
    taus = [(p, max(max(ts), (sum(ts) + hop) / rm.depth)) for p, ts in points]
    m1 = sum(p * t for p, t in taus)
    return sum(p * t * t for p, t in taus) / (2.0 * m1) if m1 > 0 else 0.0


def first_token_time(rm: ReplicaModel, mix: StepMix, input_tokens: float, others: float, context: float) -> float:
    """TTFT of a request that arrives at a replica running `others` decode sequences per micro-batch:
    prefill_time, with the step that completes the prompt also carrying the prompts that arrived
    beside it. Arrivals per step are Poisson(r) (r = mix.requests), and by PASTA the number that
    arrive with a given request is Poisson(r) too: K' prompts of mix.prompt_size tokens, as many as
    fit the budget left after this prompt's last chunk, make that step longer."""
    base = prefill_time(rm, input_tokens, others, context)
    if mix.requests <= 0 or input_tokens <= 0:
        return base
    n = input_tokens - rm.chunk_tokens * (math.ceil(input_tokens / rm.chunk_tokens - 1e-9) - 1)  # last chunk
    done = input_tokens - n
    room = max(0.0, rm.chunk_tokens - others - n)
    if room <= 0:
        return base
    seqs = others + 1.0
    pairs = n * done + n * n / 2.0 + others * context
    kv = done + others * context
    t0 = sum(rm.stage_times(n + others, kv, pairs, seqs))
    extra = 0.0
    for k, p in _poisson(mix.requests):
        more = min(k * mix.prompt_size, room)
        if more > 0:
            t1 = sum(rm.stage_times(n + others + more, kv, pairs + more * mix.prompt_size / 2.0,
                                    seqs + more / max(mix.prompt_size, 1.0)))
            extra += p * (t1 - t0)
    return base + extra


def prefill_rate(rm: ReplicaModel) -> float:
    """Prompt tokens/s of full chunks through the slowest stage."""
    n = float(rm.chunk_tokens)
    return n / max(rm.stage_times(n, 0.0, n * n / 2.0, 1.0))


def chain_capacity(rm: ReplicaModel, input_tokens: float, output_tokens: float, max_concurrency: float | None = None,
                   fluid: bool = False) -> ChainEstimate:
    """The module docstring's formulas; `max_concurrency` caps C below the engine's (SLO sizing);
    `fluid` spreads the prompt tokens evenly over the steps (the pre-lump formula, kept for the
    simulator's mechanics check)."""
    C = concurrency(rm, input_tokens, output_tokens)
    kv_bound = C < rm.max_num_seqs
    if max_concurrency is not None and max_concurrency < C:
        C, kv_bound = max(max_concurrency, 1e-9), False
    tau, mix, stage_bound, points = _step_interval(rm, C, input_tokens, output_tokens, fluid, kv_bound)
    others, context = max(C - 1.0, 0.0) / rm.depth, input_tokens + output_tokens / 2.0
    wait = 0.0
    if not fluid and C > 1.0:
        # the replica is stepping when the request arrives (C - 1 others in flight): it waits for the step in progress
        wait = min(1.0, C - 1.0) * step_residual(points, rm, mix)
        if rm.schedules_ahead:
            # async scheduling: the next batch was formed when the step in progress launched, so the
            # request waits for that one too (simulate/engine.py)
            wait += min(1.0, C - 1.0) * tau
    X = mix.requests * output_tokens / tau
    if mix.prefill_bound:
        C = mix.requests * (output_tokens - 1.0 + math.ceil(input_tokens / max(1.0, rm.chunk_tokens - C / rm.depth) - 1e-9)) * rm.depth
        binding = "bottleneck-stage" if stage_bound else "depth"
    elif not kv_bound and C >= rm.max_num_seqs:
        binding = "max-num-seqs"
    else:
        binding = "bottleneck-stage" if stage_bound else "depth"
    return ChainEstimate(
        concurrency=C, decode_tokens_per_s=X, prefill_tokens_per_s=prefill_rate(rm),
        requests_per_s=X / output_tokens if X > 0 and math.isfinite(X) else 0.0, binding=binding,
        ttft_s=wait + (prefill_time(rm, input_tokens, others, context) if fluid or C <= 1.0
                       else first_token_time(rm, mix, input_tokens, others, context)),
        step_wait_s=wait,
        tpot_s=rm.depth * tau,
    )

# SLO sizing (the load at which a percentile of TTFT and TPOT holds) and the headroom: perf/tail.py.
