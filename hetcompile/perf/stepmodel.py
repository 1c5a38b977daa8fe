"""The step-time model: what one engine step of a replica costs, as serializable coefficients.

vLLM runs continuous batching: every engine step feeds one batch through the pipeline; a batch
mixes decode sequences (one token each, reading their whole KV context) and chunks of prompts
(chunked prefill). One model of that step serves every consumer: the profile pass and placement
derive capacity from it (perf/capacity.py), the plan carries it per replica, the simulator replays
requests with it, and `hetcompile profile` fits it to a running server.

Per decoder layer on one stage of TP degree t (seconds; `LayerCost`):

    compute(n, A) = f * n + a * A            n tokens in the step (decode sequences + prompt
                                             tokens), A attention pairs (query token x context
                                             token, causal: a prompt of p tokens has p^2/2)
    memory(S)     = w + k * S                w: read the layer's weights once per step,
                                             k: read one context token's K+V (decode attention)
    layer(n, S, A) = max(compute, memory) + s * min(compute, memory) + c * n + c0
                     c: TP all-reduce bytes per token, c0: all-reduce launches per step,
                     s: the share of the smaller term that mixed batches do not overlap (0: roofline)
A stage of L_i layers takes G_i = L_i * layer(...) (+ the lm_head and g on the last stage) of GPU
time per step, g the GPU work of a step outside the per-layer kernels (the sampler over the
vocabulary, input copies, launch gaps: measured kernel tables leave it out; fitted with the host
costs). The engine's host work per step, H = o + q m (o: scheduler and sampling once per engine step;
q: host CPU work per sequence in the step, m sequences: building its input, sampling, detokenizing
and streaming its token), overlaps the GPU: vLLM V1's async scheduling (on by default since 0.12,
pipeline parallelism included) prepares step N+1 and processes step N's outputs while step N runs,
so a stage's step takes
    t_i = max(G_i, H)                    (step_seconds: the longer of the two, never their sum)
and the chain adds hops between stages (latency + bytes / bandwidth).

Two sources fill the coefficients (perf/analytic.layer_cost, `LayerCost.source`): `kernels`, a fit
of this form to NVIDIA's measured vLLM kernel tables per (model, GPU, TP) (perf/kernels.py), and
`roofline`, datasheet numbers at bounded efficiencies for the GPUs without tables. Seed 004's
fitted latency model (eq. 3-4: linear in batch size and length) is the memory-bound special case
f = a = 0, which `hetcompile profile` fits by least squares when the measurements cannot separate
the two regimes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import Field

from hetcompile.frozen import Frozen




class LayerCost(Frozen):
    """Seconds per decoder layer for one engine step on one stage (the module docstring's roofline)."""

    weights_s: Annotated[float, Field(ge=0, description="w: read the layer's weights once")]
    kv_s_per_token: Annotated[float, Field(ge=0, description="k: read one context token's K+V")]
    flop_s_per_token: Annotated[float, Field(ge=0, description="f: dense compute per token in the step")]
    attn_s_per_pair: Annotated[float, Field(ge=0, description="a: attention compute per (query, context) token pair")]
    comm_s_per_token: Annotated[float, Field(ge=0, description="c: TP all-reduce transfer per token")] = 0.0
    comm_s: Annotated[float, Field(ge=0, description="c0: TP all-reduce launches per step")] = 0.0
    serial_fraction: Annotated[float, Field(ge=0, le=1, description="s: part of the smaller of compute and memory that does not overlap the larger")] = 0.0
    source: Annotated[Literal["roofline", "kernels"], Field(description="what filled the coefficients: measured kernel tables (perf/kernels.py) or the datasheet roofline")] = "roofline"

    def terms(self) -> tuple[float, ...]:
        """(f, a, w, k, s, c, c0): the coefficients `layer_seconds` reads."""
        return (self.flop_s_per_token, self.attn_s_per_pair, self.weights_s, self.kv_s_per_token,
                self.serial_fraction, self.comm_s_per_token, self.comm_s)

    def time(self, tokens: float, kv_tokens: float, pairs: float) -> float:
        return layer_seconds(self.terms(), tokens, kv_tokens, pairs)


def step_seconds(gpu_s: float, host_s: float, overlap: bool = True, depth: int = 1) -> float:
    """t_i = max(G_i, H): a stage's engine step, its GPU time overlapped with the step's host work
    (module docstring). The one place GPU and host time combine: placement's fast mode, the
    capacity formula and the simulator all step through here. `overlap=False` is an engine without
    async scheduling (vLLM's V0, and V1 before it was on by default): the host work runs before the
    GPU's, t_i = G_i + H / d (split over the d stages of a pipeline). Plans always overlap."""
    if not overlap:
        return gpu_s + host_s / depth
    return gpu_s if gpu_s >= host_s else host_s


def layer_seconds(terms: tuple[float, ...], tokens: float, kv_tokens: float, pairs: float) -> float:
    """layer(n, S, A) of the module docstring, from LayerCost.terms() (a plain tuple, so the
    simulator's per-step loop reads no model attributes)."""
    f, a, w, k, s, c, c0 = terms
    compute = f * tokens + a * pairs
    memory = w + k * kv_tokens
    return max(compute, memory) + s * min(compute, memory) + c * tokens + c0


class StageModel(Frozen):
    """One pipeline stage: `layers` decoder layers on `tp` GPUs of type `gpu`."""

    gpu: str
    tp: int
    layers: Annotated[int, Field(ge=1)]
    kv_tokens: Annotated[float, Field(description="KV cache tokens this stage holds (vLLM takes the minimum over stages)")]
    cost: LayerCost
    head_s: Annotated[float, Field(ge=0, description="reading the lm_head once per step (last stage)")] = 0.0

    def time(self, tokens: float, kv_tokens: float, pairs: float) -> float:
        return self.layers * self.cost.time(tokens, kv_tokens, pairs) + self.head_s


class Hop(Frozen):
    """A link a batch crosses between consecutive stages."""

    latency_s: float
    bandwidth: Annotated[float, Field(gt=0, description="bytes/s")]


def hops_seconds(hops: tuple[Hop, ...] | list[Hop], tokens: float, bytes_per_token: float) -> float:
    """H(n) = sum over hops of (latency + n x bytes per token / bandwidth): a batch of n tokens
    crossing every link of a chain once (the one hop formula: the capacity formula, placement's
    split search and its Helix-flow comparison all add hops through here)."""
    return sum(h.latency_s + tokens * bytes_per_token / h.bandwidth for h in hops)


class ReplicaModel(Frozen):
    """A replica (a chain of stages) as the step-time model sees it."""

    stages: tuple[StageModel, ...]
    hops: Annotated[tuple[Hop, ...], Field(description="len(stages) - 1 links, in chain order")] = ()
    activation_bytes: Annotated[float, Field(description="bytes per token crossing a stage-to-stage hop")] = 0.0
    step_overhead_s: Annotated[float, Field(ge=0, description="o: scheduler + sampling per engine step")] = 0.0
    step_gpu_s: Annotated[float, Field(ge=0, description="g: GPU work per engine step outside the per-layer kernels (the sampler over the vocabulary, input copies, launch gaps), on the last stage's GPU time")] = 0.0
    seq_overhead_s: Annotated[float, Field(ge=0, description="q: host CPU work per sequence in an engine step")] = 0.0
    request_overhead_s: Annotated[float, Field(ge=0, description="per request, once before its first token: HTTP, tokenization, scheduling")] = 0.0
    max_num_seqs: Annotated[int, Field(description="vLLM --max-num-seqs")]
    chunk_tokens: Annotated[int, Field(description="prompt tokens per engine step (chunked-prefill budget)")]
    host_overlap: Annotated[bool, Field(description="host work overlaps the GPU (vLLM's async scheduling, the default of the vLLM plans deploy); false only to replay older engines' measurements")] = True
    source: Literal["analytic", "fitted"] = "analytic"

    @property
    def depth(self) -> int:
        return len(self.stages)

    @property
    def schedules_ahead(self) -> bool:
        """vLLM V1's async scheduling on a one-stage replica: batch N+1 is formed when batch N
        launches, so a request that arrives while a step runs joins the batch after the next one
        (simulate/engine.py admits by it, perf/capacity.py's TTFT waits for it)."""
        return self.host_overlap and len(self.stages) == 1

    @property
    def kv_capacity_tokens(self) -> float:
        return min(s.kv_tokens for s in self.stages)

    def stage_terms(self) -> tuple[tuple[tuple[float, ...], ...], tuple[tuple[int, int, float], ...], tuple[int, ...] | None]:
        """What stage_times reads, for a caller that evaluates the same model many times (the
        simulator) to build once: the distinct LayerCost.terms() of the stages, the distinct
        (L_i, index of its terms, head_s) of the stages, and per stage the index of its triple (None
        when no two stages share one). Stages of one GPU type and TP share their layer cost, and
        most stages of a long chain their layer count too, so a 19-stage Helix chain evaluates
        layer(n, S, A) 3 times and t_i 5 times per step, not 19."""
        kinds: dict[tuple[float, ...], int] = {}
        last = len(self.stages) - 1
        stages = [(s.layers, kinds.setdefault(s.cost.terms(), len(kinds)), s.head_s + (self.step_gpu_s if i == last else 0.0))
                  for i, s in enumerate(self.stages)]
        distinct: dict[tuple[int, int, float], int] = {}
        index = tuple(distinct.setdefault(st, len(distinct)) for st in stages)
        return tuple(kinds), tuple(distinct), (None if len(distinct) == len(stages) else index)

    def stage_times(self, tokens: float, kv_tokens: float, pairs: float, seqs: float = 0.0,
                    terms: tuple | None = None) -> list[float]:
        """t_i = max(L_i layer(n, S, A) + head_i, o + q seqs) for one batch of `seqs` sequences, the
        last stage's head_i including g (step_seconds: the host work overlaps each stage's GPU time;
        a chain whose stages are all faster than the host waits for the host at every stage).
        `terms`: this model's stage_terms(), when the caller kept them."""
        host = self.host_seconds(seqs)
        kinds, distinct, index = terms or self.stage_terms()
        overlap, d = self.host_overlap, len(self.stages)
        if len(kinds) == 1:  # one GPU type and TP: most chains
            x = layer_seconds(kinds[0], tokens, kv_tokens, pairs)
            t = [step_seconds(L * x + h, host, overlap, d) for L, _, h in distinct]
        else:
            layer = [layer_seconds(k, tokens, kv_tokens, pairs) for k in kinds]
            t = [step_seconds(L * layer[i] + h, host, overlap, d) for L, i, h in distinct]
        return t if index is None else [t[j] for j in index]

    def decode_times(self, terms: tuple | None = None) -> Callable[[float, float], list[float]]:
        """f(n, S) = stage_times(n, S, S, n, terms): the stage times of a decode-only batch of n
        sequences reading S context tokens (each decode token attends to its context once, so A = S),
        bit for bit, with the same float operations in the same order, minus the calls. For the
        simulator's decode runs, which evaluate it once per micro-batch step: most of a pipeline
        plan's verification. tests/test_stepmodel_decode_times.py holds it to stage_times."""
        kinds, distinct, index = terms or self.stage_terms()
        o, q, overlap, d = self.step_overhead_s, self.seq_overhead_s, self.host_overlap, len(self.stages)
        coeffs = list(kinds)

        def times(n: float, S: float) -> list[float]:
            host = o + q * n
            xs = []
            for f, a, w, k, s, c, c0 in coeffs:  # layer_seconds(terms, n, S, S)
                compute = f * n + a * S
                memory = w + k * S
                xs.append(max(compute, memory) + s * min(compute, memory) + c * n + c0)
            gpu = [L * xs[i] + h for L, i, h in distinct]
            out = [g if g >= host else host for g in gpu] if overlap else [g + host / d for g in gpu]  # step_seconds
            return out if index is None else [out[j] for j in index]
        return times

    def host_seconds(self, seqs: float) -> float:
        """H = o + q m: the engine's host work for one step of m sequences."""
        return self.step_overhead_s + self.seq_overhead_s * seqs

    @property
    def step_source(self) -> str:
        """Where the stages' GPU times come from: fitted (a measured profile of this deployment),
        kernels, roofline, or kernels+roofline for a chain that mixes GPUs with and without tables."""
        if self.source == "fitted":
            return "fitted"
        return "+".join(sorted({s.cost.source for s in self.stages}))

    def hop_time(self, tokens: float) -> float:
        """Seconds for a batch of `tokens` to cross every hop of the chain once."""
        return hops_seconds(self.hops, tokens, self.activation_bytes)


def scaled(rm: ReplicaModel, k: float) -> ReplicaModel:
    """The same replica with every per-step time k times as long: each stage's layer costs (f, a, w,
    k, c, c0; s is a share and stays) and lm_head read, g, and the host terms o and q. The
    per-request overhead and the hops are not step times and stay. What a measured correction of
    step times applies (observe/, `build --observed`), and what a simulated fleet of a known true
    speed runs (testing/fleet.py)."""
    def cost(c: LayerCost) -> LayerCost:
        return c.model_copy(update={"weights_s": c.weights_s * k, "kv_s_per_token": c.kv_s_per_token * k,
                                    "flop_s_per_token": c.flop_s_per_token * k, "attn_s_per_pair": c.attn_s_per_pair * k,
                                    "comm_s_per_token": c.comm_s_per_token * k, "comm_s": c.comm_s * k})
    stages = tuple(s.model_copy(update={"cost": cost(s.cost), "head_s": s.head_s * k}) for s in rm.stages)
    return rm.model_copy(update={"stages": stages, "step_overhead_s": rm.step_overhead_s * k, "step_gpu_s": rm.step_gpu_s * k,
                                 "seq_overhead_s": rm.seq_overhead_s * k})
