"""Replay an arrival trace against a real server: the measured side of the simulator check.

The same JSONL trace `hetcompile simulate --arrivals` reads ({"t", "workload", "input_tokens",
"output_tokens"} a line) is sent open-loop (each request at its `t`, whatever the server's state)
as streaming completions with token-id prompts and exact output lengths (profiling/sweep.py), and
the per-request arrival, first-token and finish times come back, measured as the simulator reports
them. Used by tests/engine/test_profile_simulate.py and bench/simulate_vs_vllm.py.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from hetcompile.profiling.sweep import SweepConfig, client_session, one_request, served_model
from hetcompile.simulate.run import Arrival


@dataclass(frozen=True)
class Measured:
    workload: str
    arrival: float
    first_token: float
    finish: float
    output_tokens: int


async def _replay(base: str, arrivals: list[Arrival], timeout_s: float) -> list[Measured]:
    base = base.rstrip("/")
    async with client_session(timeout_s) as session:
        model = await served_model(session, base)
        t0 = time.perf_counter()

        async def send(a: Arrival) -> Measured:
            delay = t0 + a.t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            cfg = SweepConfig(output_tokens=a.output_tokens, timeout_s=timeout_s)
            s = await one_request(session, base, model, a.input_tokens, 0, cfg)
            first = s.start + s.ttft_s
            return Measured(a.workload, s.start - t0, first - t0, s.end - t0, s.completion_tokens)

        return list(await asyncio.gather(*(send(a) for a in arrivals)))


def replay(base: str, arrivals: list[Arrival], timeout_s: float = 600.0) -> list[Measured]:
    return asyncio.run(_replay(base, arrivals, timeout_s))


def throughput(results: list[Measured], warmup: float, duration: float) -> float:
    """Completions per second inside [warmup, duration] (simulate/run.py's definition)."""
    return sum(1 for m in results if warmup <= m.finish <= duration) / (duration - warmup)
