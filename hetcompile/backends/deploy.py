"""deploy.sh and teardown.sh: thin wrappers of `hetcompile deploy` / `hetcompile teardown`.

A plan with mixed-GPU replicas (managed Job Groups, which the reconciler does not handle yet) gets
the standalone scripts instead (*_groups.sh.j2: launch everything, fill the table, start the router).
"""

from __future__ import annotations

from hetcompile import __version__
from hetcompile.backends.templating import render
from hetcompile.backends.skypilot import cluster_name
from hetcompile.ir.problem import Problem


def context(ir: Problem) -> dict:
    assert ir.replicas is not None and ir.nodes is not None  # a built plan has them
    reps = [
        {"id": r.id, "cluster": cluster_name(ir, r.id), "nodes": len(r.stages), "group": r.mixed,
         "env": f"HC_ENDPOINT_{r.id.upper()}"}
        for r in ir.replicas
    ]
    return {
        "version": __version__,
        "plan": ir.name,
        "port": ir.engine.port,
        "router_port": ir.engine.router_port,
        "replicas": reps,
        "groups": [r for r in reps if r["group"]],
        "router_cluster": f"{ir.name}-router",
        # the clouds `sky check` must enable (the router runs in one of the replicas' clouds)
        "clouds": sorted({n.cloud for n in ir.nodes}),
    }


def _template(ir: Problem, kind: str) -> str:
    assert ir.replicas is not None  # a built plan has them
    return f"{kind}_groups.sh.j2" if any(r.mixed for r in ir.replicas) else f"{kind}.sh.j2"


def deploy_sh(ir: Problem) -> str:
    return render(_template(ir, "deploy"), **context(ir))


def teardown_sh(ir: Problem) -> str:
    return render(_template(ir, "teardown"), **context(ir))
