"""compose_model's prefill/decode rows (issue 35): coverage counts decodes and aggregated replicas, and
in each balance group every request a decode replica serves had its prompt prefilled there. Small
tables, solved by HiGHS; no spec."""

from __future__ import annotations

import pytest

from hetcompile.opt.solve import SolverOptions, solve
from hetcompile.passes.compose_model import ComposeTables, build_model, extract


def _tables(groups: dict[str, str], h_agg: float = 1.0, budget: float | None = None, **more) -> ComposeTables:
    """One workload w at 10 req/s on one offer (1 $/GPU-s, 40 GPUs): an aggregated shape `a` of
    h_agg req/s, a prefill shape `p` (4 prompts/s) and a decode shape `d` (2 req/s), one GPU each."""
    shapes = ("a", "d", "p")
    return ComposeTables(
        shapes=shapes, workloads=("w",), offers=("o",), shape_offer={c: "o" for c in shapes},
        shape_gpus={c: 1 for c in shapes}, h={("a", "w"): h_agg, ("p", "w"): 4.0, ("d", "w"): 2.0},
        demand={"w": 10.0}, avail={"o": 40}, owned={"o": 0}, price={"o": 1.0}, budget=budget,
        shape_role={"p": "prefill", "d": "decode"}, shape_group=groups, **more)


def _solve(t: ComposeTables, objective: str):
    m = build_model(t, objective)
    res = solve(m, SolverOptions(time_limit_s=30), name="compose-pd")
    assert res.has_solution
    return extract(m, t, fixed_theta=objective == "cost")


def test_min_cost_takes_the_split_where_it_is_cheaper_at_the_ratio_it_needs() -> None:
    # per req/s: aggregated 1 GPU, split 1/4 + 1/2 = 0.75 GPU: 3 prefill (10/4 rounded up) + 5 decode
    sol = _solve(_tables({"p": "r1", "d": "r1"}), "cost")
    assert sol.y == {"a": 0, "d": 5, "p": 3}
    assert sol.r[("p", "w")] == pytest.approx(10.0) and sol.r[("d", "w")] == pytest.approx(10.0)
    assert sol.cost == pytest.approx(8.0)


def test_phases_in_different_groups_cannot_pair() -> None:
    # the KV may not move between groups: with the prefill shape in another region, only `a` serves
    sol = _solve(_tables({"p": "r1", "d": "r2"}), "cost")
    assert sol.y == {"a": 10, "d": 0, "p": 0}


def test_the_aggregated_shape_wins_where_it_is_cheaper() -> None:
    sol = _solve(_tables({"p": "r1", "d": "r1"}, h_agg=2.0), "cost")  # 0.5 GPU per req/s against 0.75
    assert sol.y == {"a": 5, "d": 0, "p": 0}


def test_max_throughput_mixes_both_under_a_budget() -> None:
    # 9 $/s: the split alone would serve 9 GPUs' worth at 0.75 GPU per req/s = 12 req/s, but integrality
    # decides the mix; whatever it is, every decode request had its prompt prefilled
    sol = _solve(_tables({"p": "r1", "d": "r1"}, budget=9.0), "theta")
    assert sum(sol.y.values()) <= 9
    assert sol.r.get(("p", "w"), 0.0) == pytest.approx(sol.r.get(("d", "w"), 0.0))
    assert sol.r[("p", "w")] <= 4.0 * sol.y["p"] + 1e-6 and sol.r[("d", "w")] <= 2.0 * sol.y["d"] + 1e-6
    served = sol.r.get(("a", "w"), 0.0) + sol.r[("d", "w")]
    assert served == pytest.approx(10.0 * sol.theta) and sol.theta > 1.1  # more than 9 aggregated replicas serve


def test_a_workload_with_only_a_prefill_shape_is_not_served() -> None:
    t = ComposeTables(shapes=("p",), workloads=("w",), offers=("o",), shape_offer={"p": "o"}, shape_gpus={"p": 1},
                      h={("p", "w"): 4.0}, demand={"w": 1.0}, avail={"o": 4}, owned={"o": 0}, price={"o": 1.0},
                      budget=10.0, shape_role={"p": "prefill"}, shape_group={"p": "r1"})
    sol = _solve(t, "theta")
    assert sol.theta == pytest.approx(0.0)


# --- phase shapes from the real profile pass (passes/profile_pd.py) into the real compose tables -------------

H100, L40S = 3.90, 1.86  # $/GPU-h


def _profiled(input_tokens: int, tpot_ms: int, tmp_path):
    """Llama-3.1-8B, one workload at 20 req/s with p99 TTFT <= 2 s and the TPOT target, on H100 and L40S
    nodes of 8 in one region, 100 Gbit/s between nodes: the pipeline stopped after profile."""
    import yaml

    from hetcompile.driver import compile_spec

    spec = {"name": "pd", "models": [{"name": "llama-3.1-8b", "max_model_len": input_tokens + 256}],
            "workloads": [{"name": "w", "model": "llama-3.1-8b", "input_tokens": input_tokens, "output_tokens": 256,
                           "rate": "20/s", "slo": {"ttft": "2s", "tpot": f"{tpot_ms}ms", "percentile": "p99"}}],
            "regions": [{"name": "us-east-1", "cloud": "aws", "offers": [
                {"gpu": g, "gpus_per_node": 8, "max_nodes": 4, "price": f"${p}/h"} for g, p in (("H100", H100), ("L40S", L40S))]}],
            "network": {"intra_region": {"bandwidth": "100Gbps", "latency": "50us"}},
            "budget": "$1000/h", "objective": "min-cost"}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return compile_spec(path, stop_after="profile").ir


def _min_cost(ir, shapes):
    from hetcompile.passes.compose import tables

    t = tables(ir.model_copy(update={"shapes": shapes}))
    return t, _solve(t, "cost")


def test_phase_shapes_pair_each_prefill_with_one_decode_shape_of_its_region(tmp_path) -> None:
    from hetcompile.passes.profile_pd import phase_shapes

    ir = _profiled(8192, 25, tmp_path)
    ph = phase_shapes(ir, ir.perf, ir.shapes)
    decodes = {s.group: s for s in ph if s.role == "decode"}
    prefills = [s for s in ph if s.role == "prefill"]
    assert decodes and prefills and all(s.pp == 1 for s in ph)
    for s in prefills:  # sized for exactly one decode partner: its group's
        assert s.group in decodes and s.id.endswith("|for:" + decodes[s.group].id.split("|decode:")[0])
    for s in decodes.values():  # C* is the decode replica's own --max-num-seqs, and its TPOT meets the target
        assert s.max_num_seqs is not None and 1 <= s.max_num_seqs <= ir.engine.max_num_seqs
        assert dict(s.estimate.tpot_s)["w"] <= 0.025
    # the prefill side's TTFT estimate includes the transfer and the decode side, and meets the target
    assert all(dict(s.estimate.ttft_s)["w"] <= 2.0 for s in prefills)


def test_compose_takes_the_split_for_long_prompts_at_a_tight_tpot_and_not_for_short_ones(tmp_path) -> None:
    from hetcompile.passes.profile_pd import phase_shapes

    ir = _profiled(8192, 25, tmp_path)
    _, agg = _min_cost(ir, ir.shapes)
    t, both = _min_cost(ir, ir.shapes + phase_shapes(ir, ir.perf, ir.shapes))
    roles = {t.shape_role.get(c) for c, n in both.y.items() if n}
    assert roles == {"prefill", "decode"}  # every replica of the cheapest plan is a phase replica
    assert both.cost < 0.9 * agg.cost  # 8k prompts at 25 ms TPOT: the split is cheaper by more than 10%
    for (c, w), v in both.r.items():  # each group's prompts prefilled = its requests decoded
        if t.shape_role.get(c) == "decode":
            pre = sum(x for (c2, w2), x in both.r.items() if w2 == w and t.shape_group.get(c2) == t.shape_group[c]
                      and t.shape_role.get(c2) == "prefill")
            assert pre == pytest.approx(v)

    short = _profiled(512, 25, tmp_path)
    _, agg = _min_cost(short, short.shapes)
    t, both = _min_cost(short, short.shapes + phase_shapes(short, short.perf, short.shapes))
    assert both.cost == pytest.approx(agg.cost)  # 512-token prompts: the split buys nothing
    assert not {t.shape_role.get(c) for c, n in both.y.items() if n} - {None}


def test_a_prefill_and_a_decode_gpu_pair_only_within_one_attention_backend_family(tmp_path) -> None:
    from hetcompile.passes.profile_pd import attention_family, phase_shapes
    from hetcompile.perf.catalog import lookup_gpu

    family = {g: attention_family(lookup_gpu(g)) for g in ("H100", "L40S", "A100", "T4")}
    assert family == {"H100": "flash-attn", "L40S": "flash-attn", "A100": "flash-attn", "T4": "other"}
    b200 = lookup_gpu("H100").model_copy(update={"name": "B200", "compute_capability": "10.0"})  # not in the catalog
    assert attention_family(b200) == "flashinfer"
    ir = _profiled(8192, 25, tmp_path)  # H100 and L40S: one family, so cross-type pairs are offered
    pairs = {(s.gpu, s.group.split("us-east-1/")[1].split("x")[0]) for s in phase_shapes(ir, ir.perf, ir.shapes)
             if s.role == "prefill"}
    assert ("L40S", "H100") in pairs or ("H100", "L40S") in pairs
