"""Rendered torchtitan runs, read by torchtitan's own ConfigManager and ParallelDims (per version).

A representative family (dp/tp/pp/cp/ep, ZeRO 0/2/3, recompute none/selective/full, schedules
1f1b/gpipe/interleaved, bf16/fp8/fp32, compile on and off, the 8B and 70B flavors, and one
model without a flavor) is planned by the real planner and rendered by the real renderer; a
deterministic sample of the kept runs (one per distinct combination of what the TOML encodes)
goes through tests/frameworks/torchtitan/contract_check.py in one subprocess per torchtitan
version installed by scripts/contract/torchtitan.sh. Every kept run must parse and pass
torchtitan's checks, and say what its row says; every pruned-by-torchtitan run must be one that
torchtitan would reject or run as something else.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sweep.core.catalog import get_model
from sweep.frameworks.torchtitan.flavors import LLAMA3_FLAVORS
from sweep.models.pipeline_stages import stage_layer_counts
from sweep.plan import render, space
from sweep.plan.spec import parse_spec

pytestmark = pytest.mark.contract

REPO = Path(__file__).resolve().parents[3]
CHECK = Path(__file__).with_name("contract_check.py")
VERSIONS = {"0.2.0": "v0.2.0", "0.2.1": "v0.2", "0.2.2": "v0.2"}
SPEC = """
name: tt-contract
framework: torchtitan
models: [llama-3.1-8b, llama-3.1-70b, llama-3.2-1b]
nodes: [1, 2, 4]
gpus_per_node: 8
seq_len: 4096
dtype: {dtype}
global_batch: {{sequences: 64}}
axes: {{cp: [1, 2], ep: [1, 2], zero_stage: [0, 2, 3], recompute: [none, selective, full],
        sp: [true, false], pp_schedule: [1f1b, gpipe, interleaved_1f1b]}}
run: {{framework_dir: /opt/torchtitan, steps: 20, seed: 7, compile: {compile},
       framework_version: {version}}}
"""
# One sampled run per distinct combination of these columns (about 100 runs in all: torchtitan's
# ConfigManager takes about 0.13 s a run).
SAMPLE_BY = {"bf16": ["model", "zero_stage", "pp_schedule", "cp", "recompute"],
             "fp8": ["zero_stage", "pp_schedule", "cp"],
             "fp32": ["zero_stage", "pp_schedule", "tp"]}


def family(dtype: str, version: str, compile_: bool) -> tuple[Any, Any]:
    spec = parse_spec(SPEC.format(dtype=dtype, version=version, compile=str(compile_).lower()))
    return spec, space.plan(spec)


def rendered_cases(tmp: Path, version: str) -> list[dict[str, Any]]:
    """The sampled kept runs of the bf16, fp8 and fp32 families, rendered into tmp."""
    env = render.make_environment()
    names = render.launch_templates(env, "torchtitan")
    cases = []
    for dtype, compile_ in (("bf16", False), ("fp8", True), ("fp32", False)):
        spec, plan = family(dtype, version, compile_)
        kept = plan[plan["status"] == space.KEPT]
        sample = kept.groupby(SAMPLE_BY[dtype], observed=True).head(1)
        for row in render.kept_rows(sample):
            config = render.resolve_run(spec, row)
            files = render.render_files(env, config, tmp / config.run_id, names)
            toml = tmp / f"{dtype}-{config.run_id}.toml"
            toml.write_text(files["launch/torchtitan.toml"])
            cases.append({"id": toml.stem, "toml": str(toml),
                          "world_size": config.nodes * config.gpus_per_node,
                          "config": config, "dtype": dtype, "compile": compile_})
    return cases


def run_check(release: str, cases: list[dict[str, Any]], tmp: Path) -> dict[str, Any]:
    target = REPO / ".contract" / f"torchtitan-{release}"
    if not (target / ".installed").is_file():
        pytest.skip(f"{target} missing: run scripts/contract/torchtitan.sh")
    listing = tmp / f"cases-{release}.json"
    listing.write_text(json.dumps([{k: c[k] for k in ("id", "toml", "world_size")}
                                   for c in cases]))
    done = subprocess.run([sys.executable, str(CHECK), str(listing)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(target)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def expected(case: dict[str, Any], version_key: str) -> dict[str, Any]:
    config, layout = case["config"], case["config"].layout
    fsdp = layout.zero_stage > 0
    flavor = {"llama-3.1-8b": "8B", "llama-3.1-70b": "70B"}[config.model.name]
    want = {
        "model": ["llama3", flavor],
        "converters": ["quantize.linear.float8"] if case["dtype"] == "fp8" else [],
        "dp_replicate": 1 if fsdp else layout.dp, "dp_shard": layout.dp if fsdp else 1,
        "tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "ep": 1,
        "local_batch": layout.mbs * (layout.grad_acc if layout.pp > 1 else 1),
        "global_batch": 64, "seq_len": 4096, "steps": 20, "seed": 7,
        "grad_accumulation": 1 if layout.pp > 1 else layout.grad_acc,
        "mixed_precision_param": "float32" if case["dtype"] == "fp32" else "bfloat16",
        "dtype": "float32", "ac_mode": layout.recompute, "compile": case["compile"],
        "dataset": "c4_test", "log_freq": 1,
    }
    if fsdp:
        want["reshard"] = "always" if layout.zero_stage == 3 else "never"
    if layout.pp > 1:
        want["microbatch"] = layout.mbs
        want["schedule"] = {"1f1b": "1F1B", "gpipe": "GPipe",
                            "interleaved_1f1b": "Interleaved1F1B"}[layout.pp_schedule]
    if layout.recompute == "selective":
        want["ac_option"] = "op"
    if case["dtype"] == "fp8":
        want["float8_filter"] = ["output"]
    return want


@pytest.mark.parametrize("release", sorted(VERSIONS))
def test_rendered_runs_pass_torchtitans_own_config_and_validators(release: str, tmp_path: Path) -> None:
    version_key = VERSIONS[release]
    cases = rendered_cases(tmp_path, version_key)
    assert len(cases) > 60
    report = run_check(release, cases, tmp_path)
    by_id = {c["id"]: c for c in cases}
    failures = [(r["id"], r["errors"]) for r in report["results"] if r["errors"]]
    assert not failures, failures[:5]
    for result in report["results"]:
        want = expected(by_id[result["id"]], version_key)
        got = {k: result["parsed"][k] for k in want}
        assert got == want, result["id"]
    # The interleaved, fp8, CP, ZeRO-0 and compiled runs are all in the sample.
    layouts = [c["config"].layout for c in cases]
    assert {lay.pp_schedule for lay in layouts if lay.pp > 1} == {"1f1b", "gpipe", "interleaved_1f1b"}
    assert {lay.zero_stage for lay in layouts} == {0, 2, 3}
    assert any(lay.cp > 1 for lay in layouts) and any(lay.tp > 1 for lay in layouts)
    assert {lay.recompute for lay in layouts} == {"none", "selective", "full"}


@pytest.mark.parametrize("release", sorted(VERSIONS))
def test_our_flavor_table_is_torchtitans(release: str, tmp_path: Path) -> None:
    flavors = run_check(release, [], tmp_path)["flavors"]
    for ours in LLAMA3_FLAVORS:
        theirs = flavors[ours.name]
        assert (theirs["dim"], theirs["n_layers"], theirs["n_heads"], theirs["n_kv_heads"],
                theirs["ffn_dim_multiplier"], theirs["multiple_of"], theirs["vocab_size"]) == (
            ours.dim, ours.n_layers, ours.n_heads, ours.n_kv_heads, ours.ffn_dim_multiplier,
            ours.multiple_of, ours.vocab_size)
        assert theirs["rope_theta"] == 500000
        assert theirs.get("attn_type", "sdpa") == "sdpa" and not theirs.get("use_flex_attn")


@pytest.mark.parametrize("release", sorted(VERSIONS))
def test_the_memory_model_puts_on_each_stage_the_layers_torchtitan_puts_there(
        release: str, tmp_path: Path) -> None:
    """sweep.models.pipeline_stages's "embedding_blocks" split against torchtitan's
    generate_llm_fqn_per_model_part with its default first/last-stage weights, for every stage
    count a 16- and a 32-layer model can take (up to L + 2) and some others."""
    target = REPO / ".contract" / f"torchtitan-{release}"
    if not (target / ".installed").is_file():
        pytest.skip(f"{target} missing: run scripts/contract/torchtitan.sh")
    shapes = {16: get_model("llama-3.2-1b"), 32: get_model("llama-3.1-8b"), 28: get_model("llama-3.2-3b")}
    pairs = [[stages, layers] for layers in shapes for stages in range(2, layers + 3)]
    listing = tmp_path / "pairs.json"
    listing.write_text(json.dumps(pairs))
    done = subprocess.run([sys.executable, str(CHECK), "--stage-layers", str(listing)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(target)})
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    for (stages, layers), built in zip(pairs, theirs, strict=True):
        assert tuple(built) == stage_layer_counts(shapes[layers], stages, "torchtitan"), (stages, layers)


def test_pruned_runs_are_ones_torchtitan_rejects(tmp_path: Path) -> None:
    """Rendering a sample of the pruned-by-framework rows anyway: torchtitan rejects them or
    runs them as something else (the rules are not stricter than torchtitan)."""
    spec, plan = family("bf16", "v0.2", False)
    pruned = plan[(plan["status"] == "pruned:framework")
                  & ~plan["prune_detail"].str.startswith(("torchtitan_no_model_definition",
                                                          "torchtitan_tp_is_sp",
                                                          "torchtitan_cp_shards"))]
    sample = pruned.groupby(["prune_detail", "tp", "pp", "cp", "ep"], observed=True).head(1)
    env = render.make_environment()
    cases = []
    for row in render.kept_rows(sample.assign(status=space.KEPT)):
        config = render.resolve_run(spec, row)
        files = render.render_files(env, config, tmp_path / config.run_id,
                                    ["launch/torchtitan.toml.j2"])
        toml = tmp_path / f"{config.run_id}.toml"
        toml.write_text(files["launch/torchtitan.toml"])
        cases.append({"id": toml.stem, "toml": str(toml),
                      "world_size": config.nodes * config.gpus_per_node,
                      "rule": row["prune_detail"].split(":")[0]})
    assert len(cases) >= 5
    report = run_check("0.2.2", cases, tmp_path)
    rules = {c["id"]: c["rule"] for c in cases}
    accepted = [(r["id"], rules[r["id"]]) for r in report["results"] if not r["errors"]]
    assert not accepted
