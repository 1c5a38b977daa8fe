"""deploy.sh and teardown.sh: launch the replicas, collect endpoints, fill the table, start the router."""

from __future__ import annotations

import jinja2

from hetcompile import __version__
from hetcompile.backends.skypilot import cluster_name
from hetcompile.ir.problem import Problem

_env = jinja2.Environment(
    loader=jinja2.PackageLoader("hetcompile.backends", "templates"),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,
)


def context(ir: Problem) -> dict:
    return {
        "version": __version__,
        "plan": ir.name,
        "port": ir.engine.port,
        "router_port": ir.engine.router_port,
        "replicas": [{"id": r.id, "cluster": cluster_name(ir, r.id), "nodes": len(r.stages)} for r in ir.replicas],
        "router_cluster": f"{ir.name}-router",
    }


def deploy_sh(ir: Problem) -> str:
    return _env.get_template("deploy.sh.j2").render(**context(ir))


def teardown_sh(ir: Problem) -> str:
    return _env.get_template("teardown.sh.j2").render(**context(ir))
