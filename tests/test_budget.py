"""A plan's cost is a promise: what plan.json says it costs is what compose priced, and within budget.

Owned capacity is counted in GPUs everywhere (compose's e_o, the materialized nodes' `owned_gpus`,
idle owned nodes): a 1-GPU replica on an owned 2-GPU node is free, both slices of it. Random
specs mix node sizes, owned nodes, tiny and large prices and every objective; each build's
$/h (sum over nodes) must equal compose's cost of its replica counts and stay within budget.
"""

from __future__ import annotations

import json
import random

import pytest

from hetcompile.backends.emit import artifacts
from hetcompile.driver import compile_spec
from hetcompile.passes.compose import tables
from hetcompile.passes.compose_model import solution_cost


def write_spec(path, offers: list[dict], budget: float | None, objective: str, rate: float = 4.0) -> None:
    lines = [
        "name: budget-case",
        "models: [{name: llama-3.1-8b, max_model_len: 4096}]",
        "workloads:",
        f"  - {{name: chat, model: llama-3.1-8b, input_tokens: 700, output_tokens: 200, rate: {rate}/s}}",
        "  - {name: rag, model: llama-3.1-8b, input_tokens: 2500, output_tokens: 150, rate: 1/s}",
        "regions:",
        "  - name: r1",
        "    cloud: kubernetes",
        "    offers:",
    ]
    for o in offers:
        lines.append("      - {" + ", ".join(f"{k}: {v}" for k, v in o.items()) + "}")
    if budget is not None:
        lines.append(f"budget: ${budget}/h")
    lines.append(f"objective: {objective}")
    lines.append("solver: {time_limit: 60s, mip_gap: 0.0001%}")
    path.write_text("\n".join(lines) + "\n")


def check(path) -> dict:
    res = compile_spec(path, verify=False)  # what compose priced; verification's replans have their own tests
    ir = res.ir
    plan = json.loads(artifacts(ir)["plan.json"])
    price = sum(n["price_per_hour"] for n in plan["nodes"])
    t = tables(ir)
    compose_cost = solution_cost(dict(ir.composition.counts), t) * 3600
    assert price == pytest.approx(compose_cost, rel=1e-5, abs=1e-9), "plan.json prices what compose did not"
    assert plan["totals"]["price_per_hour"] == pytest.approx(price, rel=1e-5, abs=1e-9)
    if plan["totals"]["budget_per_hour"] is not None:
        assert price <= plan["totals"]["budget_per_hour"] * (1 + 1e-9)
    for n in plan["nodes"]:
        assert 0 <= n["owned_gpus"] <= n["gpus"]
        assert n["owned"] == (n["owned_gpus"] == n["gpus"])
    return plan


def test_one_gpu_slices_of_an_owned_two_gpu_node_are_all_free(tmp_path):
    """The issue's case: an owned 2-GPU node split into two 1-GPU replicas used to bill the second."""
    spec = tmp_path / "spec.yaml"
    write_spec(spec, [{"gpu": "L4", "gpus_per_node": 2, "max_nodes": 1, "owned": 1, "price": "$0.85/h"}], None,
               "max-throughput")
    plan = check(spec)
    assert plan["totals"]["price_per_hour"] == 0
    assert all(n["owned"] for n in plan["nodes"])
    assert sum(n["gpus"] for n in plan["nodes"]) <= 2


def test_owned_gpus_are_used_before_rented_ones(tmp_path):
    spec = tmp_path / "spec.yaml"
    write_spec(spec, [{"gpu": "L4", "gpus_per_node": 4, "max_nodes": 3, "owned": 1, "price": "$0.85/h"}], 3.0,
               "max-throughput")
    plan = check(spec)
    owned = sum(n["owned_gpus"] for n in plan["nodes"])
    used = sum(n["gpus"] for n in plan["nodes"])
    assert owned == min(4, used)
    assert plan["totals"]["price_per_hour"] == pytest.approx(0.85 * (used - owned))


@pytest.mark.parametrize("seed", range(8))
def test_random_specs_cost_what_compose_priced(tmp_path, seed):
    rng = random.Random(seed)
    gpus = rng.sample(["L4", "A10G", "A100", "T4", "L40S"], 2)
    offers = []
    for g in gpus:
        per_node = rng.choice([1, 2, 4, 8])
        max_nodes = rng.randint(1, 4)
        owned = rng.choice([0, 0, 1, max_nodes])
        price = rng.choice([0.001, 0.85, 1.01, 3.67])
        offers.append({"gpu": g, "gpus_per_node": per_node, "max_nodes": max_nodes, "owned": owned, "price": f"${price}/h"})
    objective = rng.choice(["max-throughput", "min-cost", "max-throughput-per-dollar"])
    budget = rng.choice([None, 2.0, 6.0, 20.0]) if objective != "min-cost" else None
    spec = tmp_path / "spec.yaml"
    write_spec(spec, offers, budget, objective, rate=rng.choice([0.5, 2.0, 4.0]))
    try:
        check(spec)
    except Exception as exc:  # an infeasible random spec is fine; it must say so as a user error
        from hetcompile.errors import HetcompileError

        assert isinstance(exc, HetcompileError), repr(exc)
