"""SkyPilot backend: one task YAML per replica (`sky/<replica>.yaml`) and one for the router.

A single-type replica is an ordinary task: `num_nodes` = pipeline depth, `accelerators: GPU:tp`,
mp multi-node vLLM with the head's address from SKYPILOT_NODE_IPS (lowering_facts.md §6-7). The
run section writes the very node scripts of `vllm/<replica>/` (byte for byte) and runs the one
for this node's rank, so what runs in the cloud is what was checked and tested locally.
Task YAML is data: serialized from dicts, never templated.
"""

from __future__ import annotations

from hetcompile.backends.canon import dumps_yaml
from hetcompile.backends.vllm import NodeScript
from hetcompile.ir.errors import BackendError
from hetcompile.ir.problem import Problem, Replica

HEREDOC = "HETCOMPILE_NODE_SCRIPT"


def infra(cloud: str, region: str) -> str:
    if cloud == "kubernetes":
        return "k8s"
    if cloud == "ssh":
        return f"ssh/{region}"
    return f"{cloud}/{region}"


def cluster_name(ir: Problem, rid: str) -> str:
    return f"{ir.name}-{rid}"


def run_section(scripts: list[NodeScript]) -> str:
    lines = ["set -euo pipefail", "mkdir -p ~/hetcompile"]
    for s in scripts:
        if HEREDOC in s.text:
            raise BackendError(f"node script {s.path} contains the heredoc marker {HEREDOC}")
        lines += [f"cat > ~/hetcompile/node{s.rank}.sh <<'{HEREDOC}'", s.text.rstrip("\n"), HEREDOC]
    if len(scripts) > 1:
        lines += [
            'export HC_MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)',
            'export VLLM_HOST_IP=$(echo "$SKYPILOT_NODE_IPS" | sed -n "$((SKYPILOT_NODE_RANK + 1))p")',
            'exec bash ~/hetcompile/node"$SKYPILOT_NODE_RANK".sh',
        ]
    else:
        lines.append("exec bash ~/hetcompile/node0.sh")
    return "\n".join(lines) + "\n"


def replica_task(ir: Problem, r: Replica, scripts: list[NodeScript]) -> str:
    if r.mixed:
        raise BackendError(f"replica {r.id} mixes GPU types; job-group lowering is not implemented yet")
    first = r.stages[0]
    node = next(n for n in ir.nodes if n.id == first.node)
    offer = ir.offer(node.offer)
    resources: dict = {
        "infra": infra(node.cloud, node.region),
        "accelerators": f"{ir.gpu(first.gpu).sky_name}:{first.tp}",
        "disk_size": ir.engine.disk_size,
        "ports": ir.engine.port,
        "image_id": ir.engine.image,
    }
    if offer.spot:
        resources["use_spot"] = True
    task = {
        "name": cluster_name(ir, r.id),
        "resources": resources,
        "num_nodes": len(r.stages),
        "envs": {"HC_PLAN": ir.name, "HC_REPLICA": r.id},
        "secrets": {"HF_TOKEN": None},
        "run": run_section(scripts),
    }
    return dumps_yaml(task)


def router_task(ir: Problem) -> str:
    # the router sits where most replicas are, to keep the common hop short
    regions: dict[tuple[str, str], int] = {}
    for n in ir.nodes:
        regions[(n.cloud, n.region)] = regions.get((n.cloud, n.region), 0) + 1
    cloud, region = sorted(regions.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    port = ir.engine.router_port
    task = {
        "name": f"{ir.name}-router",
        "resources": {"infra": infra(cloud, region), "cpus": "4+", "ports": port},
        "workdir": "router",
        "setup": "pip install dist/*.whl\n",
        "run": f"exec hetcompile router --table routing.json --host 0.0.0.0 --port {port}\n",
    }
    return dumps_yaml(task)
