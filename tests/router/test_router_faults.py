"""Transport faults are upstream failures: under a resetting backend and a backend whose /health is
fine but whose completions hang, concurrent non-streamed requests all succeed, and the hung
replica is ejected by live traffic and kept out for a back-off whatever its probes say."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from hetcompile.router.state import PASSIVE_BACKOFF_MIN

from .fake_vllm import FakeVllm
from .test_router_failover import fire
from .util import replica, running_router, table, write_table

N = 60


async def test_reset_backend_loses_no_request_under_concurrency(tmp_path):
    async with FakeVllm("a", reset_on_request=True) as a, FakeVllm("b") as b:
        t = table([replica("a", a.url), replica("b", b.url)])
        async with running_router(write_table(tmp_path / "routing.json", t)) as r:
            res = await fire(r.url, N, concurrency=N)
            assert [s for s, _ in res] == [200] * N
            assert Counter(rep for _, rep in res) == {"b": N}
            assert len(a.records) >= 1  # a really was tried and reset
            assert not r.table.replicas["a"].healthy  # ejected by the resets, /health notwithstanding


async def test_hanging_backend_with_healthy_probe_is_ejected_and_kept_out(tmp_path):
    async with FakeVllm("a", hang=True) as a, FakeVllm("b") as b:
        t = table([replica("a", a.url), replica("b", b.url)])
        async with running_router(write_table(tmp_path / "routing.json", t), read_timeout=0.3) as r:
            res = await fire(r.url, N, concurrency=N)
            assert [s for s, _ in res] == [200] * N
            assert Counter(rep for _, rep in res) == {"b": N}
            st = r.table.replicas["a"]
            assert not st.healthy and st.passive_until > time.monotonic()
            # /health of a keeps answering 200 every 50 ms: still out during the back-off
            await asyncio.sleep(0.5)
            assert not st.healthy
            # a second wave goes straight to b: no request waits for a's read timeout again. The wave
            # must fall inside the back-off: on a busy machine (a CI run beside the other test
            # worker) the first wave and this one took longer than its 5 s, and a was readmitted
            # mid-wave as it should be; so the back-off is stretched for this wave
            st.passive_until = time.monotonic() + 60.0
            before = len(a.records)
            res = await fire(r.url, N, concurrency=N)
            assert [s for s, _ in res] == [200] * N and len(a.records) == before


def test_probe_readmits_after_the_backoff(tmp_path):
    from hetcompile.router.state import ReplicaState

    st = ReplicaState.__new__(ReplicaState)
    st.healthy, st.fails, st.oks, st.endpoint, st.id = True, 0, 0, "http://127.0.0.1:1", "a"
    st.passive_until, st.passive_backoff, st.passive_fails = 0.0, PASSIVE_BACKOFF_MIN, 0
    st.passive_failure(2)
    assert st.healthy
    st.passive_failure(2)
    assert not st.healthy and st.passive_backoff == 2 * PASSIVE_BACKOFF_MIN
    for _ in range(5):
        st.observe_health(True, 2, 2)
    assert not st.healthy  # inside the back-off
    st.passive_until = time.monotonic() - 1  # the back-off elapsed
    st.observe_health(True, 2, 2)
    st.observe_health(True, 2, 2)
    assert st.healthy
