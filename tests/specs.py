"""The tiny CPU sweep that the live tests plan, submit and search, said once.

One builtin model (tiny-4l) on `gpu: cpu`, a few steps, limits that let a 2-core machine run
it through the local Slurm cluster in seconds. A test states only what it changes.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

# The least a spec must say: the planner's own tests start from it (tests/plan/test_spec*.py).
MINIMAL_SPEC = """\
name: demo
models: [playbook-1b]
nodes: [1, 2]
seq_len: 4096
global_batch: {sequences: 256}
"""

TINY_CPU: dict[str, Any] = {
    "framework": "builtin",
    "gpu": "cpu",
    "gpus_per_node": 1,
    "dtype": "fp32",
    "models": ["tiny-4l"],
    "nodes": [1],
    "seq_len": 64,
    "global_batch": {"sequences": 4},
    "axes": {"tp": [1], "pp": [1], "mbs": [2], "zero_stage": [0], "recompute": ["none"],
             "pp_schedule": ["1f1b"]},
    "run": {"steps": 3, "warmup_steps": 1, "time_limit": "00:03:00", "mem": "800M",
            "startup_timeout_s": 90, "hang_timeout_s": 60, "signal_before_s": 20,
            "exclusive": False},
}


def tiny_cpu_spec(path: Path, name: str, **changes: Any) -> Path:
    """Write TINY_CPU named `name` to `path`, with `changes` merged in: a mapping (`axes`,
    `run`, `driver`, `global_batch`) updates the section, anything else replaces it."""
    spec = copy.deepcopy(TINY_CPU)
    spec["name"] = name
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key].update(value)
        else:
            spec[key] = value
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path
