"""Policy math and pickers, without I/O."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from hetcompile.plan.routing import RoutedReplica
from hetcompile.router.state import corrected_kv_usage
from hetcompile.router.policies import (
    KvAwarePicker,
    LeastOutstandingPicker,
    MinMaxPicker,
    RoundRobinPicker,
    SmoothWRR,
    WeightedPicker,
    kv_masked,
    make_picker,
    minmax_choose,
    processing_time,
    workload,
)
from hetcompile.router.state import ReplicaState, health_transition


def rep(id: str, cap: int = 1000, prefill: float = 1000.0, decode: float = 100.0, endpoint: str | None = "http://127.0.0.1:9") -> ReplicaState:
    return ReplicaState(
        RoutedReplica(
            id=id,
            model="m",
            endpoint=endpoint,
            kv_capacity_tokens=cap,
            max_num_seqs=8,
            prefill_tokens_per_s=prefill,
            decode_tokens_per_s=decode,
        )
    )


# -- smooth weighted round robin ------------------------------------------------------------------


def test_swrr_exact_counts_per_window():
    w = SmoothWRR([5, 1, 1])
    seq = [w.pick(range(3)) for _ in range(70)]
    for k in range(10):
        window = seq[7 * k : 7 * k + 7]
        assert [window.count(i) for i in range(3)] == [5, 1, 1]


def test_swrr_is_interleaved_not_bursty():
    # nginx's classic example: {a:5, b:1, c:1} -> a a b a c a a, never b and c adjacent
    w = SmoothWRR([5, 1, 1])
    assert [w.pick(range(3)) for _ in range(7)] == [0, 0, 1, 0, 2, 0, 0]
    w = SmoothWRR([1, 1])
    assert [w.pick(range(2)) for _ in range(6)] == [0, 1, 0, 1, 0, 1]


@pytest.mark.parametrize("weights", [[0.5, 0.3, 0.2], [0.7, 0.1, 0.1, 0.1], [0.123, 0.456, 0.421], [0.99, 0.01]])
def test_swrr_fidelity_float_weights(weights):
    w = SmoothWRR(weights)
    n = 10_000
    counts = [0] * len(weights)
    for _ in range(n):
        counts[w.pick(range(len(weights)))] += 1
    for c, wt in zip(counts, weights):
        # smooth WRR is exact up to rounding: at most one pick away from n * share
        assert abs(c - n * wt / sum(weights)) <= 1.0


def test_swrr_max_gap_bounded():
    # a replica with share p is picked at least once in every ceil(1/p)+1 consecutive picks
    w = SmoothWRR([0.6, 0.3, 0.1])
    seq = [w.pick(range(3)) for _ in range(1000)]
    for i, share in enumerate([0.6, 0.3, 0.1]):
        pos = [k for k, x in enumerate(seq) if x == i]
        assert max(b - a for a, b in zip(pos, pos[1:])) <= math.ceil(1 / share) + 1


def test_swrr_masked_candidate_keeps_its_place_and_rest_share():
    w = SmoothWRR([2, 1, 1])
    seq = [w.pick([1, 2]) for _ in range(100)]  # 0 masked: the rest split evenly
    assert seq.count(1) == seq.count(2) == 50
    assert w.pick([]) is None


# -- KV estimation and masking (Helix 5.2) ---------------------------------------------------------


def test_corrected_kv_usage():
    assert corrected_kv_usage(500, 1000, None, 0) == 0.5
    # vLLM sees more than we sent (other clients, longer outputs): the observation wins
    assert corrected_kv_usage(100, 1000, 0.8, 100) == pytest.approx(0.8)
    # ... aged by what we sent since the poll
    assert corrected_kv_usage(300, 1000, 0.8, 100) == pytest.approx(1.0)
    # ... and by what finished since
    assert corrected_kv_usage(0, 1000, 0.8, 500) == pytest.approx(0.3)
    # vLLM sees less than our reservation (outputs not generated yet): the estimate wins
    assert corrected_kv_usage(900, 1000, 0.1, 900) == pytest.approx(0.9)


def test_kv_masked():
    assert not kv_masked(0.5, 400, 1000, 1.0, False)
    assert kv_masked(0.5, 600, 1000, 1.0, False)
    assert kv_masked(0.0, 10, 1000, 1.0, True)
    assert kv_masked(0.85, 100, 1000, 0.9, False)


def test_kv_aware_picker_masks_full_replica_and_overflows_to_least_used():
    a, b = rep("a", cap=1000), rep("b", cap=1000)
    p = KvAwarePicker([a, b], [0.5, 0.5], high_water=1.0)
    a.acquire(900, 0)  # a nearly full
    picks = []
    for _ in range(4):
        r, _, overflow = p.choose(200, 100, 100, None)
        assert not overflow
        picks.append(r.id)
        r.acquire(200, 0)
    assert picks == ["b"] * 4  # b fills up to 800
    # both full now: the less used one (b at 0.8 < a at 0.9) still takes it, flagged
    r, _, overflow = p.choose(300, 100, 200, None)
    assert (r.id, overflow) == ("b", True)


def test_kv_aware_picker_waiting_blocks_until_a_release():
    a, b = rep("a"), rep("b")
    p = KvAwarePicker([a, b], [0.9, 0.1])
    lease = a.acquire(10, 0)
    a.observe_metrics(kv=0.1, running=5, waiting=3)  # vLLM is queueing on a
    assert {p.choose(1, 1, 1, None)[0].id for _ in range(5)} == {"b"}
    lease.release()  # one of ours finished on a: it may take work again
    assert "a" in {p.choose(1, 1, 1, None)[0].id for _ in range(5)}


def test_kv_aware_uses_observed_usage():
    a, b = rep("a"), rep("b")
    p = KvAwarePicker([a, b], [0.5, 0.5])
    a.observe_metrics(kv=0.999, running=1, waiting=0)
    assert {p.choose(5, 1, 4, None)[0].id for _ in range(10)} == {"b"}


# -- min-max (seed 004 Alg. 2) ---------------------------------------------------------------------


def test_processing_time_and_workload():
    assert processing_time(1000, 100, 2000, 50) == pytest.approx(0.5 + 2.0)
    assert workload(2.0, 0.0, 2.0) == 2.0
    assert workload(2.0, 0.5, 2.0) == pytest.approx(2.0 * math.e)
    assert math.isfinite(workload(1.0, 1e9, 2.0))  # no overflow for absurd usage


def _minmax_naive(loads, costs):
    best, key = None, None
    for s in range(len(loads)):
        trial = list(loads)
        trial[s] += costs[s]
        k = (max(trial), loads[s] + costs[s], s)
        if key is None or k < key:
            best, key = s, k
    return best


def test_minmax_choose_matches_definition():
    rng = random.Random(7)
    for _ in range(2000):
        n = rng.randint(1, 6)
        loads = [rng.choice([0.0, 1.0, 2.0, rng.random() * 5]) for _ in range(n)]
        costs = [rng.choice([0.5, 1.0, rng.random() * 3]) for _ in range(n)]
        assert minmax_choose(loads, costs) == _minmax_naive(loads, costs)


def test_minmax_choose_examples():
    assert minmax_choose([0, 0], [1, 2]) == 0  # idle: the fastest
    assert minmax_choose([5, 0], [1, 2]) == 1  # a loaded: b keeps the max lowest
    assert minmax_choose([1, 1], [1, 1]) == 0  # tie: lower index
    with pytest.raises(ValueError):
        minmax_choose([], [])


def test_minmax_picker_balances_by_speed_and_releases():
    # KV far from full: T_r^s decides, and min-max splits work 4:1 like the speeds
    fast = rep("fast", cap=10**7, prefill=4000, decode=400)
    slow = rep("slow", cap=10**7, prefill=1000, decode=100)
    p = MinMaxPicker([fast, slow], [0.5, 0.5], theta=2.0)
    leases = []
    for _ in range(50):
        r, cost, _ = p.choose(100, 100, 50, None)
        assert cost > 0
        leases.append(r.acquire(100 + 50, cost))
    n_fast = sum(1 for l in leases if l.replica is fast)
    assert 38 <= n_fast <= 42
    for l in leases:
        l.release()
    assert fast.load == slow.load == 0 and fast.inflight == slow.inflight == 0  # Alg. 2 release hooks


def test_minmax_kv_term_shifts_load():
    a, b = rep("a", cap=1000), rep("b", cap=1000)
    p = MinMaxPicker([a, b], [0.5, 0.5], theta=2.0)
    a.observe_metrics(kv=0.95, running=1, waiting=0)  # same speed, a's KV nearly full
    assert p.choose(10, 10, 10, None)[0] is b


# -- baselines ---------------------------------------------------------------------------------


def test_round_robin_skips_unroutable_and_excluded():
    a, b, c = rep("a"), rep("b"), rep("c", endpoint=None)
    p = RoundRobinPicker([a, b, c], [1, 1, 1])
    assert [p.choose(1, 1, 1, None)[0].id for _ in range(4)] == ["a", "b", "a", "b"]
    assert p.choose(1, 1, 1, [a])[0] is b
    assert p.choose(1, 1, 1, [a, b]) is None
    for _ in range(3):
        a.observe_health(False, fall=3, rise=2)
    assert {p.choose(1, 1, 1, None)[0].id for _ in range(4)} == {"b"}
    for _ in range(3):
        b.observe_health(False, fall=3, rise=2)
    # panic mode: every deployed candidate ejected, all are tried again (never c: no endpoint)
    assert {p.choose(1, 1, 1, None)[0].id for _ in range(4)} == {"a", "b"}


def test_least_outstanding():
    a, b = rep("a"), rep("b")
    p = LeastOutstandingPicker([a, b], [0.9, 0.1])
    a.acquire(1, 0)
    a.acquire(1, 0)
    b.acquire(1, 0)
    assert p.choose(1, 1, 1, None)[0] is b
    b.acquire(1, 0)
    # tie: rotates rather than always picking the first
    assert {p.choose(1, 1, 1, None)[0].id for _ in range(4)} == {"a", "b"}


def test_weighted_picker_never_chooses_unhealthy_while_one_is_healthy():
    a, b = rep("a"), rep("b")
    p = WeightedPicker([a, b], [0.99, 0.01])
    for _ in range(3):
        a.observe_health(False, fall=3, rise=2)
    assert not a.routable
    assert {p.choose(1, 1, 1, None)[0].id for _ in range(20)} == {"b"}


def test_make_picker_names():
    for name in ("weighted", "kv-aware", "min-max", "round-robin", "least-outstanding"):
        assert make_picker(name, [rep("a")], [1.0], high_water=1.0, theta=2.0).name == name
    with pytest.raises(ValueError):
        make_picker("random", [rep("a")], [1.0], high_water=1.0, theta=2.0)


# -- health state machine -----------------------------------------------------------------------


def test_health_transition_fall_and_rise():
    h, f, o = True, 0, 0
    trace = []
    for ok in [False, False, True, False, False, False, True, True, False, True, True]:
        h, f, o = health_transition(h, f, o, ok, fall=3, rise=2)
        trace.append(h)
    #                  F     F     T     F     F     F      T      T     F     T      T
    assert trace == [True, True, True, True, True, False, False, True, True, True, True]


def test_lease_release_is_idempotent_and_zeroes_drift():
    a = rep("a")
    leases = [a.acquire(0.1, 0.1) for _ in range(10)]
    for l, _ in itertools.product(leases, range(2)):
        l.release()
    assert a.inflight == 0 and a.inflight_kv == 0.0 and a.load == 0.0
