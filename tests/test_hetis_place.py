"""Hetis primary-worker selection inside `place` (passes/place_hetis.py) and the attention-worker
estimate (perf/attention.py).

- the plan with selection never serves less than the plan without it (`placement.delta: 0` turns
  it off) at the same budget, on the Hetis example, Helix's clusters and small random clusters;
- the Hetis example really leaves GPUs out, and plan.md / explain say so with the estimate;
- a rented GPU that is left out is not rented (its $/h saved), an owned one stays idle;
- the attention estimate goes through the capacity formula: a fast link helps a KV-bound replica,
  a slow one makes offloading not pay.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from conftest import ROOT, build
from hetcompile import placement
from hetcompile.backends.emit import artifacts
from hetcompile.driver import compile_spec
from hetcompile.explain.explain import explain_plan
from hetcompile.explain.render import render_explanation
from hetcompile.plan.io import check_plan_doc
from hetcompile.passes.place import idle_owned, materialize
from hetcompile.passes.place_hetis import select_chains
from hetcompile.passes.place_problem import placement_problem
from hetcompile.opt.solve import SolverOptions
from hetcompile.perf import analytic, attention, catalog
from hetcompile.perf.capacity import chain_capacity

# the example where selection leaves GPUs out (two T4s: 4.8% < 5%); in hetis-cluster placement keeps
# compose's A100 replica and no chain at all (its spec says why)
SELECTS = ROOT / "examples" / "helix-single24"


def with_delta(src: Path, tmp: Path, delta: str) -> Path:
    """A copy of an example directory whose spec sets placement.delta (files it names come along)."""
    dst = tmp / f"{src.name}-{delta.rstrip('%')}"
    shutil.copytree(src, dst)
    text = (dst / "spec.yaml").read_text()
    lines = [ln for ln in text.splitlines() if not ln.strip().startswith("delta:")]
    out = []
    for ln in lines:
        out.append(ln)
        if ln.strip() == "placement:":
            out.append(f"  delta: {delta}")
    (dst / "spec.yaml").write_text("\n".join(out) + "\n")
    return dst / "spec.yaml"


def served_and_price(spec: Path) -> tuple[float, float, object]:
    # selection's effect on what compose and placement plan; verification's replans would add
    # their own noise on top (tests/test_slo.py checks those)
    ir = compile_spec(spec, verify=False).ir
    return ir.composition.scale, sum(n.price_per_s for n in ir.nodes), ir


@pytest.mark.parametrize("example", ["hetis-cluster", "helix-cluster10", "helix-single24"])
def test_selection_never_serves_less_than_without_it(example: str, tmp_path: Path) -> None:
    src = ROOT / "examples" / example
    on = with_delta(src, tmp_path, "10%")
    off = with_delta(src, tmp_path, "0")
    s_on, p_on, ir_on = served_and_price(on)
    s_off, p_off, ir_off = served_and_price(off)
    assert not ir_off.primary_workers  # delta 0: nothing is ever left out
    assert s_on >= s_off * (1 - 1e-9)
    if ir_on.objective == "min-cost":
        assert p_on <= p_off + 1e-12  # serving the same demand, never for more
    if example == "helix-single24":  # an example must exercise it (two T4s left out), or this test says nothing
        assert any(pw.applied and pw.left_out for pw in ir_on.primary_workers)


SMALL = """\
name: small-{i}
models:
  - {{name: {model}, dtype: fp16, max_model_len: 2048}}
workloads:
  - {{name: chat, model: {model}, input_tokens: {inp}, output_tokens: {out}, rate: {rate}/s}}
regions:
  - name: lab
    cloud: kubernetes
    offers:
{offers}
network:
  intra_region: {{bandwidth: 100Gbps, latency: 0.05ms}}
objective: {objective}
solver: {{time_limit: 30s, seed: 0}}
placement: {{pipelines: mixed, compare_shared: false, delta: {delta}}}
"""


# seeds picked to cover each path: 0 max-throughput (nothing applies), 2 min-cost (owned T4s left
# out, idle), 6 infeasible either way, 7 min-cost (an A10 moved to another replica)
@pytest.mark.parametrize("seed", [0, 2, 6, 7])
def test_selection_never_serves_less_on_random_small_clusters(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    gpus = rng.sample(["H100", "A100-80GB", "L40S", "A10", "L4", "T4"], 3)
    offers = "\n".join(
        f"      - {{gpu: {g}, gpus_per_node: 1, max_nodes: {n}, price: ${rng.choice([0.3, 1.0, 2.0])}/h, owned: {n}}}"
        for g, n in zip(gpus, (rng.randint(1, 3), rng.randint(1, 4), rng.randint(2, 4)))
    )
    fields = dict(i=seed, model=rng.choice(["llama-2-13b", "llama-30b"]), inp=rng.choice([300, 1000]), out=rng.choice([100, 250]),
                  rate=rng.choice([0.5, 1, 2]), offers=offers, objective=rng.choice(["max-throughput", "min-cost"]))
    results = []
    for delta in ("0", "30%"):
        spec = tmp_path / f"d{delta.rstrip('%')}.yaml"
        spec.write_text(SMALL.format(delta=delta, **fields))
        try:
            results.append(served_and_price(spec))
        except Exception as exc:  # the same spec must fail the same way with and without selection
            results.append(type(exc).__name__)
    if isinstance(results[0], str) or isinstance(results[1], str):
        assert results[0] == results[1]
        return
    (s_off, p_off, _), (s_on, p_on, _) = results
    assert s_on >= s_off * (1 - 1e-9)
    if fields["objective"] == "min-cost":
        assert p_on <= p_off + 1e-12


def test_example_plan_md_and_explain_show_left_out_gpus_and_the_estimate() -> None:
    ir = build(SELECTS / "spec.yaml").ir
    files = artifacts(ir)
    md = files["plan.md"]
    assert "## Primary workers (Hetis §4.1)" in md
    assert "would add" in md and "< 5%" in md and "left out (owned, idle)" in md  # the spec's delta: 5%
    assert "NOT deployable on vLLM 0.33" in md and "KV tokens" in md and "tokens/s" in md
    text = render_explanation(explain_plan(check_plan_doc(json.loads(files["plan.json"]))), "md")
    assert "Primary workers" in text and "NOT deployable" in text
    # the left-out GPUs are in no replica and not billed
    used = {s.node for r in ir.replicas for s in r.stages}
    gone = {n for pw in ir.primary_workers for lo in pw.left_out for n in lo.nodes}
    assert gone and not gone & used and not gone & {n.id for n in ir.nodes}


def test_a_rented_gpu_left_out_is_not_rented() -> None:
    """helix-single24's pool with its T4s rented instead of owned: the same selection leaves T4s out
    of the chain, now saving their $/h (the fate depends only on what the node costs; a left-out unit
    is a TP slice of `tp` GPUs, each billed at the per-GPU price)."""
    ir = build(SELECTS / "spec.yaml", stop_after="compose").ir
    nodes, _ = materialize(ir)
    pool = list(nodes) + idle_owned(ir, nodes)
    pp = placement_problem(ir, "llama-2-70b", pool)
    res = placement.place(pp, mode="chains", options=SolverOptions(time_limit_s=60, seed=0, threads=1))
    price = 0.35 / 3600.0
    by_id = {n.id: n.model_copy(update={"price_per_s": price * n.gpus, "owned": False, "owned_gpus": 0}) if n.gpu == "T4" else n
             for n in pool}
    ws = [w for w in ir.workloads if w.model == "llama-2-70b"]
    chains, recs = select_chains(ir, pp, list(res.chains), ws, by_id, SolverOptions(seed=0))
    left = [lo for r in recs if r.applied for lo in r.left_out]
    assert left and all(lo.fate == "not-rented" for lo in left) and {lo.gpu for lo in left} == {"T4"}
    assert sum(lo.saved_per_s for lo in left) == pytest.approx(price * sum(u.tp for lo in left for u in lo.units))
    kept_units = {u.unit for c in chains for u in c.stages}
    assert not kept_units & {u.unit for lo in left for u in lo.units}


def _replica(kv_tokens: float):
    _, _, arch = catalog.lookup_model("llama-2-13b")
    g = catalog.lookup_gpu("L4")
    return arch, analytic.replica_model(arch, 2, [(g, 1, 40, kv_tokens)], 0.0, 1e12, 256)


def test_attention_offload_helps_a_kv_bound_replica_over_a_fast_link() -> None:
    arch, rm = _replica(3000.0)  # a few sequences of KV: concurrency-bound
    t4 = catalog.lookup_gpu("T4")
    est = attention.offload(rm, arch, 2, [(t4, 2)], 0.92, 10e-6, 12.5e9, 500, 200)
    base = chain_capacity(rm, 500, 200)
    assert est.decode_tokens_per_s == pytest.approx(base.decode_tokens_per_s)
    assert est.rho > 0 and est.kv_tokens_with > est.kv_tokens
    assert est.decode_tokens_per_s_with > est.decode_tokens_per_s
    # K' = min(K / (1 - rho), K_A / rho) at the chosen rho
    k_a = attention.worker_kv_tokens(arch, 2, [(t4, 2)], 0.92)
    assert est.kv_tokens_with == pytest.approx(min(3000.0 / (1 - est.rho), k_a / est.rho))


def test_attention_offload_does_not_pay_over_a_slow_link() -> None:
    arch, rm = _replica(3000.0)
    est = attention.offload(rm, arch, 2, [(catalog.lookup_gpu("T4"), 2)], 0.92, 0.5, 1e6, 500, 200)
    assert est.rho == 0 and est.decode_tokens_per_s_with == est.decode_tokens_per_s
