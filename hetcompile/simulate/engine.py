"""A discrete-event model of one vLLM replica: continuous batching over the step-time model.

What a replica does, as vLLM's V1 scheduler does it (and as perf/capacity.py assumes on average):

- admission: FIFO from the waiting queue while fewer than `max_num_seqs` sequences run and the
  KV cache (`kv_capacity_tokens`, the minimum over stages) has room for the sequence's current
  length; a sequence then grows by one KV token per output token;
- an engine step = one micro-batch: decode sequences first (one token each), then prompt chunks
  in admission order until the chunked-prefill budget (`chunk_tokens` tokens per step) is spent;
  the step that finishes a prompt samples its first output token (that instant is its TTFT);
- KV full while a decode sequence grows: the most recently admitted sequence that is not in
  flight is preempted (recompute: its KV is freed, it goes back to the head of the queue and its
  prompt plus the tokens it generated are prefilled again), as vLLM's default preemption does;
- `prefill_first` (vLLM's V0 engine without chunked prefill, before 0.8): a step with prompts
  waiting carries only whole prompts (up to `chunk_tokens`, V0's max_num_batched_tokens) and no
  decode; decode steps run when no prompt waits. bench/fidelity.py replays V0 measurements this way;
  plans deploy V1 (the default, mixed steps);
- async scheduling (`host_overlap`, vLLM V1's default since 0.12), one-stage replicas: the engine
  core schedules batch N+1 as soon as batch N launches (its batch queue holds two), so a request
  the scheduler sees while step N runs joins batch N+2, launched when N+1 ends: on a busy replica
  its TTFT carries one whole step more than under synchronous scheduling (an idle replica
  schedules it at once). Pipelines form a batch whenever fewer than d are in flight (below);
- the frontend: a request reaches the scheduler `request_overhead_s` after it arrives (the OpenAI
  server's HTTP handling and tokenization, which the engine step model does not see), so its TTFT
  counts that time as perf/capacity.py's TTFT does;
- pipeline parallelism: up to d = len(stages) micro-batches in flight; a batch occupies stage i
  for t_i (stepmodel.ReplicaModel.stage_times) and crosses hop i before stage i+1; stages serve
  batches in order; a sequence is in at most one batch at a time. As vLLM V1's engine core does
  (`step_with_batch_queue`: schedule whenever the batch queue of pp_size batches has room), the
  next batch is formed as soon as fewer than d are in flight (when one completes), not when stage
  0 frees: it waits for stage 0 in the pipeline. A sequence is eligible again only after its batch
  completes, so each completion re-forms its own cohort (vLLM's "cadence groups"); forming only
  when stage 0 is free let two completions behind a long prompt step merge into one batch, and
  cohorts collapsed until fewer than d batches carried the decode (0.73-0.77x the formula on PP3/PP4
  chains bound by max-num-seqs). --max-num-seqs bounds the running sequences of the whole engine;
  a micro-batch takes at most ceil(running / d) decode sequences so the d cohorts stay balanced
  (b = C / d in capacity.py), and prompt chunks only count against the token budget. Upstream V1
  does not rebalance (cohort sizes are whatever admission made them: RBLN-SW/vllm-rbln#243);
  vllm-project/vllm#57433 (open) proposes this decode-only cap, with ceil(max_num_seqs / pp_size),
  after a cap that counts prompts too (#50410) cost 8%; here such a cap displaced a decode into the
  next cycle whenever a prompt joined a batch.

Prefix caching (on by default in V1): a request's `cached` prompt tokens, a prefix that vLLM's
prefix cache already holds (a shared system prompt), are never prefilled, also not when the
sequence is preempted and recomputed; they are still read by attention, and their KV is counted per
sequence (vLLM shares those blocks, so this over-counts KV use: a conservative bound).

Decode runs (exact, only faster): most steps of a one-stage replica under load repeat the last one
with every context one token longer, until a sequence finishes or a request arrives. When the batch
just launched is such a step (decode only, every running sequence in it, no prompt to prefill, no
waiting request that could be admitted, KV room for every step), `ReplicaSim.decode_run` computes
the following steps' times in one loop, up to the step that finishes a sequence and never past the
earliest event that could submit a request (`EventLoop.guard_time`: arrivals and submits are
"guard" events, step completions are not); one event at the run's last completion applies them. A
run the loop stops inside (`stop`, `until`) is cut back to the steps completed by then
(`Driver.settle`), so every request time and every counter is what the step-by-step events give,
bit for bit (tests/test_simulate.py compares the two on random loads).

A pipeline's decode runs (the same, d batches at a time): when a launch leaves every running
sequence in flight, with no prompt chunk left to pick (a prompt still prefilling has its chunk in
flight) and no waiting request that could be admitted, each completion of a decode-only batch no
larger than a batch may take (ceil(running / d)) re-forms that batch one context token longer and
relaunches it at once. `ReplicaSim.start_pipeline_run` steps the d batches through the stages in one
loop (the last stage serves them in launch order, so they complete in that order), up to the first
completion that finishes a sequence, completes a prompt chunk (a sequence joins the decodes, or
its next chunk is picked), is of a batch above that limit, finds the KV cache without room for a
batch's limit, or comes at or after the guard; one event at the last such completion applies them,
and the batches then in flight complete as ordinary events again (each carries a ticket, so the
events the run took over are skipped). Helix chains and PP replicas spend most steps this way: at
llama70b-budget's load 87% of its PP-2 steps are in runs; on helix-highhet42's chains a prompt is
in flight most of the time, and the runs go on around it.

Everything is deterministic: no randomness here, ties broken by event sequence numbers.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from hetcompile.perf.stepmodel import ReplicaModel


# A pipeline this deep keeps its decode-ready sequences in a heap (ReplicaSim.ready); a shallower one
# scans its running list, which costs less than the heap's pushes and pops below a few dozen sequences
# (bench: three-regions' and llama70b-pp's PP-2 replicas ran 10-25% slower with the heap)
READY_HEAP_DEPTH = 4


@dataclass(slots=True)
class Request:
    id: int
    workload: str
    arrival: float
    input_tokens: int
    output_tokens: int
    replica: str = ""
    generated: int = 0
    prefilled: int = 0  # tokens of the current prefill target computed so far
    prefill_target: int = 0  # input_tokens (+ generated after a preemption)
    kv: int = 0  # KV tokens held
    in_flight: bool = False
    first_token: float | None = None
    finish: float | None = None
    preemptions: int = 0
    cached: int = 0  # prompt tokens served by vLLM's prefix cache (a shared system prompt): never prefilled
    order: int = 0  # admission number on its replica: its place in the running list
    submitted: float = 0.0  # when the scheduler saw it (arrival + request_overhead_s)
    prefilled_on: str = ""  # a disaggregated group's request: the prefill replica that ran its prompt (simulate/run.py)

    def cache_hit(self) -> int:
        """Prompt tokens the prefix cache serves: `cached`, less the one token vLLM always computes."""
        return min(self.cached, self.input_tokens - 1)


@dataclass(slots=True)
class _Batch:
    decode: list[Request]
    prefill: list[tuple[Request, int]]
    tokens: int
    # a pipeline's batch: the number of its completion event still pending (a pipeline run takes
    # over the in-flight batches and leaves their events behind; Driver._stage_done skips those)
    ticket: int = 0


@dataclass(slots=True)
class _DecodeRun:
    """Steps 2..k of a decode run whose step 1 was launched normally: step s is launched at
    ends[s - 2] and takes times[s - 2]; ends[k - 1] is the run's last completion."""

    batch: _Batch
    ends: list[float]  # e_1 .. e_k
    times: list[float]  # t_2 .. t_k


def _cross(free: list[float], t: float, times: list[float], hops: list[float]) -> float:
    """A batch ready at t goes through the stages: stage i starts it when both are free and takes
    times[i], then hop i carries it on; `free` (each stage's free time) is updated. Returns when it
    leaves the last stage."""
    last = len(times) - 1
    for i in range(last):
        end = (t if t > free[i] else free[i]) + times[i]
        free[i] = end
        t = end + hops[i]
    end = free[last] = (t if t > free[last] else free[last]) + times[last]
    return end


@dataclass(slots=True)
class _PipelineRun:
    """Completions 1..K of a pipeline's decode run (module docstring): steps[j] = (e_j, batch, t,
    end): completion j at e_j is of `batch`, which relaunches at once with every context one token
    longer, its stages taking t (stage_times) and the step completing at `end`. `start`: the
    (completion, batch) pairs in flight and the stages' free times when the run began; `free`: the
    stages' free times after the last relaunch."""

    start: list[tuple[float, _Batch]]
    start_free: list[float]
    steps: list[tuple[float, _Batch, list[float], float]]
    free: list[float]


@dataclass
class ReplicaSim:
    """One replica's queues and pipeline; `Simulation` drives it through a shared event heap."""

    id: str
    model: ReplicaModel
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    kv_used: int = 0
    in_flight: int = 0
    stage_free: list = field(default_factory=list)
    # counters for the report
    completed: int = 0
    preemptions: int = 0
    steps: int = 0
    step_tokens: int = 0
    busy_s: float = 0.0  # slowest stage's busy time of the steps launched before `measure_until`
    measure_until: float = float("inf")
    prefill_first: bool = False  # V0 scheduling (module docstring)
    depth: int = field(init=False, default=0)  # d = len(model.stages), read every step
    # the running sequences whose prompt is not fully computed, in running order: a step looks for
    # prompt chunks among these only (most steps carry none, and the scan over every running
    # sequence was half of a step's cost)
    prefilling: list = field(init=False, default_factory=list)
    run: "_DecodeRun | None" = field(init=False, default=None)  # the decode run in flight (module docstring)
    # a pipeline's batches in flight with their completion times, in completion order (the last stage
    # serves them in launch order), and its decode run in flight (module docstring)
    flight: deque = field(init=False, default_factory=deque)
    pipeline_run: "_PipelineRun | None" = field(init=False, default=None)
    admitted: int = field(init=False, default=0)
    # a deep pipeline has most running sequences in flight: instead of scanning all of them for
    # the few a step may take, it keeps the decode-ready ones not in flight in a heap by admission
    # number (entries made stale by a preemption or a second push are skipped when popped); the
    # same sequences, in the same order, as the scan takes
    ready: list | None = field(init=False, default=None)
    pushes: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.depth = self.model.depth
        # async scheduling (module docstring): a one-stage replica forms each batch when the one
        # before it launches, so a batch admits the requests submitted before that launch
        self.lagged = self.model.schedules_ahead
        self.launched_at = -math.inf  # when the step in flight (or the last one) was launched
        self.stage_free = [0.0] * self.depth
        self.kv_capacity = int(self.model.kv_capacity_tokens)
        # what step_cost reads every step, built once: the model's coefficients as plain tuples
        self.terms = self.model.stage_terms()
        self.decode_times = self.model.decode_times(self.terms)  # stage_times of a decode-only batch, inlined
        self.hops = tuple((h.latency_s, h.bandwidth) for h in self.model.hops)
        self.hop_memo: dict[int, list[float]] = {}  # hop_seconds by batch tokens: few distinct sizes recur
        self.ready = [] if self.depth >= READY_HEAP_DEPTH else None

    # -- admission and batch formation ------------------------------------------------------------

    def _admit(self, cutoff: float = math.inf) -> None:
        while self.waiting and len(self.running) < self.model.max_num_seqs:
            r = self.waiting[0]
            if r.submitted > cutoff and self.running:
                return  # it joins the batch formed at the next launch (async scheduling)
            need = r.prefill_target + 1
            if self.kv_used + need > self.kv_capacity:
                if not self.running and need > self.kv_capacity:
                    raise ValueError(
                        f"replica {self.id}: a request of {need} tokens does not fit its KV cache of {self.kv_capacity} tokens"
                    )
                return
            self.waiting.popleft()
            r.kv = need
            self.kv_used += need
            self.running.append(r)
            self.admitted += 1
            r.order = self.admitted
            self.prefilling.append(r)  # admitted with its prompt (or its recompute) still to prefill

    def _preempt_one(self, keep: int) -> bool:
        for r in reversed(self.running):
            if not r.in_flight and r.id != keep:
                self.running.remove(r)
                if r.prefilled < r.prefill_target:
                    self.prefilling.remove(r)
                self.kv_used -= r.kv
                r.kv, r.prefilled = 0, r.cache_hit()  # the shared prefix stays cached (other sequences hold it)
                r.prefill_target = r.input_tokens + r.generated
                r.preemptions += 1
                self.preemptions += 1
                self.waiting.appendleft(r)
                return True
        return False

    def _prefill_only(self) -> _Batch | None:
        """V0: whole waiting prompts, oldest first, up to the token budget (one always fits: V0 needs
        max_num_batched_tokens >= max_model_len); None when no prompt waits."""
        if not self.prefilling:
            return None
        budget = self.model.chunk_tokens
        prefill: list[tuple[Request, int]] = []
        for r in self.prefilling:
            if r.in_flight or r.prefilled >= r.prefill_target:
                continue
            n = r.prefill_target - r.prefilled
            if prefill and n > budget:
                break
            prefill.append((r, n))
            budget -= n
        if not prefill:
            return None
        for r, _ in prefill:
            r.in_flight = True
        return _Batch([], prefill, sum(n for _, n in prefill))

    def form_batch(self, cutoff: float = math.inf) -> _Batch | None:
        """The next micro-batch; `cutoff`: only requests submitted by then are admitted."""
        self._admit(cutoff)
        if self.prefill_first:
            batch = self._prefill_only()
            if batch is not None:
                return batch
        budget = self.model.chunk_tokens
        limit = self._decode_limit()
        if 0 < limit <= self.kv_capacity - self.kv_used:
            decode = self._pick_decodes(limit)  # room for every decode this batch can take
        elif limit > 0:
            decode = self._pick_decodes_making_room(limit)
        else:
            decode = []
        prefill = self._pick_chunks(budget - len(decode))
        if not decode and not prefill:
            return None
        return _Batch(decode, prefill, len(decode) + sum(n for _, n in prefill))

    def _decode_limit(self) -> int:
        """At most ceil(running / d) decode sequences in a micro-batch (module docstring), one token of
        the step's budget each."""
        return min(max(1, math.ceil(len(self.running) / self.depth)), self.model.chunk_tokens)

    def _pick_decodes(self, limit: int) -> list[Request]:
        """Up to `limit` decode-ready sequences in running order, each with its KV slot (the caller
        checked there is room for all: no preemption, so the plain pick)."""
        decode: list[Request] = []
        if self.ready is not None:
            ready = self.ready
            while ready and len(decode) < limit:
                order, _, r = heapq.heappop(ready)
                if r.in_flight or r.kv == 0 or r.prefilled < r.prefill_target or order != r.order:
                    continue  # stale
                r.kv += 1
                r.in_flight = True
                decode.append(r)
        else:
            for r in self.running:
                if r.in_flight or r.kv == 0 or r.prefilled < r.prefill_target:
                    continue
                r.kv += 1
                r.in_flight = True
                decode.append(r)
                if len(decode) >= limit:
                    break
        self.kv_used += len(decode)
        return decode

    def _pick_decodes_making_room(self, limit: int) -> list[Request]:
        """Up to `limit` decode-ready sequences when the KV cache may not hold a token for each: the
        token a step writes needs a KV slot, made by preempting the newest sequence (one already in
        this batch is in flight, so never the one preempted)."""
        decode: list[Request] = []
        for r in list(self.running):
            if r.in_flight or r.kv == 0 or r.prefilled < r.prefill_target:
                continue
            while self.kv_used + 1 > self.kv_capacity:
                if not self._preempt_one(r.id):
                    break
            if self.kv_used + 1 > self.kv_capacity:
                continue
            if r.kv == 0:  # preempted while making room
                continue
            r.kv += 1
            self.kv_used += 1
            r.in_flight = True
            decode.append(r)
            if len(decode) >= limit:
                break
        return decode

    def _pick_chunks(self, budget: int) -> list[tuple[Request, int]]:
        """Prompt chunks in admission order until the step's token budget is spent."""
        prefill: list[tuple[Request, int]] = []
        for r in self.prefilling:
            if budget <= 0:
                break
            if r.in_flight or r.prefilled >= r.prefill_target:
                continue
            n = min(budget, r.prefill_target - r.prefilled)
            r.in_flight = True
            prefill.append((r, n))
            budget -= n
        return prefill

    # -- decode runs (module docstring) -----------------------------------------------------------

    def _could_admit(self) -> bool:
        """Whether the next step's admission would take the head of the queue (KV use only grows
        during a decode run, so a request that does not fit now does not fit before a sequence ends)."""
        if not self.waiting or len(self.running) >= self.model.max_num_seqs:
            return False
        return self.kv_used + self.waiting[0].prefill_target + 1 <= self.kv_capacity

    def decode_run(self, batch: _Batch, end: float, guard: float) -> _DecodeRun | None:
        """The steps after `batch` (just launched, completing at `end`) that repeat it one context
        token longer, while no sequence finishes before the last of them, every step has KV room
        for its tokens, and every completion but the last is before `guard`; None when that is
        not at least one more step."""
        n = len(batch.decode)
        if (self.depth != 1 or batch.prefill or self.prefilling or n != len(self.running) or n > self.model.chunk_tokens
                or end >= guard or self._could_admit()):
            return None
        # completions until the first sequence finishes (step 1's included), and launches with KV room
        last = min(min(r.output_tokens - r.generated for r in batch.decode), 1 + (self.kv_capacity - self.kv_used) // n)
        if last < 2:
            return None
        S = sum([r.input_tokens + r.generated for r in batch.decode])  # step 1's context tokens
        fn = float(n)
        decode_times = self.decode_times
        ends, times = [end], []
        t = end
        for _ in range(last - 1):
            if t >= guard:  # a request may be submitted before this completion: the run ends at it
                break
            S += n
            ts = decode_times(fn, float(S))[0]  # A = S for decode tokens (step_cost)
            t = t + ts
            times.append(ts)
            ends.append(t)
        return _DecodeRun(batch, ends, times) if times else None

    def apply_run(self, run: _DecodeRun, completed: int) -> None:
        """The effects of the run's first `completed` completions (each but the last of the run) and
        of the launches that followed them: tokens generated and KV held, steps and busy time."""
        n = len(run.batch.decode)
        for r in run.batch.decode:
            r.generated += completed
            r.kv += completed
        self.kv_used += n * completed
        self.steps += completed
        self.step_tokens += n * completed
        for i in range(completed):
            if run.ends[i] < self.measure_until:
                self.busy_s += run.times[i]

    def start_pipeline_run(self, guard: float) -> _PipelineRun | None:
        """The completions of the batches in flight that each re-form their own batch one context
        token longer (module docstring: every running sequence in flight, no prompt chunk to pick, no
        waiting request that could be admitted), while each is of a decode-only batch no larger than
        a batch may take, no sequence finishes, the KV cache has room for a batch's limit and every
        completion is before `guard`; None when that is not at least one."""
        flight = self.flight
        if self.depth == 1 or self.prefill_first or flight[0][0] >= guard or self._could_admit():
            return None
        # every running sequence in flight: the decodes in their batches, each prompt still
        # prefilling with its chunk (a prompt not in flight would give the next batch a chunk)
        if (sum([len(b.decode) for _, b in flight]) + len(self.prefilling) != len(self.running)
                or not all([r.in_flight for r in self.prefilling])):
            return None
        limit = self._decode_limit()
        # per batch in flight: (completion, batch, completions left before one finishes a sequence,
        # context tokens, its hop seconds), the last three counted when the batch first completes in
        # the run (-1 until then)
        queue: deque[tuple[float, _Batch, int, int, list[float]]] = deque((e, b, -1, 0, []) for e, b in flight)
        room = self.kv_capacity - self.kv_used
        decode_times = self.decode_times
        free = list(self.stage_free)
        steps: list[tuple[float, _Batch, list[float], float]] = []
        while True:
            e, b, left, S, hop = queue[0]
            # a completion with a prompt chunk changes the next batch (a new decode, or the prompt's
            # next chunk); one of more decodes than a batch may take re-forms a smaller one
            if e >= guard or b.prefill or len(b.decode) > limit:
                break
            if left < 0:
                left = min([r.output_tokens - r.generated for r in b.decode])
                S = sum([r.input_tokens + r.generated for r in b.decode])
                hop = self.hop_seconds(b.tokens)
            # a completion that finishes a sequence, or a pick that may preempt (form_batch's second
            # branch), is an ordinary event
            if left <= 1 or room < limit:
                break
            queue.popleft()
            n = len(b.decode)
            S += n  # complete(): every sequence one token longer; relaunched at e as _kick and launch() do
            room -= n
            fn = float(n)
            times = decode_times(fn, float(S))  # step_cost of a decode-only batch
            t = _cross(free, e, times, hop)  # launch()
            steps.append((e, b, times, t))
            queue.append((t, b, left - 1, S, hop))
        return _PipelineRun(list(flight), list(self.stage_free), steps, free) if steps else None

    def apply_pipeline_run(self, run: _PipelineRun, completed: int) -> None:
        """The effects of the run's first `completed` completions and their relaunches, in order (the
        busy time's float sum as the step-by-step launches add it); `flight` then holds the batches
        in flight after them."""
        count: dict[int, int] = {}
        flight = deque(run.start)
        for e, b, times, end in run.steps[:completed]:
            count[id(b)] = count.get(id(b), 0) + 1
            if e < self.measure_until:
                self.busy_s += max(times)
            flight.popleft()
            flight.append((end, b))
        for _, b in flight:
            c = count.get(id(b), 0)
            if c:
                for r in b.decode:
                    r.generated += c
                    r.kv += c
                self.kv_used += c * len(b.decode)
                self.step_tokens += c * len(b.decode)
        self.steps += completed
        if completed == len(run.steps):
            self.stage_free = run.free
        elif completed:  # cut back: the stages' free times after relaunch `completed`, as launch() sets them
            free = list(run.start_free)
            for e, b, times, _ in run.steps[:completed]:
                _cross(free, e, times, self.hop_seconds(b.tokens))
            self.stage_free = free
        if completed:
            self.launched_at = run.steps[completed - 1][0]
        self.flight = flight

    # -- timing -----------------------------------------------------------------------------------

    def step_cost(self, batch: _Batch) -> tuple[list[float], list[float]]:
        """(t_i per stage, hop seconds after stage i) for this batch: perf/stepmodel.py's roofline with
        n tokens, S context tokens read (decode contexts and the prompt so far of each chunk) and A
        attention pairs (each decode token over its context, each chunk causally over its prompt)."""
        # integer sums, exact as the floats they become (every count is far below 2^53); a decode
        # token reads its context once and attends to it once, so its S and A terms are equal
        S = sum([r.input_tokens + r.generated for r in batch.decode])
        A2 = 2 * S  # 2 A: a chunk's causal pairs n^2 / 2 are half-integers
        for r, n in batch.prefill:
            S += r.prefilled
            A2 += 2 * n * r.prefilled + n * n
        times = self.model.stage_times(float(batch.tokens), float(S), A2 / 2.0, float(len(batch.decode) + len(batch.prefill)),
                                       self.terms)
        return times, self.hop_seconds(batch.tokens)

    def hop_seconds(self, tokens: int) -> list[float]:
        """Seconds a batch of `tokens` takes on each hop after a stage (latency + bytes / bandwidth);
        the list is shared: callers read it only."""
        hops = self.hop_memo.get(tokens)
        if hops is None:
            moved = tokens * self.model.activation_bytes
            hops = self.hop_memo[tokens] = [lat + moved / bw for lat, bw in self.hops]
        return hops

    def launch(self, now: float, batch: _Batch) -> tuple[float, float]:
        """Put `batch` into the pipeline at `now`; returns (stage 0 frees, batch leaves the last stage)."""
        times, hops = self.step_cost(batch)
        free = self.stage_free
        _cross(free, now, times, hops)
        self.in_flight += 1
        self.launched_at = now
        self.steps += 1
        self.step_tokens += batch.tokens
        if now < self.measure_until:
            self.busy_s += max(times)
        return free[0], free[-1]

    def complete(self, now: float, batch: _Batch) -> list[Request]:
        """Apply a finished step; returns the requests that finished with it."""
        self.in_flight -= 1
        done: list[Request] = []
        for r in batch.decode:
            r.in_flight = False
            r.generated += 1
            if r.generated >= r.output_tokens:
                done.append(r)
        for r, n in batch.prefill:
            r.in_flight = False
            r.prefilled += n
            if r.prefilled >= r.prefill_target:
                self.prefilling.remove(r)
                r.generated += 1  # the step that completes a prompt samples the next token
                if r.first_token is None:
                    r.first_token = now
                if r.generated >= r.output_tokens:
                    done.append(r)
        for r in done:
            r.finish = now
            self.running.remove(r)
            self.kv_used -= r.kv
            r.kv = 0
            self.completed += 1
        if self.ready is not None:  # decode-ready again (or for the first time), unless finished
            for r in batch.decode:
                if r.kv:
                    self.pushes += 1
                    heapq.heappush(self.ready, (r.order, self.pushes, r))
            for r, _ in batch.prefill:
                if r.kv and r.prefilled >= r.prefill_target:
                    self.pushes += 1
                    heapq.heappush(self.ready, (r.order, self.pushes, r))
        return done


class EventLoop:
    """A heap of (time, sequence, callback); the sequence number makes equal times deterministic.
    Events scheduled with guard=True (the default: arrivals, submits, anything a caller schedules)
    may submit requests; `guard_time` is the earliest of them still pending. `on_exit(t, inclusive)`
    is told where `run` stopped: events before t (at t too, when inclusive) were processed."""

    def __init__(self) -> None:
        self.heap: list = []
        self.guards: list[float] = []
        self.seq = 0
        self.now = 0.0
        self.on_exit: Callable[[float, bool], None] | None = None

    def at(self, t: float, fn, *args, guard: bool = True) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, fn, args, guard))
        if guard:
            heapq.heappush(self.guards, t)

    def guard_time(self) -> float:
        return self.guards[0] if self.guards else math.inf

    def run(self, until: float, stop=None) -> None:
        while self.heap and self.heap[0][0] <= until:
            t, _, fn, args, guard = heapq.heappop(self.heap)
            if guard:
                heapq.heappop(self.guards)  # guard events leave in time order too: this one is the earliest
            self.now = t
            fn(*args)
            if stop is not None and stop():
                if self.on_exit is not None:
                    self.on_exit(t, False)
                return
        self.now = max(self.now, until) if not self.heap else self.now
        if self.on_exit is not None:
            self.on_exit(until, True)


class Driver:
    """Runs replicas on an event loop: `submit` a request to a replica; a step is formed whenever
    fewer than d batches are in flight (it queues for stage 0 in the pipeline, module docstring)."""

    def __init__(self, replicas: list[ReplicaSim], on_done=None, decode_runs: bool = True) -> None:
        self.loop = EventLoop()
        self.replicas = {r.id: r for r in replicas}
        self.on_done = on_done
        self.decode_runs = decode_runs  # False: every step an event (the reference the runs are tested against)
        self.loop.on_exit = self.settle

    def arrive(self, replica: str, req: Request) -> None:
        """A request reaches `replica`'s frontend now; the scheduler sees it `request_overhead_s` later."""
        self.loop.at(self.loop.now + self.replicas[replica].model.request_overhead_s, self.submit, replica, req)

    def submit(self, replica: str, req: Request) -> None:
        rep = self.replicas[replica]
        req.replica = replica
        req.prefill_target = req.input_tokens
        req.prefilled = req.cache_hit()
        req.submitted = self.loop.now
        rep.waiting.append(req)
        self._kick(rep)

    def _kick(self, rep: ReplicaSim) -> None:
        if rep.in_flight >= rep.depth:
            return
        # async scheduling: the batch launched now was formed when the previous step launched
        batch = rep.form_batch(rep.launched_at if rep.lagged else math.inf)
        if batch is None:
            return
        _, end = rep.launch(self.loop.now, batch)
        if rep.depth > 1:
            rep.flight.append((end, batch))
            prun = rep.start_pipeline_run(self.loop.guard_time()) if self.decode_runs else None
            if prun is None or len(prun.steps) < len(prun.start):  # no run reaches the batch just launched
                self.loop.at(end, self._stage_done, rep, batch, batch.ticket, guard=False)
            if prun is None:
                return
            for _, b in prun.start[:len(prun.steps)]:
                b.ticket += 1  # the run completes them: their pending events are void (the rest stand)
            rep.pipeline_run = prun
            self.loop.at(prun.steps[-1][0], self._pipeline_run_done, rep, prun, guard=False)
            return
        run = rep.decode_run(batch, end, self.loop.guard_time()) if self.decode_runs else None
        if run is None:
            self.loop.at(end, self._done, rep, batch, guard=False)
            return
        rep.stage_free[0] = run.ends[-1]
        rep.run = run
        self.loop.at(run.ends[-1], self._run_done, rep, run, guard=False)

    def at_from_step(self, t: float, fn, *args) -> None:
        """Schedule at t an event that may submit a request, from inside a step's completion (a
        disaggregated group's prefill hands its request on to a decode replica, simulate/disagg.py).
        A decode run in flight was computed before this guard existed and may reach past it, so
        every run is first cut back to the steps completed by now (`settle`): the replica then plans
        its next run with this guard in view, and the results stay those of step-by-step events."""
        self.settle(self.loop.now, False)
        self.loop.at(t, fn, *args)

    def _run_done(self, rep: ReplicaSim, run: _DecodeRun) -> None:
        if rep.run is not run:  # cut back by settle: its next step is an ordinary event now
            return
        rep.apply_run(run, len(run.times))
        rep.run = None
        rep.launched_at = run.ends[-2]  # the run's last step was launched at the completion before it
        self._done(rep, run.batch)

    def _stage_done(self, rep: ReplicaSim, batch: _Batch, ticket: int) -> None:
        """A pipeline's batch completes, unless a pipeline run took it over since this was scheduled."""
        if ticket != batch.ticket:
            return
        rep.flight.popleft()  # this batch: the last stage serves in launch order (equal times: in event order)
        self._done(rep, batch)

    def _pipeline_run_done(self, rep: ReplicaSim, run: _PipelineRun) -> None:
        if rep.pipeline_run is not run:  # cut back by settle
            return
        self._end_pipeline_run(rep, run, len(run.steps))

    def _end_pipeline_run(self, rep: ReplicaSim, run: _PipelineRun, completed: int) -> None:
        """Apply the run's first `completed` completions; the batches then in flight complete as
        ordinary events again. Those the run never reached (flight[i] = start[completed + i], past
        the run's steps) kept their events; the others, relaunched or cut back, get new ones."""
        rep.apply_pipeline_run(run, completed)
        rep.pipeline_run = None
        keep = range(len(run.steps) - completed, len(run.start) - completed)
        for i, (e, b) in enumerate(rep.flight):
            if i not in keep:
                b.ticket += 1
                self.loop.at(e, self._stage_done, rep, b, b.ticket, guard=False)

    def settle(self, t: float, inclusive: bool) -> None:
        """The loop stopped at t: cut every decode run in flight back to the completions before t
        (at t when inclusive); its next step stays in flight as an ordinary event."""
        for rep in self.replicas.values():
            prun = rep.pipeline_run
            if prun is not None:
                self._end_pipeline_run(rep, prun, sum(1 for e, *_ in prun.steps if e < t or (inclusive and e == t)))
            run = rep.run
            if run is None:
                continue
            done = sum(1 for e in run.ends[:-1] if e < t or (inclusive and e == t))
            rep.apply_run(run, done)
            rep.run = None
            if done:
                rep.launched_at = run.ends[done - 1]
            rep.stage_free[0] = run.ends[done]
            self.loop.at(run.ends[done], self._done, rep, run.batch, guard=False)

    def _done(self, rep: ReplicaSim, batch: _Batch) -> None:
        finished = rep.complete(self.loop.now, batch)
        if self.on_done is not None:
            for r in finished:
                self.on_done(r)
        self._kick(rep)
