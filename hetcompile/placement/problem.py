"""The input of model placement: a self-contained, frozen description of one placement problem.

Everything is plain numbers and tables in SI units so that the problem can be built from the
analytic perf model, from measured profiles or from the Helix artifact (`helix_import`) alike:

    bandwidth   bytes/s            latency    s
    T(k)        tokens/s (Helix semantics: prompt + decode tokens through a node holding k layers)
    KV          token-layer entries (a node holding k layers keeps KV(k)/k tokens of context)
    times       seconds per layer, piecewise linear in the batch (decode: sequences; prefill: tokens)

A node group is a set of `count` identical nodes (same GPU type, GPUs, region, profiles). A node
of G GPUs may offer several stage profiles, one per tensor-parallel size t dividing G: the native
one (t = G) and, in `chains` mode, splits into G/t stages of TP t (so that a mixed chain has one
TP size). Links are per region pair (a == b: inside a region); `node_links` override single node
pairs, with the pseudo nodes `source` / `sink` for the coordinator's links (the Helix artifact
draws every pair independently).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from hetcompile.perf.stepmodel import LayerCost

SOURCE = "source"
SINK = "sink"


@dataclass(frozen=True)
class ModelSpec:
    """The served model and the workload mix that sizes KV and batches."""

    name: str
    num_layers: int
    token_bytes: float  # bytes per token crossing a coordinator link
    activation_bytes: float  # bytes per token crossing a stage-to-stage link
    input_tokens: float  # mean prompt length
    output_tokens: float  # mean generated length
    kv_bytes_per_token_layer: float = 0.0  # informative: K+V bytes of one token in one layer
    max_concurrency: int | None = None  # vLLM --max-num-seqs per engine; None: KV-limited only
    prefill_chunk_tokens: int = 2048  # prefill cost per token is taken at this chunk size
    step_overhead_s: float = 0.0  # per engine step (scheduler + sampling), overlapping the GPU
    seq_overhead_s: float = 0.0  # per sequence per engine step (host CPU), overlapping the GPU
    request_overhead_s: float = 0.0  # per request before its first token (HTTP, tokenization): TTFT only
    step_gpu_s: float = 0.0  # g: GPU work per engine step outside the per-layer kernels, on the last stage

    def step_host_s(self, batch: float) -> float:
        """Host work of one engine step of `batch` sequences: H = o + q b, which overlaps each stage's
        GPU time (perf/stepmodel.step_seconds)."""
        return self.step_overhead_s + self.seq_overhead_s * batch

    def __post_init__(self) -> None:
        if self.num_layers < 1:
            raise ValueError(f"model {self.name}: num_layers must be >= 1")
        if self.input_tokens < 0 or self.output_tokens <= 0:
            raise ValueError(f"model {self.name}: need input_tokens >= 0 and output_tokens > 0")

    @property
    def context_tokens(self) -> float:
        """s = I + O/2: a sequence's mean context over its life (perf/capacity.py)."""
        return self.input_tokens + self.output_tokens / 2.0


@dataclass(frozen=True)
class StageProfile:
    """What one stage of TP `tp` can do; tables are indexed by k - 1 for k = 1..max_layers."""

    tp: int
    max_layers: int
    throughput: tuple[float, ...]  # T(k), tokens/s
    kv_token_layers: tuple[float, ...]  # KV capacity in token-layer entries when holding k layers
    decode_time: tuple[tuple[float, float], ...]  # (batch sequences, s per layer), increasing batch; () with `cost`
    prefill_time: tuple[tuple[float, float], ...]  # (batch tokens, s per layer), increasing tokens; () with `cost`
    source: str = "measured"
    cost: LayerCost | None = None  # the per-layer roofline (analytic); None: fitted to the tables when used
    head_s: float = 0.0  # reading the lm_head once per step, when this stage is a chain's last

    def __post_init__(self) -> None:
        if self.max_layers < 1 or len(self.throughput) != self.max_layers:
            raise ValueError(f"profile tp={self.tp}: throughput needs max_layers={self.max_layers} entries")
        if len(self.kv_token_layers) != self.max_layers:
            raise ValueError(f"profile tp={self.tp}: kv_token_layers needs {self.max_layers} entries")
        if self.cost is None and (len(self.decode_time) < 2 or len(self.prefill_time) < 2):
            raise ValueError(f"profile tp={self.tp}: without a layer cost, time tables need at least two points")

    def T(self, k: int) -> float:
        return self.throughput[k - 1] if 1 <= k <= self.max_layers else 0.0


@dataclass(frozen=True)
class NodeGroup:
    """`count` interchangeable nodes; node ids are `node_ids` or `<id_prefix><j>`."""

    id_prefix: str
    gpu: str
    region: str
    count: int
    gpus_per_node: int
    profiles: tuple[StageProfile, ...]
    node_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError(f"group {self.id_prefix}: negative count")
        if self.node_ids and len(self.node_ids) != self.count:
            raise ValueError(f"group {self.id_prefix}: {len(self.node_ids)} node_ids for count {self.count}")
        tps = [p.tp for p in self.profiles]
        if len(set(tps)) != len(tps):
            raise ValueError(f"group {self.id_prefix}: two profiles with the same tp")
        for t in tps:
            if t < 1 or self.gpus_per_node % t:
                raise ValueError(f"group {self.id_prefix}: tp {t} does not divide {self.gpus_per_node} GPUs")
        if self.gpus_per_node not in tps:
            raise ValueError(f"group {self.id_prefix}: no native profile (tp={self.gpus_per_node})")

    @property
    def ids(self) -> tuple[str, ...]:
        return self.node_ids or tuple(f"{self.id_prefix}{j}" for j in range(self.count))

    @property
    def native(self) -> StageProfile:
        return self.profile(self.gpus_per_node)

    def profile(self, tp: int) -> StageProfile:
        for p in self.profiles:
            if p.tp == tp:
                return p
        raise KeyError(f"group {self.id_prefix} has no tp={tp} profile")


@dataclass(frozen=True)
class Link:
    """A duplex link: each direction carries `bandwidth` bytes/s on its own (Helix's rule)."""

    a: str
    b: str
    bandwidth: float
    latency: float


@dataclass(frozen=True)
class PlacementProblem:
    name: str
    model: ModelSpec
    groups: tuple[NodeGroup, ...]
    region_links: tuple[Link, ...]  # between regions (a == b: inside one region)
    coordinator_region: str
    node_links: tuple[Link, ...] = ()  # overrides per node pair; `source` / `sink` for the coordinator
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        ids = [i for g in self.groups for i in g.ids]
        if len(set(ids)) != len(ids):
            raise ValueError(f"problem {self.name}: duplicate node ids")
        if SOURCE in ids or SINK in ids:
            raise ValueError(f"problem {self.name}: node ids {SOURCE!r}/{SINK!r} are reserved")
        regions = {g.region for g in self.groups} | {self.coordinator_region}
        have = {frozenset((lk.a, lk.b)) for lk in self.region_links}
        for r in sorted(regions):
            for s in sorted(regions):
                if frozenset((r, s)) not in have and not self.node_links:
                    raise ValueError(f"problem {self.name}: no link between regions {r!r} and {s!r}")

    # -- lookups (pure; tables.py caches what the solvers need) -----------------------------
    @property
    def num_layers(self) -> int:
        return self.model.num_layers

    @cached_property
    def _index(self) -> dict[str, tuple[int, str]]:
        return {i: (gi, g.region) for gi, g in enumerate(self.groups) for i in g.ids}

    @cached_property
    def _overrides(self) -> dict[tuple[str, str], Link]:
        return {(lk.a, lk.b): lk for lk in self.node_links}

    def node_index(self) -> dict[str, tuple[int, str]]:
        """node id -> (group index, region)."""
        return self._index

    @cached_property
    def _regions(self) -> dict[tuple[str, str], Link]:
        """(r, s) and (s, r) -> the first region link between them, as region_links lists them."""
        out: dict[tuple[str, str], Link] = {}
        for lk in self.region_links:
            out.setdefault((lk.a, lk.b), lk)
            out.setdefault((lk.b, lk.a), lk)
        return out

    def region_link(self, r: str, s: str) -> Link:
        try:
            return self._regions[(r, s)]
        except KeyError:
            raise KeyError(f"no link between regions {r!r} and {s!r}") from None

    def link(self, u: str, v: str) -> Link:
        """The link from u to v (node ids, or `source` / `sink`)."""
        known = self.memo.get(("link", u, v))
        if known is not None:
            return known
        over = self._overrides
        key = (u, v) if (u, v) in over else (v, u)
        if key in over:
            lk = over[key]
        else:
            idx = self.node_index()
            ru = self.coordinator_region if u in (SOURCE, SINK) else idx[u][1]
            rv = self.coordinator_region if v in (SOURCE, SINK) else idx[v][1]
            lk = self.region_link(ru, rv)
        self.memo[("link", u, v)] = lk
        return lk

    @cached_property
    def memo(self) -> dict:
        """Answers of pure functions of this problem that the chain search asks for again and again
        (link, edge_capacity, chain_model.hop, splits' concurrency tables: millions of calls on the
        Helix clusters), keyed by the function's name and arguments."""
        return {}

    def edge_capacity(self, u: str, v: str) -> float:
        """Helix's edge capacity in tokens/s: bandwidth / bytes per token (coordinator) or activation."""
        known = self.memo.get(("capacity", u, v))
        if known is not None:
            return known
        if u == v:
            return math.inf
        lk = self.link(u, v)
        size = self.model.token_bytes if SOURCE in (u, v) or SINK in (u, v) else self.model.activation_bytes
        cap = self.memo[("capacity", u, v)] = lk.bandwidth / size
        return cap

