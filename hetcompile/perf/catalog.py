"""GPU and model catalogs: datasheet and config.json numbers shipped with hetcompile.

`data/gpus.yaml` and `data/models.yaml` hold the numbers with their sources; this module turns
them into IR values (`GpuType` in SI units, `ModelArch`) and looks names up case-insensitively
through aliases. A spec can add or override entries (`gpus:`, `models[].architecture`).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import yaml

from hetcompile.perf.types import SAFE_LOADER, GpuType, ModelArch

PCIE4_BYTES_PER_S = 32e9


def _load(name: str) -> list[dict]:
    text = resources.files("hetcompile.perf").joinpath("data").joinpath(name).read_text()
    return yaml.load(text, Loader=SAFE_LOADER) or []


@lru_cache(maxsize=1)
def _gpu_rows() -> dict[str, dict]:
    rows: dict[str, dict] = {}
    for row in _load("gpus.yaml"):
        for key in [row["name"], *(row.get("aliases") or []), row.get("sky_name") or row["name"]]:
            rows.setdefault(str(key).lower(), row)
    return rows


@lru_cache(maxsize=1)
def _model_rows() -> dict[str, dict]:
    rows: dict[str, dict] = {}
    for row in _load("models.yaml"):
        for key in [row["name"], *(row.get("aliases") or []), row.get("weights") or row["name"]]:
            rows.setdefault(str(key).lower(), row)
    return rows


def gpu_names() -> list[str]:
    """Canonical GPU ids in the catalog, sorted."""
    return sorted({r["name"] for r in _gpu_rows().values()})


def model_names() -> list[str]:
    """Canonical model ids in the catalog, sorted."""
    return sorted({r["name"] for r in _model_rows().values()})


def price_provenance(name: str) -> tuple[str, str] | None:
    """(source, date checked) of catalog GPU `name`'s default price, or None."""
    row = _gpu_rows().get(name.lower())
    if row is None or row.get("price_per_hour") is None:
        return None
    return str(row.get("price_source") or "catalog"), str(row.get("price_as_of") or "undated")


def gpu_spellings(name: str) -> list[str]:
    """Every spelling of catalog GPU `name`: its name, aliases and SkyPilot name."""
    row = _gpu_rows().get(name.lower())
    return [] if row is None else [row["name"], *(row.get("aliases") or []), row.get("sky_name") or row["name"]]


def all_gpu_spellings() -> list[str]:
    return sorted({k for k in _gpu_rows()})


def lookup_gpu(name: str) -> GpuType | None:
    row = _gpu_rows().get(name.lower())
    if row is None:
        return None
    return GpuType(
        name=row["name"],
        sky_name=row.get("sky_name") or row["name"],
        memory=float(row["memory_mib"]) * 2**20 if row.get("memory_mib") else float(row["memory_gb"]) * 1e9,
        flops=float(row["fp16_tflops"]) * 1e12,
        mem_bw=float(row["bandwidth_gbps"]) * 1e9,
        interconnect=float(row.get("interconnect_gbps") or PCIE4_BYTES_PER_S / 1e9) * 1e9,
        bf16=bool(row["bf16"]),
        price_per_hour=row.get("price_per_hour"),
        source=str(row.get("source", "")),
        eta_memory=row.get("eta_memory"),
        eta_compute=row.get("eta_compute"),
        compute_capability=str(row["compute_capability"]) if row.get("compute_capability") else None,
    )


def lookup_model(name: str) -> tuple[str, str, ModelArch] | None:
    """(canonical name, default weights, architecture) for a catalog model, or None."""
    row = _model_rows().get(name.lower())
    if row is None:
        return None
    arch = ModelArch(
        layers=int(row["layers"]),
        hidden=int(row["hidden"]),
        intermediate=int(row["intermediate"]),
        heads=int(row["heads"]),
        kv_heads=int(row["kv_heads"]),
        head_dim=int(row.get("head_dim") or row["hidden"] // row["heads"]),
        vocab=int(row["vocab"]),
        max_context=int(row["max_context"]),
        tie_embeddings=bool(row.get("tie_embeddings", False)),
        source=str(row.get("source", "")),
    )
    return row["name"], str(row.get("weights") or row["name"]), arch
