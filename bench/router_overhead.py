"""Router overhead on loopback: direct-to-backend vs through the router, in the same run.

    python bench/router_overhead.py [--quick] [--no-pin] [--router-arg=--no-uvloop]

Three processes: a minimal HTTP/1.1 backend (raw asyncio protocol, three ports = three
replicas, fixed vLLM-shaped completion bodies), the router (`python -m hetcompile.router`, its
real CLI and defaults) and this load generator (raw asyncio protocol client over keep-alive
connections). With two or more CPUs the router gets CPU 0 to itself and the backend and the
generator share CPU 1 (`--no-pin` disables pinning).

Measured, each phase bounded in count and time:
  1. added latency at 500 and 2,000 req/s (open loop, fixed schedule, one request per tick):
     p50/p99 through the router minus p50/p99 direct.  Target: p99 <= 2 ms added at 2,000 req/s.
  2. max non-streaming throughput (closed loop, 64 connections).      Target: >= 5,000 req/s.
  3. weight fidelity: 10,000 requests over weights 0.5/0.3/0.2.       Target: within +-2 %.
Everything binds 127.0.0.1; every process it starts is stopped by its pid.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WEIGHTS = {"r0": 0.5, "r1": 0.3, "r2": 0.2}

try:
    import uvloop
except ImportError:  # optional
    uvloop = None


def _run(coro):
    if uvloop is not None:
        return uvloop.run(coro)
    return asyncio.run(coro)


def _content_length(head: bytes) -> int:
    i = head.lower().find(b"content-length:")
    if i < 0:
        return 0
    j = head.find(b"\r\n", i)
    return int(head[i + 15 : j if j >= 0 else len(head)])


# -- backend ------------------------------------------------------------------------------------

COMPLETION = json.dumps(
    {
        "id": "cmpl-bench",
        "object": "text_completion",
        "created": 0,
        "model": "tiny",
        "choices": [{"index": 0, "text": " w0 w1 w2 w3 w4 w5 w6 w7", "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 16, "total_tokens": 24, "completion_tokens": 8},
    }
).encode()
METRICS = (
    b'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0\n'
    b'vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0\n'
    b'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.0\n'
)


def _http_response(body: bytes, ctype: bytes, name: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: " + ctype + b"\r\nX-Backend: " + name
        + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )  # fmt: skip


class BackendProtocol(asyncio.Protocol):
    def __init__(self, name: bytes):
        self.buf = bytearray()
        self.completion = _http_response(COMPLETION, b"application/json", name)
        self.metrics = _http_response(METRICS, b"text/plain", name)
        self.health = _http_response(b"", b"text/plain", name)

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        buf = self.buf
        buf += data
        while True:
            i = buf.find(b"\r\n\r\n")
            if i < 0:
                return
            head = bytes(buf[:i])
            n = i + 4 + _content_length(head)
            if len(buf) < n:
                return
            del buf[:n]
            path = head.split(b" ", 2)[1]
            if path.startswith(b"/v1/"):
                self.transport.write(self.completion)
            elif path == b"/metrics":
                self.transport.write(self.metrics)
            else:
                self.transport.write(self.health)


async def backend_main(n: int) -> None:
    loop = asyncio.get_running_loop()
    ports = []
    for i in range(n):
        name = f"r{i}".encode()
        srv = await loop.create_server(lambda name=name: BackendProtocol(name), "127.0.0.1", 0, backlog=4096)
        ports.append(srv.sockets[0].getsockname()[1])
    print("PORTS " + " ".join(map(str, ports)), flush=True)
    await asyncio.Event().wait()


# -- load generator ---------------------------------------------------------------------------


class ClientProtocol(asyncio.Protocol):
    def __init__(self):
        self.buf = bytearray()
        self.waiter: asyncio.Future | None = None
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data):
        self.buf += data
        w = self.waiter
        if w is None:
            return
        buf = self.buf
        i = buf.find(b"\r\n\r\n")
        if i < 0:
            return
        head = bytes(buf[:i])
        n = i + 4 + _content_length(head)
        if len(buf) < n:
            return
        del buf[:n]
        self.waiter = None
        w.set_result(head)

    def connection_lost(self, exc):
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"connection lost: {exc}"))

    def request(self, data: bytes) -> asyncio.Future:
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self.waiter


def make_request(port: int, prompt_chars: int = 64) -> bytes:
    body = json.dumps({"model": "tiny", "prompt": "x" * prompt_chars, "max_tokens": 8}).encode()
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


class Pool:
    def __init__(self, port: int):
        self.port = port
        self.idle: list[ClientProtocol] = []
        self.opened = 0

    async def get(self) -> ClientProtocol:
        while self.idle:
            c = self.idle.pop()
            if not c.transport.is_closing():
                return c
        loop = asyncio.get_running_loop()
        _, c = await loop.create_connection(ClientProtocol, "127.0.0.1", self.port)
        self.opened += 1
        return c

    def put(self, c: ClientProtocol) -> None:
        self.idle.append(c)

    def close(self) -> None:
        for c in self.idle:
            c.transport.close()
        self.idle.clear()


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100.0 * len(s)))]


async def open_loop(port: int, rate: float, count: int, time_cap: float) -> dict:
    """Send `count` requests at `rate`/s on a fixed schedule; latency = send to full response."""
    pool = Pool(port)
    data = make_request(port)
    lat: list[float] = []
    late: list[float] = []
    errors = 0
    pending: set[asyncio.Task] = set()

    async def one(c: ClientProtocol):
        nonlocal errors
        t = time.perf_counter()
        try:
            head = await c.request(data)
        except ConnectionError:
            errors += 1
            return
        lat.append(time.perf_counter() - t)
        if head[9:12] != b"200":
            errors += 1
        pool.put(c)

    # pre-open enough connections so connection setup is not measured
    warm = [await pool.get() for _ in range(max(4, int(rate * 0.01) + 4))]
    for c in warm:
        pool.put(c)
    # perf_counter, not loop.time(): uvloop's clock has millisecond resolution
    clock = time.perf_counter
    t0 = clock() + 0.05
    for i in range(count):
        due = t0 + i / rate
        now = clock()
        if now > t0 + time_cap:
            break
        if due > now:
            await asyncio.sleep(due - now)
        late.append(max(0.0, clock() - due))
        c = await pool.get()
        task = asyncio.ensure_future(one(c))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.wait(pending, timeout=10)
    pool.close()
    return {"n": len(lat), "errors": errors, "p50": pct(lat, 50), "p99": pct(lat, 99), "late_p99": pct(late, 99), "conns": pool.opened}


async def closed_loop(port: int, conns: int, count: int, time_cap: float, count_header: bytes | None = None) -> dict:
    """`conns` connections each send the next request when the previous answer arrives."""
    data = make_request(port)
    done = 0
    errors = 0
    counts: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    t_end = loop.time() + time_cap
    key = count_header.lower() + b": " if count_header else None

    async def worker():
        nonlocal done, errors
        _, c = await loop.create_connection(ClientProtocol, "127.0.0.1", port)
        try:
            while done < count and loop.time() < t_end:
                done += 1
                head = await c.request(data)
                if head[9:12] != b"200":
                    errors += 1
                if key is not None:
                    h = head.lower()
                    i = h.find(key)
                    if i >= 0:
                        v = head[i + len(key) : head.find(b"\r\n", i)].decode()
                        counts[v] = counts.get(v, 0) + 1
        finally:
            c.transport.close()

    t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conns)))
    dt = time.perf_counter() - t
    return {"n": done, "errors": errors, "seconds": dt, "rps": done / dt, "counts": counts}


# -- orchestration ----------------------------------------------------------------------------


def _pin(pid: int, cpus: set[int]) -> None:
    try:
        os.sched_setaffinity(pid, cpus)
    except (AttributeError, OSError):
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(port: int, path: str, timeout: float = 30.0) -> None:
    end = time.time() + timeout
    while time.time() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"nothing healthy on port {port}")


def _table(ports: list[int]) -> dict:
    reps = [
        {
            "id": f"r{i}",
            "model": "tiny",
            "endpoint": f"http://127.0.0.1:{p}",
            "kv_capacity_tokens": 1_000_000,
            "max_num_seqs": 256,
            "prefill_tokens_per_s": 10_000.0,
            "decode_tokens_per_s": 1_000.0,
        }
        for i, p in enumerate(ports)
    ]
    cls = {
        "name": "default",
        "match": {},
        "input_tokens": 16.0,
        "output_tokens": 8.0,
        "weights": [{"replica": k, "weight": v} for k, v in sorted(WEIGHTS.items())],
    }
    return {"version": 1, "plan": "bench", "policy": "weighted", "models": [{"name": "tiny", "classes": [cls]}], "replicas": reps}


async def measure(args, direct_port: int, router_port: int) -> dict:
    res: dict = {}
    n_warm = 500 if args.quick else 3000
    await closed_loop(direct_port, 16, n_warm, 10)
    await closed_loop(router_port, 16, n_warm, 10)
    dur = 1.0 if args.quick else 4.0
    for rate in (500, 2000):
        count = int(rate * dur)
        d = await open_loop(direct_port, rate, count, dur * 2)
        r = await open_loop(router_port, rate, count, dur * 2)
        res[f"latency_{rate}"] = {"direct": d, "router": r}
    n_max = 5000 if args.quick else 30000
    res["max_direct"] = await closed_loop(direct_port, 64, n_max, 15)
    res["max_router"] = await closed_loop(router_port, 64, n_max, 15)
    n_w = 10000
    res["weights"] = await closed_loop(router_port, 32, n_w, 30, count_header=b"X-Hetcompile-Replica")
    return res


def report(res: dict, env: str) -> str:
    ms = 1000.0
    lines = [f"router overhead on loopback ({env})", ""]
    lines.append("rate      direct p50/p99 ms   router p50/p99 ms   added p50/p99 ms   n direct/router  late p99 ms")
    for rate in (500, 2000):
        d, r = res[f"latency_{rate}"]["direct"], res[f"latency_{rate}"]["router"]
        lines.append(
            f"{rate:>5}/s   {d['p50'] * ms:6.3f} / {d['p99'] * ms:6.3f}     {r['p50'] * ms:6.3f} / {r['p99'] * ms:6.3f}     "
            f"{(r['p50'] - d['p50']) * ms:6.3f} / {(r['p99'] - d['p99']) * ms:6.3f}    {d['n']}/{r['n']}"
            f"   {r['late_p99'] * ms:.3f}"
            + (f"  ERRORS {d['errors']}/{r['errors']}" if d["errors"] or r["errors"] else "")
        )
    md, mr = res["max_direct"], res["max_router"]
    lines.append("")
    lines.append(f"max throughput (64 conns): direct {md['rps']:,.0f} req/s, through router {mr['rps']:,.0f} req/s "
                 f"({mr['n']} requests, {mr['errors']} errors)")  # fmt: skip
    w = res["weights"]
    total = sum(w["counts"].values())
    lines.append("")
    lines.append(f"weight fidelity over {total} requests ({w['errors']} errors):")
    worst = 0.0
    for k, target in sorted(WEIGHTS.items()):
        share = w["counts"].get(k, 0) / max(total, 1)
        rel = (share - target) / target * 100
        worst = max(worst, abs(rel))
        lines.append(f"  {k}: target {target:.3f}  got {share:.4f}  ({rel:+.2f} % relative, {(share - target) * 100:+.2f} pts)")
    added99 = (res["latency_2000"]["router"]["p99"] - res["latency_2000"]["direct"]["p99"]) * ms
    lines.append("")
    lines.append("targets: " + ", ".join([
        f"p99 added at 2000/s {added99:.3f} ms {'OK' if added99 <= 2 else 'MISSED'} (<= 2)",
        f"max {mr['rps']:,.0f} req/s {'OK' if mr['rps'] >= 5000 else 'MISSED'} (>= 5000)",
        f"weights worst {worst:.2f} % {'OK' if worst <= 2 else 'MISSED'} (<= 2)",
    ]))  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short phases (a smoke run, numbers are noisy)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    ap.add_argument("--router-arg", action="append", default=[], help="extra argument for the router CLI")
    ap.add_argument("--json", action="store_true", help="print the raw results as JSON too")
    ap.add_argument("--_backend", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._backend:
        _run(backend_main(args._backend))
        return 0

    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    pin = not args.no_pin and ncpu >= 2
    cpus = sorted(os.sched_getaffinity(0)) if pin else []
    procs: list[subprocess.Popen] = []
    tmp = tempfile.TemporaryDirectory(prefix="hetcompile-bench-")
    try:
        be = subprocess.Popen([sys.executable, __file__, f"--_backend={len(WEIGHTS)}"], stdout=subprocess.PIPE, text=True)
        procs.append(be)
        line = be.stdout.readline()
        if not line.startswith("PORTS"):
            raise RuntimeError("backend did not start")
        ports = [int(p) for p in line.split()[1:]]
        table = Path(tmp.name) / "routing.json"
        table.write_text(json.dumps(_table(ports)))
        rport = _free_port()
        router = subprocess.Popen(
            [sys.executable, "-m", "hetcompile.router", "--table", str(table), "--port", str(rport),
             "--log-level", "WARNING", *args.router_arg],
            cwd=ROOT,
        )  # fmt: skip
        procs.append(router)
        if pin:
            _pin(router.pid, {cpus[0]})
            _pin(be.pid, {cpus[1]})
            _pin(os.getpid(), {cpus[1]})
        _wait_http(rport, "/health")
        res = _run(measure(args, ports[0], rport))
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        tmp.cleanup()
    env = f"{ncpu} CPUs, {'pinned: router on CPU %d, backend + generator on CPU %d' % (cpus[0], cpus[1]) if pin else 'not pinned'}, " \
          f"loop {'uvloop' if uvloop is not None else 'asyncio'} in the generator, router args {args.router_arg or 'default'}"  # fmt: skip
    print(report(res, env))
    if args.json:
        print(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
