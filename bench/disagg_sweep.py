"""Bench: aggregated vs prefill/decode-disaggregated serving, per dollar (issue 35).

    python bench/disagg_sweep.py [--model llama-3.1-8b] [--inputs 512,2048,8192,16384] [--output 256]
                                 [--tpot 20ms,35ms,60ms] [--ttft 2s] [--links 10,100,400] [--quick]

For every workload (prompt length x TPOT target, TTFT target and p99 fixed) on one region offering
H100, A100-80GB and L40S nodes (prices below, one cloud's on-demand list), it compares the best
requests/s per $/h of

  aggregated     one shape (GPU type, TP, PP) serving the workload alone, sized by the profile pass
                 for the SLO at p99 (perf/tail.py's tail_capacity within the 85% headroom): the
                 number compose reads for it;
  disaggregated  a prefill shape and a decode shape (any two of the offered types and TPs, one stage
                 each), sized together by perf/disagg.size; the cost per req/s is
                 p_P / h_P + p_D / h_D, the fluid P:D ratio h_D : h_P (what the MILP would choose
                 with many replicas). The KV moves over the link between the two instances: inside
                 one node (same type, both fit one node: the GPUs' interconnect) or between nodes at
                 each --links bandwidth (Gbit/s, 50 us latency; 10 is a cloud VM's TCP network,
                 100-400 an RDMA fabric such as NIXL's UCX transport uses).

Both columns come from the same step model (kernel tables where the GPU has them). Nothing here is
simulated: the simulator does not run disaggregated groups yet, and this is the analytic sizing that
compose would read. Deterministic: the same arguments print the same table.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hetcompile.driver import compile_spec  # noqa: E402
from hetcompile.ir.units import parse_duration  # noqa: E402
from hetcompile.perf.disagg import size  # noqa: E402
from hetcompile.simulate.disagg import replay_group, replay_replicas  # noqa: E402

PRICES = {"H100": 3.90, "A100-80GB": 3.67, "L40S": 1.86}  # $/GPU-h: GCP H100 / A100-80GB, AWS g6e (L40S)
LINK_LATENCY_S = 50e-6


def spec(model: str, inputs: list[int], output: int, tpots: list[float], ttft: float) -> dict:
    workloads = [{"name": f"i{i}-t{round(t * 1e3)}", "model": model, "input_tokens": i, "output_tokens": output,
                  "rate": "1/s", "slo": {"ttft": f"{ttft}s", "tpot": f"{t * 1e3:g}ms", "percentile": "p99"}}
                 for i in inputs for t in tpots]
    return {
        "name": "disagg-sweep",
        "models": [{"name": model, "max_model_len": max(inputs) + output}],
        "workloads": workloads,
        "regions": [{"name": "us-east-1", "cloud": "aws", "offers": [
            {"gpu": g, "gpus_per_node": 8, "max_nodes": 4, "price": f"${p}/h"} for g, p in PRICES.items()]}],
        "network": {"intra_region": {"bandwidth": "100Gbps", "latency": "50us"}},
        "budget": "$1000/h",
    }


def profiled(s: dict):
    """The profile pass's shapes of the spec (the real pipeline, stopped after profile)."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "spec.yaml"
        path.write_text(yaml.safe_dump(s, sort_keys=False))
        return compile_spec(path, stop_after="profile").ir


def kv_bytes_per_token(ir, model: str) -> float:
    """K+V bytes of one token over every layer: the profile pass's table (kappa per layer) x L."""
    entry = next(e for e in ir.perf if e.model == model)
    return entry.kv_bytes_per_token_layer * ir.model(model).arch.layers


def mine(ir, w) -> list:
    """The shapes profiled for workload w: its SLO copies where it has an SLO (profile.slo_copies),
    else the plain ones."""
    own = [s for s in ir.shapes if s.model == w.model and s.id.endswith(f"|slo:{w.name}")]
    return own or [s for s in ir.shapes if s.model == w.model and "|slo:" not in s.id]


def best_aggregated(ir, w) -> tuple:
    """(req/s per $/h, label, shape, its sized rate) of the best aggregated shape for w."""
    best: tuple = (0.0, "-", None, 0.0)
    for s in mine(ir, w):
        rate = dict(s.estimate.throughput_rps).get(w.name, 0.0)
        per_dollar = rate / (s.gpus * PRICES[s.gpu])
        if per_dollar > best[0]:
            best = (per_dollar, f"{s.gpu} TP{s.tp} PP{s.pp}", s, rate)
    return best


def best_disaggregated(ir, w, kv: float, link_gbps: float | None, ttft: float, tpot: float) -> tuple:
    """(req/s per $/h, label, prefill shape, decode shape, GroupEstimate) of the best pair for w;
    link_gbps None: only pairs that share one node (same type, both fit 8 GPUs), over its interconnect."""
    singles = [s for s in mine(ir, w) if s.pp == 1]
    best: tuple = (0.0, "-", None, None, None)
    for p in singles:
        for d in singles:
            if link_gbps is None:
                if p.gpu != d.gpu or p.tp + d.tp > 8:
                    continue
                link = (LINK_LATENCY_S, ir.gpu(p.gpu).interconnect)
            else:
                link = (LINK_LATENCY_S, link_gbps * 1e9 / 8)
            g = size(p.estimate.step_model, d.estimate.step_model, w.input_tokens, w.output_tokens, 0.0, kv, link,
                     ttft, tpot, w.slo_quantile, ir.max_utilization)
            if not g.feasible:
                continue
            cost = p.gpus * PRICES[p.gpu] / g.prefill.requests_per_s + d.gpus * PRICES[d.gpu] / g.decode.requests_per_s
            if 1.0 / cost > best[0]:
                ratio = g.prefill.requests_per_s / g.decode.requests_per_s
                best = (1.0 / cost, f"P {p.gpu} TP{p.tp} : D {d.gpu} TP{d.tp} = 1:{ratio:.2g} (TTFT {g.ttft_s:.2f}s, "
                                    f"TPOT {g.tpot_s * 1e3:.0f}ms, KV {g.transfer_s * 1e3:.0f}ms)", p, d, g)
    return best


def simulated(w, agg: tuple, dis: tuple, duration: float) -> str:
    """Both winners replayed in the engine model (simulate/disagg.py) at the loads they were sized
    for: one aggregated replica; one decode replica with as many prefill replicas as it needs
    (ceil(h_D / h_P)), whose whole-replica cost per req/s is what a plan would pay. p99 TTFT / TPOT."""
    I, O = int(w.input_tokens), int(w.output_tokens)
    out = []
    if agg[2] is not None:
        r = replay_replicas(agg[2].estimate.step_model, 1, I, O, agg[3], duration)
        out.append(f"agg {r.quantile(r.ttft_s, 0.99):.2f}s/{r.quantile(r.tpot_s, 0.99) * 1e3:.0f}ms")
    if dis[2] is not None:
        p, d, g = dis[2], dis[3], dis[4]
        n_p = math.ceil(g.decode.requests_per_s / g.prefill.requests_per_s - 1e-9)
        rate = min(n_p * g.prefill.requests_per_s, g.decode.requests_per_s)
        rm_d = d.estimate.step_model.model_copy(update={"max_num_seqs": g.decode.max_num_seqs})
        r = replay_group(p.estimate.step_model, rm_d, n_p, 1, I, O, rate, g.transfer_s, duration)
        dollars = n_p * p.gpus * PRICES[p.gpu] + d.gpus * PRICES[d.gpu]
        out.append(f"P/D {n_p}:1 {r.quantile(r.ttft_s, 0.99):.2f}s/{r.quantile(r.tpot_s, 0.99) * 1e3:.0f}ms "
                   f"{rate / dollars:.3f} req/s per $/h")
    return "; ".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--inputs", default="512,2048,8192,16384")
    ap.add_argument("--output", type=int, default=256)
    ap.add_argument("--tpot", default="20ms,35ms,60ms")
    ap.add_argument("--ttft", default="2s")
    ap.add_argument("--links", default="10,100,400")
    ap.add_argument("--quick", action="store_true", help="prompts 512 and 8192, TPOT 20 ms only")
    ap.add_argument("--simulate", type=float, default=300.0, help="seconds of each simulated check (0: none)")
    a = ap.parse_args()
    if a.quick:
        a.inputs, a.tpot = "512,8192", "20ms"
    inputs = [int(x) for x in a.inputs.split(",")]
    tpots = [parse_duration(x) for x in a.tpot.split(",")]
    ttft = parse_duration(a.ttft)
    links = [float(x) for x in a.links.split(",")]
    ir = profiled(spec(a.model, inputs, a.output, tpots, ttft))
    kv = kv_bytes_per_token(ir, a.model)
    print(f"{a.model}, {a.output} output tokens, p99 TTFT <= {ttft:g} s; prices $/GPU-h {PRICES}; "
          f"KV {kv / 1024:.0f} KiB/token")
    print("req/s per $/h: aggregated (best shape), disaggregated in one node, and across nodes per link (Gbit/s)")
    head = f"{'prompt':>7} {'TPOT':>6} {'aggregated':>11} {'one node':>9} " + " ".join(f"{f'{x:g} Gb/s':>9}" for x in links)
    print(head + "   best aggregated | best disaggregated")
    checks = []
    for w in sorted(ir.workloads, key=lambda w: (w.input_tokens, w.tpot_slo)):
        tpot = w.tpot_slo
        agg = best_aggregated(ir, w)
        node = best_disaggregated(ir, w, kv, None, ttft, tpot)
        across = [best_disaggregated(ir, w, kv, x, ttft, tpot) for x in links]
        top = max([node] + across, key=lambda x: x[0])  # ties: the first (one node, then the slowest link)
        print(f"{w.input_tokens:>7.0f} {tpot * 1e3:>4.0f}ms {agg[0]:>11.3f} {node[0]:>9.3f} "
              + " ".join(f"{x[0]:>9.3f}" for x in across)
              + f"   {agg[1]} | {top[1]}" + (f"  x{top[0] / agg[0]:.2f}" if agg[0] > 0 else ""))
        checks.append((w, agg, top))
    if a.simulate > 0:
        print(f"simulated {a.simulate:g} s at the sized loads, p99 TTFT / p99 TPOT (targets {ttft:g} s / per row):")
        for w, agg, top in checks:
            print(f"{w.input_tokens:>7.0f} {w.tpot_slo * 1e3:>4.0f}ms   {simulated(w, agg, top, a.simulate)}")

if __name__ == "__main__":
    main()
