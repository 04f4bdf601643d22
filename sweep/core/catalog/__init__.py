"""The catalog: model shapes and GPU types, read from the YAML files beside this module.

Lookups accept the canonical name or any alias, case-insensitively.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Any

import yaml

from sweep.core.hardware import GpuSpec
from sweep.core.model import ModelShape

SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_SHAPE_FIELDS = (
    "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size",
    "vocab_size", "tie_word_embeddings", "head_dim", "num_experts", "experts_per_token",
    "moe_ffn_hidden_size",
)


class CatalogError(LookupError):
    pass


def _read(filename: str) -> dict[str, dict[str, Any]]:
    text = resources.files("sweep.core.catalog").joinpath(filename).read_text(encoding="utf-8")
    return yaml.safe_load(text)


def _index(entries: dict[str, dict[str, Any]]) -> dict[str, str]:
    index: dict[str, str] = {}
    for name, entry in entries.items():
        for key in [name, *entry.get("aliases", [])]:
            index[key.lower()] = name
    return index


@functools.cache
def _models() -> tuple[dict[str, ModelShape], dict[str, str]]:
    raw = _read("models.yaml")
    shapes = {
        name: ModelShape(name=name, source=entry.get("source", ""),
                         **{k: entry[k] for k in _SHAPE_FIELDS if k in entry})
        for name, entry in raw.items()
    }
    return shapes, _index(raw)


@functools.cache
def _gpus() -> tuple[dict[str, GpuSpec], dict[str, str]]:
    raw = _read("gpus.yaml")
    specs = {
        name: GpuSpec(
            name=name,
            memory_bytes=entry["memory_bytes"],
            peak_flops={k: float(v) for k, v in entry["peak_flops"].items()},
            intra_node_GBps=float(entry["intra_node_GBps"]),
            inter_node_GBps=float(entry["inter_node_GBps"]),
            hbm_GBps=float(entry.get("hbm_GBps", 0.0)),
            gpus_per_node=int(entry["gpus_per_node"]),
            source=entry.get("source", ""),
        )
        for name, entry in raw.items()
    }
    return specs, _index(raw)


def model_names() -> list[str]:
    return list(_models()[0])


def gpu_names() -> list[str]:
    return list(_gpus()[0])


def get_model(name: str) -> ModelShape:
    shapes, index = _models()
    canonical = index.get(name.lower())
    if canonical is None:
        raise CatalogError(f"unknown model {name!r}; catalog models: {', '.join(shapes)}")
    return shapes[canonical]


def get_gpu(name: str) -> GpuSpec:
    specs, index = _gpus()
    canonical = index.get(name.lower())
    if canonical is None:
        raise CatalogError(f"unknown GPU type {name!r}; catalog GPUs: {', '.join(specs)}")
    return specs[canonical]


def device_gpu(device_name: str) -> GpuSpec | None:
    """The catalog entry of a device as the driver names it (nvidia-smi, torch.cuda), or None.

    Drivers prefix the product name ("NVIDIA H100 80GB HBM3"); the catalog's aliases may not."""
    name = device_name.strip()
    for candidate in (name, name.removeprefix("NVIDIA ")):
        try:
            return get_gpu(candidate)
        except CatalogError:
            continue
    return None


def gpu_mismatch(gpu: str, device_names: list[str]) -> str | None:
    """Why devices named `device_names` are not the spec's `gpu`, or None when each is, or is a
    device the catalog does not know (nothing to compare). MFU divides by the catalog's peak for
    `gpu`, so a run on another GPU type would publish a wrong figure."""
    try:
        want = get_gpu(gpu)
    except CatalogError:
        return None  # a GPU outside the catalog: the spec names its peak itself
    others = sorted({f"{name} (catalog {found.name})" for name in device_names
                     if (found := device_gpu(name)) is not None and found.name != want.name})
    if not others:
        return None
    return (f"gpu: the spec says {want.name}, but this node has {', '.join(others)}: its MFU "
            f"would divide by {want.name}'s peak. Set gpu to the node's type, or pick nodes of "
            f"{want.name} (run.partition or run.constraint)")
