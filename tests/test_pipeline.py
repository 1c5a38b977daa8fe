"""Pass registry, pipeline contracts, stop/dump-after, schemas kept current, perf-model sanity."""

from __future__ import annotations

import pytest

from conftest import ROOT, build
from hetcompile.driver import compile_spec
from hetcompile.errors import PassError
from hetcompile.passes import default_pipeline, get_all_passes
from hetcompile.perf.capacity import chain_capacity
from hetcompile.perf import analytic, catalog
from hetcompile.schemas_gen import schemas

QUICKSTART = ROOT / "examples/quickstart/spec.yaml"


def test_registry_keys_are_pass_names():
    for key, cls in get_all_passes().items():
        assert key == cls.name
    assert [p.name for p in default_pipeline()] == ["profile", "compose", "prune", "place", "parallelize", "route", "verify", "what-if"]
    assert [p.name for p in default_pipeline(verify=False)] == ["profile", "compose", "prune", "place", "parallelize", "route", "what-if"]


def test_verify_is_a_pass_that_can_be_stopped_after_and_switched_off():
    res = compile_spec(QUICKSTART, stop_after="verify")
    assert res.stopped_after == "verify" and res.ir.verification is not None
    assert res.ir.reports[-1].name == "verify" and res.ir.reports[-1].status == "met"
    off = compile_spec(QUICKSTART, verify=False)
    assert off.ir.verification is None and "verify" not in [r.name for r in off.ir.reports]
    with pytest.raises(PassError, match="unknown pass"):
        compile_spec(QUICKSTART, stop_after="verify", verify=False)


def test_stop_after_returns_partial_ir():
    res = compile_spec(QUICKSTART, stop_after="compose")
    assert res.stopped_after == "compose"
    assert res.ir.composition is not None and res.ir.replicas is None


def test_dump_after_keeps_ir_snapshots():
    res = compile_spec(QUICKSTART, dump_after=("profile", "route"))
    assert set(res.dumps) == {"profile", "route"}
    assert res.dumps["profile"].shapes and res.dumps["profile"].composition is None


def test_unknown_pass_name_is_an_error():
    with pytest.raises(PassError, match="unknown pass"):
        compile_spec(QUICKSTART, stop_after="optimize")


def test_every_pass_reports():
    res = build(QUICKSTART)
    assert [r.name for r in res.ir.reports] == [p.name for p in default_pipeline()]
    compose = next(r for r in res.ir.reports if r.name == "compose")
    assert compose.status == "optimal" and compose.bound is not None and compose.gap is not None


def test_schemas_are_current():
    for name, text in schemas().items():
        assert (ROOT / "schemas" / name).read_text() == text, f"schemas/{name} is stale: run `hetcompile schema`"


def test_kv_is_minimum_over_stages_and_partition_balances_it():
    _, _, arch = catalog.lookup_model("llama-3-70b")
    gpu = catalog.lookup_gpu("L40S")
    e = analytic.perf_entry("llama-3-70b", arch, 2, gpu, 2, 0.92, 4096)
    part = analytic.balanced_partition(e, arch.layers, 2, 4096)
    assert part is not None and sum(part) == arch.layers
    kvs = [analytic.stage_kv_tokens(e, k, i == 0, i == 1) for i, k in enumerate(part)]
    even = [analytic.stage_kv_tokens(e, arch.layers // 2, i == 0, i == 1) for i in range(2)]
    assert min(kvs) >= min(even)


def test_more_memory_more_concurrency_and_decode_is_memory_bound():
    _, _, arch = catalog.lookup_model("llama-3.1-8b")
    small, big = catalog.lookup_gpu("L4"), catalog.lookup_gpu("A100-80GB")
    est = []
    for g in (small, big):
        e = analytic.perf_entry("m", arch, 2, g, 1, 0.92, 4096)
        kv = analytic.stage_kv_tokens(e, arch.layers, True, True)
        est.append(chain_capacity(analytic.replica_model(arch, 2, [(g, 1, arch.layers, kv)], 0.0, 1e9, 256), 500, 200))
    assert est[1].concurrency > est[0].concurrency
    assert est[1].requests_per_s > est[0].requests_per_s
    # decode of one sequence reads all weights: time >= weights / bandwidth
    rm = analytic.replica_model(arch, 2, [(small, 1, arch.layers, 1e6)], 0.0, 1e9, 256)
    t = sum(rm.stage_times(1.0, 500.0, 500.0, 1.0))
    assert t >= arch.layers * 2 * analytic.layer_params(arch) / small.mem_bw


def test_replan_reruns_the_earlier_passes_on_the_pipelines_input_quietly():
    """The manager's `ctx.replan(update)`: the passes before the caller, on the pipeline's input with
    `update` applied, logging nothing; the caller gets their IR (what verify's rounds rely on)."""
    from hetcompile.ir.lower import load_problem
    from hetcompile.opt.solve import SolverOptions
    from hetcompile.passes.base import Pass, PassContext, run_pipeline

    seen: list[tuple] = []

    class Upstream(Pass):
        name = "upstream"

        def run(self, ir, ctx):
            seen.append(ir.tail_factors)
            ctx.log("upstream ran")
            return ir

    class Checker(Pass):
        name = "checker"

        def run(self, ir, ctx):
            again = ctx.replan({"tail_factors": (("chat", 0.5),)})
            assert again.tail_factors == (("chat", 0.5),) and [r.name for r in again.reports] == ["upstream"]
            return again

    ir, _, _ = load_problem(QUICKSTART)
    logged: list[str] = []
    res = run_pipeline(ir, (Upstream(), Checker()), PassContext(solver=SolverOptions(), log=logged.append))
    assert seen == [(), (("chat", 0.5),)]
    assert logged.count("upstream ran") == 1  # the replan's passes log nothing
    assert [r.name for r in res.ir.reports] == ["upstream", "checker"]


def test_profile_scales_its_remembered_shapes_exactly_as_computing_them_with_the_factors():
    """verify's replans change only tail factors; profile reuses its shapes at factor 1 and scales
    them. The result must be the very floats a fresh computation with the factors gives."""
    from hetcompile.ir.lower import load_problem
    from hetcompile.opt.solve import SolverOptions
    from hetcompile.passes.base import PassContext
    from hetcompile.passes.profile import Profile, enumerate_shapes, perf_table

    ir, _, _ = load_problem(ROOT / "examples/chat-rag/spec.yaml")
    ctx = PassContext(solver=SolverOptions())
    Profile().run(ir, ctx)  # remembered at factor 1
    for factors in ((("chat", 0.71),), (("chat", 0.5), ("rag", 0.875))):
        scaled = ir.model_copy(update={"tail_factors": factors})
        assert Profile().run(scaled, ctx).shapes == enumerate_shapes(scaled, perf_table(scaled))
    assert Profile().run(ir, ctx).shapes != Profile().run(scaled, ctx).shapes
