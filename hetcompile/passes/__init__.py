"""The pass pipeline: registry and the literal default order (docs/DESIGN.md §Data flow)."""

from __future__ import annotations

from hetcompile.passes.base import Pass
from hetcompile.passes.compose import Compose
from hetcompile.passes.disaggregation import Disaggregation
from hetcompile.passes.parallelize import Parallelize
from hetcompile.passes.place import Place
from hetcompile.passes.profile import Profile
from hetcompile.passes.prune import Prune
from hetcompile.passes.route import Route
from hetcompile.passes.verify import Verify
from hetcompile.passes.what_if import WhatIf


def get_all_passes() -> dict[str, type[Pass]]:
    """Every pass by name (a test checks each key equals the pass's `name`)."""
    return {p.name: p for p in (Profile, Compose, Prune, Place, Parallelize, Route, Verify, WhatIf, Disaggregation)}


def default_pipeline(verify: bool = True, disaggregation: bool = False) -> tuple[Pass, ...]:
    """The eight passes; `verify=False` (`hetcompile build --no-verify`) leaves out the simulation
    that checks the plan's targets, for a quick look at a plan (it says it was not verified). The
    what-if comes after verify: it explains the plan verification kept, once (passes/what_if.py).
    `disaggregation` (spec `disaggregation: auto`) adds pass 9, which weighs the plan's prefill/decode
    groups against the best plan without them (passes/disaggregation.py)."""
    return (Profile(), Compose(), Prune(), Place(), Parallelize(), Route(), *((Verify(),) if verify else ()), WhatIf(),
            *((Disaggregation(),) if disaggregation else ()))
