"""What each cloud sells: GPU types and region names (data/clouds.yaml, a snapshot of SkyPilot's
catalog), and the check lowering runs on every offer.

`check_region(cloud, region)` and `check_gpu(cloud, gpu, spellings)` return None when the cloud
sells it (or the cloud is not checked: kubernetes, ssh, marketplaces), else a `Refusal` with the
message and a did-you-mean; lowering turns it into a located SpecError.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import yaml

from hetcompile.errors import did_you_mean
from hetcompile.perf.types import SAFE_LOADER


@dataclass(frozen=True)
class Refusal:
    message: str
    hint: str


@lru_cache(maxsize=1)
def table() -> dict:
    text = resources.files("hetcompile.perf").joinpath("data").joinpath("clouds.yaml").read_text()
    return yaml.load(text, Loader=SAFE_LOADER)


def _cloud(cloud: str) -> dict | None:
    return (table().get("clouds") or {}).get(cloud.lower())


def provenance() -> str:
    return f"{table()['source']}, snapshot of {table()['as_of']}"


def check_region(cloud: str, region: str) -> Refusal | None:
    c = _cloud(cloud)
    if c is None or not c.get("regions"):
        return None
    regions = [str(r) for r in c["regions"]]
    if region in regions:
        return None
    guess = did_you_mean(region, regions)
    where = [n for n, other in sorted(table()["clouds"].items()) if region in (other.get("regions") or [])]
    return Refusal(
        f"{cloud} has no region {region!r}" + (f"; did you mean {guess!r}?" if guess else "")
        + (f" ({region!r} is a region of {', '.join(where)})" if where else ""),
        f"{cloud} regions: {', '.join(regions)} (per {provenance()})"
        + (f"; or set `cloud: {where[0]}`" if where else ""),
    )


def check_gpu(cloud: str, gpu: str, spellings: list[str]) -> Refusal | None:
    """`gpu` (hetcompile's name) with every spelling of it (aliases, SkyPilot name) on `cloud`."""
    c = _cloud(cloud)
    if c is None or c.get("marketplace"):
        return None
    sold = [str(a) for a in c.get("accelerators") or []]
    low = {s.lower() for s in [gpu, *spellings]}
    if any(a.lower() in low for a in sold):
        return None
    clouds = [n for n, other in sorted(table()["clouds"].items())
              if any(str(a).lower() in low for a in other.get("accelerators") or [])]
    guess = did_you_mean(gpu, sold)
    return Refusal(
        f"{cloud} does not sell {gpu}" + (f" (it is sold on {', '.join(clouds)})" if clouds else "")
        + (f"; did you mean {guess!r}?" if guess else ""),
        f"{cloud} sells {', '.join(sold)} (per {provenance()}); move the offer to a region of "
        + (f"{' / '.join(clouds)}" if clouds else "a cloud that sells it")
        + ", or describe a GPU that is missing from this snapshot under `gpus:`",
    )
