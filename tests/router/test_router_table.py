"""Loading and compiling the routing table; state carried across reloads."""

from __future__ import annotations

import json

import pytest

from hetcompile.plan.routing import RoutingTable
from hetcompile.router.table import RouterError, compile_table, load_table

from .util import klass, replica, table


def rt(d: dict) -> RoutingTable:
    return RoutingTable.model_validate(d)


def test_policy_precedence_flag_class_table():
    d = table(
        [replica("a", "http://127.0.0.1:1"), replica("b", "http://127.0.0.1:2")],
        models={"tiny": [klass("long", {"a": 1.0}, policy="min-max"), klass("rest", {"a": 0.5, "b": 0.5})]},
        policy="kv-aware",
    )
    t = compile_table(rt(d))
    assert [c.policy for c in t.models["tiny"].classes] == ["min-max", "kv-aware"]
    t = compile_table(rt(d), policy_override="round-robin")
    assert [c.policy for c in t.models["tiny"].classes] == ["round-robin", "round-robin"]


def test_candidates_exclude_zero_weight_and_null_endpoints_are_unroutable():
    d = table(
        [replica("a", "http://127.0.0.1:1"), replica("b", None), replica("c", "http://127.0.0.1:3")],
        models={"tiny": [klass("x", {"a": 0.5, "b": 0.5, "c": 0.0})]},
    )
    t = compile_table(rt(d))
    picker = t.models["tiny"].classes[0].picker
    assert [r.id for r in picker.replicas] == ["a", "b"]
    assert t.replicas["a"].routable and not t.replicas["b"].routable
    assert {picker.choose(1, 1, 1, None)[0].id for _ in range(10)} == {"a"}


def test_classes_of_one_weight_vector_share_one_sequence():
    # 300 classes of a few requests each, weights 0.32 x 3 and 0.04: alone, each class's first picks
    # would give the small replica one request in ten (smooth WRR is exact only over its own window)
    weights = {"a": 0.32, "b": 0.32, "c": 0.32, "d": 0.04}
    d = table([replica(r, f"http://127.0.0.1:{i + 1}") for i, r in enumerate(weights)],
              models={"tiny": [klass(f"c{k:03d}", weights) for k in range(300)] + [klass("other", {"a": 0.5, "b": 0.5})]})
    classes = compile_table(rt(d)).models["tiny"].classes
    assert len({id(c.picker) for c in classes[:300]}) == 1 and classes[300].picker is not classes[0].picker
    picks = [c.picker.choose(1, 1, 1, None)[0].id for _ in range(3) for c in classes[:300]]
    assert picks.count("d") / len(picks) == pytest.approx(0.04, abs=0.005)


def test_class_without_positive_weight_spreads_over_the_model():
    d = table(
        [replica("a", "http://127.0.0.1:1"), replica("b", "http://127.0.0.1:2")],
        models={"tiny": [klass("x", {"a": 0.0})]},
    )
    picker = compile_table(rt(d)).models["tiny"].classes[0].picker
    assert [r.id for r in picker.replicas] == ["a", "b"]


def test_reload_keeps_state_of_unchanged_replicas_only():
    d1 = table([replica("a", "http://127.0.0.1:1"), replica("b", "http://127.0.0.1:2"), replica("c", None)])
    t1 = compile_table(rt(d1))
    t1.replicas["a"].acquire(10, 1)
    d2 = table([replica("a", "http://127.0.0.1:1", kv_capacity_tokens=5), replica("b", "http://127.0.0.1:9"), replica("c", "http://127.0.0.1:3")])
    t2 = compile_table(rt(d2), t1.replicas)
    assert t2.replicas["a"] is t1.replicas["a"]  # same endpoint: same counters
    assert t2.replicas["a"].inflight == 1 and t2.replicas["a"].kv_capacity == 5  # static fields updated
    assert t2.replicas["b"] is not t1.replicas["b"]  # moved: a new replica
    assert t2.replicas["c"].routable  # endpoint filled in by deploy.sh


def test_models_listing_and_single_model_default():
    d = table(
        [replica("a", "http://127.0.0.1:1"), replica("b", "http://127.0.0.1:2", model="big")],
        models={"tiny": [klass("x", {"a": 1.0})], "big": [klass("y", {"b": 1.0})]},
    )
    t = compile_table(rt(d))
    assert [m["id"] for m in json.loads(t.models_json)["data"]] == ["big", "tiny"]
    assert t.only_model is None
    assert compile_table(rt(table([replica("a", "http://127.0.0.1:1")]))).only_model == "tiny"


def test_api_key_env_goes_into_upstream_headers(monkeypatch):
    monkeypatch.setenv("HC_TEST_KEY", "s3cret")
    d = table([replica("a", "http://10.0.0.1:8000/base/", api_key_env="HC_TEST_KEY")])
    r = compile_table(rt(d)).replicas["a"]
    assert r.headers["Authorization"] == "Bearer s3cret"
    assert b"Authorization: Bearer s3cret\r\n" in r.head_static
    assert b"Host: 10.0.0.1:8000\r\n" in r.head_static
    assert r.conn_key == ("10.0.0.1", 8000, False) and r.base_path == b"/base"


def test_bad_endpoint_is_not_routable():
    r = compile_table(rt(table([replica("a", "ftp://x")]))).replicas["a"]
    assert not r.routable


def test_load_table_errors(tmp_path):
    with pytest.raises(RouterError, match="cannot read"):
        load_table(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"plan": "p", "models": [], "replicas": [], "policy": "fastest"}')
    with pytest.raises(RouterError, match="invalid routing table"):
        load_table(bad)
