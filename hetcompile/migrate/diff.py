"""Deploy's two states, side by side: desired and actual.

Desired: OUT's plan; every replica with the content hash of what its cluster runs (its task
sky/<id>.yaml and its node scripts vllm/<id>/*), so a replica whose shape, engine flags or
scripts changed is a different replica even when its id is the same.

Actual: the deploy record OUT/deploy/record.json, which deploy keeps as it launches and tears
down (cluster -> replica id and hash; which cluster serves each replica of the plan it last
converged to, whose artifacts it keeps in OUT/deploy/applied/), checked against `sky status`:
a recorded cluster that sky no longer lists is not running, whatever the record says.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from hetcompile.plan.canon import dumps_json
from hetcompile.migrate.actions import RolloutError


class DeployError(RolloutError):
    """A deploy that cannot start as things stand (nothing was changed)."""

    kind = "deploy error"

RECORD = "deploy/record.json"
APPLIED = "deploy/applied"
ROUTER = "router"  # the record's replica id of the router cluster
STATUSES = ("UP", "INIT", "STOPPED")


def task_hash(out: Path, rid: str) -> str:
    """sha256 (16 hex) over the replica's task and node scripts: names and bytes, in path order."""
    h = hashlib.sha256()
    files = [out / "sky" / f"{rid}.yaml", *sorted(p for p in (out / "vllm" / rid).rglob("*") if p.is_file())]
    for f in files:
        try:
            data = f.read_bytes()
        except OSError as e:
            raise DeployError(f"cannot read {f}: {e.strerror or e}", hint="rebuild the plan into this folder") from None
        h.update(f.relative_to(out).as_posix().encode() + b"\0" + data + b"\0")
    return h.hexdigest()[:16]


@dataclass
class Record:
    """What deploy launched from this folder, and which of it serves the plan it converged to."""

    plan: str | None = None
    clusters: dict[str, dict] = field(default_factory=dict)  # cluster -> {"replica": id, "hash": h}
    applied: dict[str, str] = field(default_factory=dict)  # replica id of OUT/deploy/applied -> cluster

    @classmethod
    def load(cls, out: Path) -> Record:
        path = out / RECORD
        if not path.exists():
            return cls()
        try:
            d = json.loads(path.read_text())
            return cls(plan=d.get("plan"), clusters=dict(d.get("clusters") or {}), applied=dict(d.get("applied") or {}))
        except (OSError, ValueError, AttributeError) as e:
            raise DeployError(f"cannot read the deploy record {path}: {e}",
                               hint="it lists the clusters deploy launched; restore it, or tear them down by hand "
                                    "(`sky status`) and delete it") from None

    def save(self, out: Path) -> None:
        path = out / RECORD
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")  # a kill mid-write must not lose the list of what bills
        tmp.write_text(dumps_json({"plan": self.plan, "clusters": dict(sorted(self.clusters.items())),
                                   "applied": dict(sorted(self.applied.items()))}))
        tmp.replace(path)

    def cluster_of(self, rid: str, h: str) -> str | None:
        """A recorded cluster running replica `rid` with task hash `h`."""
        return next((c for c, e in sorted(self.clusters.items()) if e.get("replica") == rid and e.get("hash") == h), None)


def parse_status(text: str) -> dict[str, str]:
    """`sky status` output -> {cluster: UP | INIT | STOPPED}; lines without a status are headers."""
    out = {}
    for line in text.splitlines():
        f = line.split()
        st = next((x for x in f[1:] if x in STATUSES), None)
        if f and st is not None:
            out[f[0]] = st
    return out


def sky_status(cwd: Path, env: dict[str, str]) -> dict[str, str]:
    try:
        p = subprocess.run(["sky", "status"], cwd=cwd, env=env, text=True, capture_output=True, check=False)
    except OSError as e:
        raise DeployError(f"cannot run `sky status`: {e.strerror or e}", hint="pip install 'skypilot==0.14.*'") from None
    if p.returncode != 0:
        raise DeployError(f"`sky status` exited {p.returncode}: {p.stderr.strip()[-300:]}",
                           hint="deploy reads what runs from it; nothing was changed")
    return parse_status(p.stdout)


def legacy_clusters(plan: str, status: dict[str, str], record: Record) -> list[str]:
    """Replica clusters of this plan that sky lists but the record does not: launched by a deploy.sh
    before deploy kept a record (their task is unknown, so they are replaced, not trusted)."""
    pat = re.compile(rf"^{re.escape(plan)}-r\d+(-[0-9a-f]{{6}})?$")
    return sorted(c for c in status if pat.match(c) and c not in record.clusters)
