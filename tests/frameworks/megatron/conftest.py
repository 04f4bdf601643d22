"""Rendering Megatron runs through the real planner and renderer, shared by the template tests
through the `megatron_family` fixture (the test folders are not packages, so it is a fixture)."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from sweep.plan import render, space
from sweep.plan.spec import Spec, parse_spec

# Small shapes that still exercise every layout rule: heads and KV heads divisible by tp <= 4,
# 8 layers (even over 2, 4 and 8 stages), 6 layers (8 stages: the loss and the embedding count
# as layers; 4 stages: neither evens out, so pp = 4 is pruned by the planner), and a MoE model.
MODELS: list[dict[str, Any]] = [
    {"name": "dense-tied-8l", "num_layers": 8, "hidden_size": 256, "num_attention_heads": 8,
     "num_kv_heads": 4, "ffn_hidden_size": 704, "vocab_size": 1024, "tie_word_embeddings": True},
    {"name": "dense-untied-6l", "num_layers": 6, "hidden_size": 256, "num_attention_heads": 4,
     "ffn_hidden_size": 768, "vocab_size": 1000, "tie_word_embeddings": False},
    {"name": "moe-8e-8l", "num_layers": 8, "hidden_size": 256, "num_attention_heads": 8,
     "num_kv_heads": 8, "ffn_hidden_size": 512, "vocab_size": 1024, "num_experts": 8,
     "experts_per_token": 2},
]

AXES: dict[str, Any] = {
    "tp": [1, 2, 4], "pp": [1, 2, 4], "cp": [1, 2], "ep": [1, 2, 4], "mbs": [1, 2],
    "zero_stage": [0, 1], "recompute": ["none", "selective", "full"], "sp": [True, False],
    "pp_schedule": ["1f1b", "interleaved_1f1b", "gpipe"],
}


def family_spec(name: str, dtype: str, models: list[dict[str, Any]] | None = None,
                nodes: tuple[int, ...] = (1, 2), **run: Any) -> Spec:
    """A Megatron spec over the whole layout family (8 GPUs a node, tiny models)."""
    doc = {"name": name, "framework": "megatron", "gpu": "h100-sxm", "gpus_per_node": 8,
           "dtype": dtype, "models": models or MODELS, "nodes": list(nodes), "seq_len": 512,
           "global_batch": {"sequences": 32}, "axes": AXES,
           "run": {"steps": 6, "warmup_steps": 2, "framework_dir": "/opt/Megatron-LM", **run}}
    return parse_spec(yaml.safe_dump(doc), source=f"<{name}>")


def sample_kept(plan: pd.DataFrame, per_group: int, columns: list[str]) -> pd.DataFrame:
    """A deterministic spread of the kept rows: the first `per_group` of each group."""
    kept = plan[plan["status"] == space.KEPT]
    return kept.groupby(columns, observed=True).head(per_group)


def rendered(spec: Spec, rows: pd.DataFrame) -> list[tuple[Any, dict[str, str]]]:
    """(RunConfig, files) of each row, rendered in memory as `sweep render` would write them."""
    env = render.make_environment()
    names = render.launch_templates(env, "megatron")
    out = []
    for row in render.kept_rows(rows):
        config = render.resolve_run(spec, row)
        out.append((config, render.render_files(env, config, Path("/runs") / config.run_id,
                                                names)))
    return out


def argv(args_file: str) -> list[str]:
    """launch/megatron.args as megatron.sh reads it: one argument a line, # lines skipped."""
    return [line for line in args_file.split("\n") if line and not line.startswith("#")]


def exports(script: str) -> dict[str, str]:
    """The `export NAME=value` lines of a launcher (values without quotes or comments)."""
    return dict(re.findall(r"^export ([A-Z_]+)=([^\s#]+)", script, flags=re.MULTILINE))


@pytest.fixture(scope="session")
def megatron_family() -> types.ModuleType:
    """This module: MODELS, family_spec, sample_kept, rendered, argv, exports."""
    return sys.modules[__name__]
