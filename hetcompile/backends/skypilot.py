"""SkyPilot backend: one task YAML per replica (`sky/<replica>.yaml`) and one for the router.

A single-type replica is an ordinary task: `num_nodes` = pipeline depth, `accelerators: GPU:tp`,
mp multi-node vLLM with the head's address from SKYPILOT_NODE_IPS (docs/lowering_facts.md §6-7). The
run section writes the very node scripts of `vllm/<replica>/` (byte for byte) and runs the one
for this node's rank, so what runs in the cloud is what was checked and tested locally.

A replica whose stages mix GPU types cannot be one task (a task's resources apply to all its
nodes), so it is a Job Group (docs/lowering_facts.md §8): a header with `execution: parallel`,
`inter_connection: true` (hostname networking, Kubernetes only) and the head stage as primary
task, then one single-node task per stage `s<k>` with its own accelerator. Stage k reaches the
head as `s0-0.$SKYPILOT_JOBGROUP_NAME` and advertises its pod IP as VLLM_HOST_IP. A TP slice of
a split multi-GPU node is its own stage task (a pod of `tp` GPUs). Launched with
`sky jobs launch`, not `sky launch`.
Task YAML is data: serialized from dicts, never templated.
"""

from __future__ import annotations

from hetcompile.plan.canon import dumps_yaml, dumps_yaml_docs
from hetcompile.backends.vllm import NodeScript
from hetcompile.errors import BackendError
from hetcompile.ir.problem import Problem, Replica
from hetcompile.plan.routing import ROUTER_TOKEN_ENV, VLLM_KEY_ENV

HEREDOC = "HETCOMPILE_NODE_SCRIPT"
# the replicas' bearer key: vLLM checks it on /v1/* (the node script passes it as --api-key).
# A managed secret on every replica task and on the router, which sends it upstream
# (routing.json api_key_env). /health and /metrics stay open for the probes.
SECRETS = {"HF_TOKEN": None, VLLM_KEY_ENV: None}
# a task must not start an unauthenticated server because the secret was not passed
REQUIRE_KEY = f': "${{{VLLM_KEY_ENV}:?{VLLM_KEY_ENV} is not set: launch with --secret {VLLM_KEY_ENV} (deploy.sh does)}}"'


NIXL_SETUP = "python3 -c 'import nixl' 2>/dev/null || python3 -m pip install nixl\n"


def infra(cloud: str, region: str) -> str:
    if cloud == "kubernetes":
        return "k8s"
    if cloud == "ssh":
        return f"ssh/{region}"
    return f"{cloud}/{region}"


def cluster_name(ir: Problem, rid: str) -> str:
    return f"{ir.name}-{rid}"


def run_section(scripts: list[NodeScript]) -> str:
    lines = ["set -euo pipefail", REQUIRE_KEY, "mkdir -p ~/hetcompile"]
    for s in scripts:
        lines += _write_script(s)
    if len(scripts) > 1:
        lines += [
            'export HC_MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)',
            'export VLLM_HOST_IP=$(echo "$SKYPILOT_NODE_IPS" | sed -n "$((SKYPILOT_NODE_RANK + 1))p")',
            'exec bash ~/hetcompile/node"$SKYPILOT_NODE_RANK".sh',
        ]
    else:
        lines.append("exec bash ~/hetcompile/node0.sh")
    return "\n".join(lines) + "\n"


def _write_script(s: NodeScript) -> list[str]:
    if HEREDOC in s.text:
        raise BackendError(f"node script {s.path} contains the heredoc marker {HEREDOC}")
    return [f"cat > ~/hetcompile/node{s.rank}.sh <<'{HEREDOC}'", s.text.rstrip("\n"), HEREDOC]


def stage_task_name(rank: int) -> str:
    return f"s{rank}"


def job_group(ir: Problem, r: Replica, scripts: list[NodeScript]) -> str:
    """A mixed replica as a multi-document Job Group YAML (see the module docstring)."""
    assert ir.nodes is not None  # a built plan has them
    nodes = {n.id: n for n in ir.nodes}
    clouds = {nodes[s.node].cloud for s in r.stages}
    if clouds != {"kubernetes"}:
        raise BackendError(
            f"replica {r.id} mixes GPU types across {', '.join(sorted(clouds))}: a mixed chain is a SkyPilot Job Group, "
            "which networks its tasks on Kubernetes only; offer these GPUs in `cloud: kubernetes` regions, or use "
            "`placement.pipelines: single-type`"
        )
    head = f"{stage_task_name(0)}-0.${{SKYPILOT_JOBGROUP_NAME}}"
    docs: list[dict] = [{
        "name": cluster_name(ir, r.id), "execution": "parallel", "inter_connection": True,
        "primary_tasks": [stage_task_name(0)],
    }]
    for s, script in zip(r.stages, scripts):
        resources: dict = {
            "infra": "k8s",
            "accelerators": f"{ir.gpu(s.gpu).sky_name}:{s.tp}",
            "disk_size": ir.engine.disk_size,
            "image_id": ir.engine.image,
        }
        if script.rank == 0:
            resources["ports"] = ir.engine.port
        run = ["set -euo pipefail", REQUIRE_KEY, "mkdir -p ~/hetcompile", *_write_script(script),
               f'export HC_MASTER_ADDR="{head}"', 'export VLLM_HOST_IP="$(hostname -i | cut -d" " -f1)"',
               f"exec bash ~/hetcompile/node{script.rank}.sh"]
        docs.append({
            "name": stage_task_name(script.rank), "resources": resources, "num_nodes": 1,
            "envs": {"HC_PLAN": ir.name, "HC_REPLICA": r.id, "HC_STAGE": str(script.rank)},
            "secrets": dict(SECRETS), "run": "\n".join(run) + "\n",
        })
    return dumps_yaml_docs(docs)


def replica_task(ir: Problem, r: Replica, scripts: list[NodeScript]) -> str:
    if r.mixed:
        return job_group(ir, r, scripts)
    assert ir.nodes is not None  # a built plan has them
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
        "secrets": dict(SECRETS),
        "run": run_section(scripts),
    }
    if r.role is not None:  # NixlConnector needs the nixl package, which the vllm wheel does not depend on
        task["setup"] = NIXL_SETUP
    return dumps_yaml(task)


def router_task(ir: Problem) -> str:
    # the router sits where most replicas are, to keep the common hop short
    assert ir.nodes is not None  # a built plan has them
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
        # clients must send the token deploy.sh generates (never on a command line: a managed secret)
        "secrets": {ROUTER_TOKEN_ENV: None, VLLM_KEY_ENV: None},
        "run": f"{REQUIRE_KEY}\nexec hetcompile router --table routing.json --host 0.0.0.0 --port {port} --auth-token-env {ROUTER_TOKEN_ENV}\n",
    }
    return dumps_yaml(task)
