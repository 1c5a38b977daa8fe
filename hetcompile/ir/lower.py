"""Lower a validated `Spec` to the canonical `Problem` IR: resolve names, fill defaults, go SI.

Checks that need more than one field live here and point at the spec line that is wrong:
a workload naming an unknown model, an offer naming an unknown GPU (with did-you-mean), a
link between unknown regions, an offer without any price, inconsistent demand kinds.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

from hetcompile.errors import SpecError, did_you_mean
from hetcompile.ir.load import read_profiles, read_spec
from hetcompile.ir.problem import (
    Engine,
    GpuType,
    LayerProfile,
    Link,
    MeasuredShape,
    Model,
    ModelArch,
    Offer,
    PlacementConfig,
    Problem,
    SolverConfig,
    Workload,
)
from hetcompile.ir.spec import LayerProfileSpec, MeasuredProfile, Spec
from hetcompile.ir.yaml_spans import SourceMap
from hetcompile.plan import human
from hetcompile.perf import catalog, clouds
from hetcompile.perf.tail import DEFAULT_PERCENTILE, PERCENTILES

PCIE4 = 32e9


def _gpu_types(spec: Spec) -> dict[str, GpuType]:
    user = {}
    for g in spec.gpus:
        base = catalog.lookup_gpu(g.name)
        user[g.name.lower()] = GpuType(
            name=g.name,
            sky_name=g.sky_name or (base.sky_name if base else g.name),
            memory=g.memory,
            flops=g.fp16_tflops * 1e12,
            mem_bw=g.bandwidth,
            interconnect=g.interconnect or (base.interconnect if base else PCIE4),
            bf16=g.bf16,
            price_per_hour=g.price if g.price is not None else (base.price_per_hour if base else None),
            source="spec",
            eta_memory=base.eta_memory if base else None,
            eta_compute=base.eta_compute if base else None,
            compute_capability=g.compute_capability or (base.compute_capability if base else None),
        )
    return user


def _resolve_gpu(name: str, user: dict[str, GpuType], smap: SourceMap, path: tuple) -> GpuType:
    if name.lower() in user:
        return user[name.lower()]
    found = catalog.lookup_gpu(name)
    if found is not None:
        return found
    known = sorted({*catalog.gpu_names(), *(g.name for g in user.values())})
    guess = did_you_mean(name, [*known, *catalog.all_gpu_spellings()])
    hit = catalog.lookup_gpu(guess) if guess else None
    raise SpecError(
        f"unknown GPU {name!r}" + (f"; did you mean {hit.name if hit else guess!r}?" if guess else ""),
        smap.value(path),
        hint=f"known GPUs: {', '.join(known)}; or define it under `gpus:` (memory, fp16_tflops, bandwidth)",
    )


VLLM_MIN_COMPUTE_CAPABILITY = (7, 0)  # vLLM 0.33's CUDA kernels are built for sm_70 and newer (Volta+)


def _check_vllm_runs(gpu: GpuType, smap: SourceMap, path: tuple) -> None:
    """An offer of a GPU vLLM 0.33 cannot run (compute capability below 7.0, e.g. P100 sm_60) is
    refused where it is written, not planned: no replica on it would start."""
    cc = gpu.compute_capability
    if cc is None:
        return
    try:
        major, minor = (int(x) for x in cc.split(".", 1)) if "." in cc else (int(cc), 0)
    except ValueError:
        raise SpecError(f"GPU {gpu.name}: cannot read compute capability {cc!r}; write e.g. '8.0'", smap.value(path)) from None
    if (major, minor) < VLLM_MIN_COMPUTE_CAPABILITY:
        need = ".".join(map(str, VLLM_MIN_COMPUTE_CAPABILITY))
        raise SpecError(
            f"vLLM 0.33 cannot run on {gpu.name}: compute capability {cc} (sm_{major}{minor}) is below the {need} "
            "its CUDA kernels need", smap.value(path),
            hint="drop this offer, or pick a Volta (V100) or newer GPU",
        )


def _pinned(value: int | tuple[int, ...] | None, path: tuple, smap: SourceMap) -> tuple[int, ...] | None:
    """A model's `tp` / `pp` as the sorted degrees allowed (None: not pinned)."""
    if value is None:
        return None
    vals = (value,) if isinstance(value, int) else tuple(value)
    if not vals or any(v < 1 for v in vals):
        raise SpecError(f"{path[-1]} must be a positive integer or a non-empty list of them, got {value!r}",
                        smap.value(path), hint=f"e.g. `{path[-1]}: 2` or `{path[-1]}: [1, 2]`")
    return tuple(sorted(set(vals)))


def _models(spec: Spec, smap: SourceMap) -> tuple[Model, ...]:
    out = []
    seen: set[str] = set()
    for i, m in enumerate(spec.models):
        if m.name in seen:
            raise SpecError(f"model {m.name!r} is listed twice", smap.value(("models", i, "name")))
        seen.add(m.name)
        found = catalog.lookup_model(m.name)
        if m.architecture is not None:
            a = m.architecture
            arch = ModelArch(
                layers=a.layers, hidden=a.hidden, intermediate=a.intermediate, heads=a.heads, kv_heads=a.kv_heads,
                head_dim=a.head_dim or a.hidden // a.heads, vocab=a.vocab, max_context=a.max_context,
                tie_embeddings=a.tie_embeddings, source="spec",
            )
            default_weights = found[1] if found else None
        elif found is not None:
            _, default_weights, arch = found
        else:
            guess = did_you_mean(m.name, catalog.model_names())
            raise SpecError(
                f"unknown model {m.name!r}" + (f"; did you mean {guess!r}?" if guess else ""),
                smap.value(("models", i, "name")),
                hint=f"catalog models: {', '.join(catalog.model_names())}; or give `architecture:` "
                "(layers, hidden, intermediate, heads, kv_heads, vocab) for another model",
            )
        weights = m.weights or default_weights
        if not weights:
            raise SpecError(f"model {m.name!r} needs `weights:` (a Hugging Face id or a path)", smap.value(("models", i)))
        lens = [w.input_tokens + w.output_tokens for w in spec.workloads if w.model == m.name]
        if m.max_model_len:
            max_len = m.max_model_len
        else:
            need = max(lens, default=2048)
            max_len = min(arch.max_context, 1 << max(8, math.ceil(math.log2(2 * need))))
        for j, w in enumerate(spec.workloads):
            if w.model == m.name and w.input_tokens + w.output_tokens > max_len:
                raise SpecError(
                    f"workload {w.name!r} needs {w.input_tokens + w.output_tokens} tokens of context but "
                    f"{m.name} is served with max_model_len {max_len}",
                    smap.value(("workloads", j, "input_tokens")),
                    hint="shorten the workload or raise the model's `max_model_len`",
                )
        dtype = {"auto": "auto", "fp16": "float16", "float16": "float16", "bf16": "bfloat16", "bfloat16": "bfloat16"}[m.dtype]
        tp, pp = _pinned(m.tp, ("models", i, "tp"), smap), _pinned(m.pp, ("models", i, "pp"), smap)
        for t in tp or ():
            if t & (t - 1) or arch.heads % t or arch.kv_heads % t and t % arch.kv_heads:
                raise SpecError(f"model {m.name!r}: tp {t} is not a power of two that divides its {arch.heads} attention "
                                f"heads ({arch.kv_heads} KV heads)", smap.value(("models", i, "tp")),
                                hint="vLLM shards heads evenly: use a power of two that divides the heads, e.g. "
                                     + ", ".join(str(x) for x in (1, 2, 4, 8) if arch.heads % x == 0))
        for d in pp or ():
            if d > arch.layers:
                raise SpecError(f"model {m.name!r}: pp {d} is more stages than its {arch.layers} layers",
                                smap.value(("models", i, "pp")), hint=f"use at most {arch.layers}")
        out.append(Model(name=m.name, served_name=m.served_name or m.name, weights=weights, dtype=dtype, arch=arch,
                         max_model_len=max_len, tp=tp, pp=pp))
    return tuple(sorted(out, key=lambda x: x.name))


def _all_given(values: list[float | None]) -> list[float] | None:
    """The values when every one is given (and not 0), else None."""
    return [v for v in values if v] if all(values) else None


def _workloads(spec: Spec, smap: SourceMap, models: set[str]) -> tuple[Workload, ...]:
    names: set[str] = set()
    for i, w in enumerate(spec.workloads):
        if w.model not in models:
            guess = did_you_mean(w.model, sorted(models))
            raise SpecError(
                f"workload {w.name!r} names model {w.model!r}, which is not under `models`"
                + (f"; did you mean {guess!r}?" if guess else ""),
                smap.value(("workloads", i, "model")),
            )
        if w.name in names:
            raise SpecError(f"workload {w.name!r} is listed twice", smap.value(("workloads", i, "name")))
        names.add(w.name)
    ws = spec.workloads
    requests = _all_given([w.requests for w in ws])
    rates = _all_given([w.rate for w in ws])
    shares = _all_given([w.share for w in ws])
    demand: list[float]
    if spec.objective == "min-makespan" and requests is not None:
        kind, demand = "requests", requests
    elif rates is not None:
        kind, demand = "rate", rates
    elif shares is not None:
        kind, demand = "share", shares
    elif requests is not None:
        kind, demand = "requests", requests
    elif not any(w.rate or w.share or w.requests for w in ws):
        kind, demand = "share", [1.0] * len(ws)
    else:
        i = next(i for i, w in enumerate(ws) if not w.rate)
        raise SpecError(
            f"workload {ws[i].name!r} has no rate while others do",
            smap.value(("workloads", i)),
            hint="give every workload a `rate` (or every workload a `share`, or `requests` for min-makespan)",
        )
    if spec.objective == "min-cost" and kind != "rate":
        raise SpecError(
            "objective min-cost needs a `rate` on every workload (the demand to meet at least cost)",
            smap.value(("objective",)),
        )
    if kind == "share":  # shares are a mix: normalize so theta * share is requests/s
        total = sum(demand)
        demand = [d / total for d in demand]
    out = []
    for w, d in zip(ws, demand):
        match = w.match.model_dump(exclude_none=True) if w.match else {}
        out.append(
            Workload(
                name=w.name, model=w.model, input_tokens=float(w.input_tokens), output_tokens=float(w.output_tokens),
                demand=float(d), demand_kind=kind, rate=w.rate,
                ttft_slo=w.slo.ttft if w.slo else None, tpot_slo=w.slo.tpot if w.slo else None,
                slo_quantile=PERCENTILES[w.slo.percentile] if w.slo else PERCENTILES[DEFAULT_PERCENTILE], match=match,
            )
        )
    return tuple(sorted(out, key=lambda x: x.name))


def _offers(spec: Spec, smap: SourceMap, user: dict[str, GpuType],
            warnings: list[str] | None = None) -> tuple[tuple[Offer, ...], tuple[GpuType, ...]]:
    """The spec's offers in IR form; a default (catalog) price adds a located line to `warnings`."""
    warnings = [] if warnings is None else warnings
    offers: list[Offer] = []
    used: dict[str, GpuType] = {}
    regions = set()
    for ri, r in enumerate(spec.regions):
        if r.name in regions:
            raise SpecError(f"region {r.name!r} is listed twice", smap.value(("regions", ri, "name")))
        regions.add(r.name)
        no_region = clouds.check_region(r.cloud, r.name)
        if no_region is not None:
            raise SpecError(no_region.message, smap.value(("regions", ri, "name")), hint=no_region.hint)
        for oi, o in enumerate(r.offers):
            path = ("regions", ri, "offers", oi)
            gpu = _resolve_gpu(o.gpu, user, smap, path + ("gpu",))
            _check_vllm_runs(gpu, smap, path + ("gpu",))
            if o.gpu.lower() not in user:  # a user-described GPU type is never checked against a cloud
                not_sold = clouds.check_gpu(r.cloud, gpu.name, catalog.gpu_spellings(gpu.name))
                if not_sold is not None:
                    raise SpecError(not_sold.message, smap.value(path + ("gpu",)), hint=not_sold.hint)
            price = o.price if o.price is not None else gpu.price_per_hour
            if price is None:
                raise SpecError(f"no price for {gpu.name} in {r.name}", smap.value(path), hint="add `price: $X/h` (per GPU-hour)")
            source = "spec"
            if o.price is None and o.gpu.lower() in user:
                source = f"spec (`gpus:` entry {gpu.name})"
            elif o.price is None:
                src, when = catalog.price_provenance(gpu.name) or ("catalog", "undated")
                source = f"catalog default ({src}, checked {when})"
                if o.owned < o.max_nodes:  # all-owned offers cost nothing whatever the price
                    span = smap.value(path)
                    at = f"{span.file}:{span.line}:{span.col}: " if span is not None else ""
                    warnings.append(
                        f"{at}no price for {gpu.name} in {r.name} ({r.cloud}): using the {source} of "
                        f"{human.money(price)} per GPU; add `price: $X/h` with what {r.cloud} charges you"
                    )
            if o.owned > o.max_nodes:
                raise SpecError(
                    f"owned ({o.owned}) exceeds max_nodes ({o.max_nodes})", smap.value(path + ("owned",)),
                    hint="max_nodes counts owned and rentable nodes together",
                )
            oid = f"{r.name}/{gpu.name}x{o.gpus_per_node}"
            if any(x.id == oid for x in offers):
                raise SpecError(f"offer {oid} is listed twice", smap.value(path))
            used[gpu.name] = gpu
            offers.append(
                Offer(
                    id=oid, region=r.name, cloud=r.cloud, gpu=gpu.name, gpus_per_node=o.gpus_per_node,
                    max_nodes=o.max_nodes, owned_nodes=o.owned, price_per_gpu_s=price / 3600.0, spot=o.spot,
                    price_source=source,
                )
            )
    return tuple(sorted(offers, key=lambda x: x.id)), tuple(sorted(used.values(), key=lambda g: g.name))


def _links(spec: Spec, smap: SourceMap) -> tuple[Link, ...]:
    names = sorted(r.name for r in spec.regions)
    override = {}
    for i, l in enumerate(spec.network.links):
        for j, n in enumerate(l.between):
            if n not in names:
                guess = did_you_mean(n, names)
                raise SpecError(
                    f"link names unknown region {n!r}" + (f"; did you mean {guess!r}?" if guess else ""),
                    smap.value(("network", "links", i, "between", j)),
                )
        override[tuple(sorted(l.between))] = l
    out = []
    for ai, a in enumerate(names):
        for b in names[ai:]:
            link = override.get((a, b)) or (spec.network.intra_region if a == b else spec.network.inter_region)
            out.append(Link(a=a, b=b, bandwidth=link.bandwidth, latency=link.latency))
    return tuple(out)


def _measured(spec: Spec, smap: SourceMap, base: Path, models: set[str], user: dict[str, GpuType], workloads: set[str],
              served: dict[str, str] | None = None) -> tuple[MeasuredShape, ...]:
    """The spec's measured profiles. A profile may name its model by the spec's name or by the name
    the server answers to (`served_name`: what `hetcompile profile --model` was given by a user
    who read it off the server), which `served` maps back."""
    entries: list[tuple[MeasuredProfile, SourceMap, tuple]] = []
    for i, p in enumerate(spec.profiles):
        if isinstance(p, str):
            items, psmap = read_profiles(base / p, smap.value(("profiles", i)))
            entries.extend((item, psmap, (j,)) for j, item in enumerate(items))
        else:
            entries.append((p, smap, ("profiles", i)))
    out = []
    for p, psmap, path in entries:
        spec_name = (served or {}).get(p.model)  # the model whose served_name the profile gives
        if p.model not in models and spec_name in models:
            p = p.model_copy(update={"model": spec_name})
        if p.model not in models:
            guess = did_you_mean(p.model, sorted(models | set(served or {})))
            raise SpecError(f"profile for unknown model {p.model!r}" + (f"; did you mean {guess!r}?" if guess else ""),
                            psmap.value(path + ("model",)),
                            hint=f"the spec's models are {', '.join(sorted(models))} (or the served_name each answers to)")
        gpu = _resolve_gpu(p.gpu, user, psmap, path + ("gpu",))
        if not p.has_numbers():
            raise SpecError(
                f"profile {p.model}/{p.gpu}/tp{p.tp}/pp{p.pp} has no measured numbers, so it cannot make the estimate 'measured'",
                psmap.value(path),
                hint="give throughput, kv_capacity_tokens, prefill_tokens_per_s, decode_tokens_per_s or coefficients "
                     "(`hetcompile profile ENDPOINT --model M --gpu G --tp T` writes them), or remove the entry",
            )
        for w in p.throughput:
            if w not in workloads:
                guess = did_you_mean(w, sorted(workloads))
                raise SpecError(
                    f"profile throughput names unknown workload {w!r}" + (f"; did you mean {guess!r}?" if guess else ""),
                    psmap.key(path + ("throughput", w)),
                )
        out.append(
            MeasuredShape(
                model=p.model, gpu=gpu.name, tp=p.tp, pp=p.pp, throughput=tuple(sorted(p.throughput.items())),
                kv_capacity_tokens=p.kv_capacity_tokens, prefill_tokens_per_s=p.prefill_tokens_per_s,
                decode_tokens_per_s=p.decode_tokens_per_s, source=p.source,
                coefficients=tuple(sorted(p.coefficients.model_dump().items())) if p.coefficients else (),
            )
        )
    return tuple(sorted(out, key=lambda m: (m.model, m.gpu, m.tp, m.pp)))


def _placement(spec: Spec, smap: SourceMap, base: Path, models: dict[str, Model], user: dict[str, GpuType]) -> PlacementConfig:
    pl = spec.placement
    regions = [r.name for r in spec.regions]
    if spec.disaggregation == "auto" and pl.pipelines == "mixed":
        raise SpecError("disaggregation: auto pairs one-node prefill and decode replicas; mixed-type pipelines "
                        "(placement.pipelines: mixed) cannot be one of them yet",
                        smap.value(("disaggregation",)), hint="set `placement.pipelines: single-type`, or `disaggregation: off`")
    if pl.coordinator is not None and pl.coordinator not in regions:
        guess = did_you_mean(pl.coordinator, regions)
        raise SpecError(
            f"placement coordinator names unknown region {pl.coordinator!r}" + (f"; did you mean {guess!r}?" if guess else ""),
            smap.value(("placement", "coordinator")),
        )
    entries: list[tuple[LayerProfileSpec, SourceMap, tuple]] = []
    for i, p in enumerate(pl.layer_profiles):
        if isinstance(p, str):
            items, psmap = read_profiles(base / p, smap.value(("placement", "layer_profiles", i)), LayerProfileSpec)
            entries.extend((item, psmap, (j,)) for j, item in enumerate(items))
        else:
            entries.append((p, smap, ("placement", "layer_profiles", i)))
    out = []
    for p, psmap, path in entries:
        if p.model not in models:
            raise SpecError(f"layer profile for unknown model {p.model!r}", psmap.value(path + ("model",)))
        gpu = _resolve_gpu(p.gpu, user, psmap, path + ("gpu",))
        if len(p.kv_token_layers) != len(p.throughput):
            raise SpecError(
                f"layer profile {p.model}/{gpu.name}/tp{p.tp}: kv_token_layers has {len(p.kv_token_layers)} entries but "
                f"throughput has {len(p.throughput)}; give both for k = 1, 2, ... layers",
                psmap.value(path + ("kv_token_layers",)),
            )
        if len(p.throughput) > models[p.model].arch.layers:
            raise SpecError(
                f"layer profile {p.model}/{gpu.name}/tp{p.tp}: {len(p.throughput)} entries for a model of "
                f"{models[p.model].arch.layers} layers", psmap.value(path + ("throughput",)),
            )
        out.append(LayerProfile(
            model=p.model, gpu=gpu.name, tp=p.tp, throughput=p.throughput, kv_token_layers=p.kv_token_layers,
            decode_time=p.decode_time, prefill_time=p.prefill_time, source=p.source,
        ))
    keys = [(p.model, p.gpu, p.tp) for p in out]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise SpecError(f"two layer profiles for model {dup[0]}, GPU {dup[1]}, tp {dup[2]}", smap.value(("placement",)))
    if not 0.0 <= pl.delta < 1.0:
        raise SpecError(
            f"placement delta {pl.delta:g} is out of range: a GPU stays out of a replica when removing it raises the "
            "dense cost by less than delta, so delta must be in [0, 1)", smap.value(("placement", "delta")),
            hint="0.05 (5%) is Hetis's default; 0 keeps every GPU placement chose",
        )
    return PlacementConfig(
        delta=pl.delta, pipelines=pl.pipelines, objective=pl.objective, compare_shared=pl.compare_shared,
        partial_inference=pl.partial_inference, coordinator=pl.coordinator or spec.regions[0].name,
        layer_profiles=tuple(sorted(out, key=lambda p: (p.model, p.gpu, p.tp))),
    )


def _spans(spec: Spec, smap: SourceMap, offers: tuple[Offer, ...]) -> tuple:
    out = []

    def add(key: str, span) -> None:
        if span is not None:
            out.append((key, span.file, span.line, span.col, span.text))

    if spec.budget is not None:
        add("budget", smap.value(("budget",)))
    add("objective", smap.value(("objective",)))
    if spec.estimates != "analytic":
        add("estimates", smap.value(("estimates",)))
    for i, m in enumerate(spec.models):
        add(f"model:{m.name}", smap.value(("models", i, "name")))
    for i, w in enumerate(spec.workloads):
        if w.slo is not None:
            add(f"slo:{w.name}", smap.value(("workloads", i, "slo")))
    return tuple(sorted(out))


def lower(spec: Spec, smap: SourceMap, raw: bytes, spec_path: Path) -> Problem:
    user = _gpu_types(spec)
    models = _models(spec, smap)
    workloads = _workloads(spec, smap, {m.name for m in models})
    warnings: list[str] = []
    offers, gpus = _offers(spec, smap, user, warnings)
    measured = _measured(spec, smap, spec_path.parent, {m.name for m in models}, user, {w.name for w in workloads},
                         {m.served_name: m.name for m in models if m.served_name != m.name})
    for m in measured:
        if m.gpu not in {g.name for g in gpus}:
            gpu = user.get(m.gpu.lower()) or catalog.lookup_gpu(m.gpu)
            assert gpu is not None  # _measured resolved m.gpu to one of these
            gpus = tuple(sorted([*gpus, gpu], key=lambda g: g.name))
    s, e = spec.solver, spec.engine
    return Problem(
        name=spec.name,
        spec_hash=hashlib.sha256(raw).hexdigest(),
        spec_file=spec_path.name,
        models=models,
        workloads=workloads,
        gpus=gpus,
        offers=offers,
        links=_links(spec, smap),
        budget_per_s=spec.budget / 3600.0 if spec.budget is not None else None,
        objective=spec.objective,
        solver=SolverConfig(time_limit_s=s.time_limit, mip_gap=s.mip_gap, threads=s.threads, seed=s.seed,
                            node_limit=s.node_limit),
        engine=Engine(
            image=e.image, gpu_memory_utilization=e.gpu_memory_utilization, max_num_seqs=e.max_num_seqs,
            port=e.port, router_port=e.router_port, disk_size=e.disk_size,
        ),
        measured=measured,
        measured_only=spec.estimates == "measured-only",
        max_utilization=spec.max_utilization,
        max_ttft_slowdown=spec.max_ttft_slowdown,
        disaggregation=spec.disaggregation == "auto",
        placement=_placement(spec, smap, spec_path.parent, {m.name: m for m in models}, user),
        spans=_spans(spec, smap, offers),
        warnings=tuple(warnings),
    )


def load_problem(path: Path) -> tuple[Problem, Spec, SourceMap]:
    """Spec file -> Problem IR (the `load` + `lower` arrows of docs/DESIGN.md's data flow)."""
    spec, smap, raw = read_spec(path)
    return lower(spec, smap, raw, path), spec, smap
