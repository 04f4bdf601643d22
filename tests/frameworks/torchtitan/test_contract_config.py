"""Rendered torchtitan 0.3.0 and main runs, read by torchtitan's own ConfigManager, ParallelDims and
model config validation (tests/frameworks/torchtitan/contract_check_config.py, in a subprocess).

A representative family is planned by the real planner and rendered by the real renderer for
`v0.3` and for `main`: a dense Llama (8B), a tied dense Llama (1B) and a MoE model (Mixtral 8x7B:
SwiGLU experts, top-2 softmax routing, GQA); TP with and without SP, PP with each schedule, CP,
EP, ZeRO-0/2/3, recompute none/selective/full, bf16/fp8/fp32, compile on and off. A deterministic
sample of the kept runs (one per distinct combination of what the module encodes) goes through
torchtitan's own code as the job starts it (`--module/--config`); each must parse, pass and say
what its row says (degrees, schedule, micro-batches, AC mode, dtype, the model's dimensions, and
the parameter count of the model torchtitan builds). Negative tests show the check can fail:
runs the capability rules prune are rejected by torchtitan when rendered anyway, and a module
edited to say something else is caught.

torchtitan 0.3.0 comes from .contract/torchtitan-0.3.0 (scripts/contract/torchtitan.sh). main is
not on PyPI and GitHub is not reachable from CI: its tests run from a checkout named by
SWEEP_TORCHTITAN_MAIN (at b5bcd76c6), with the same folder's dependencies behind it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sweep.core.model import count_parameters
from sweep.frameworks.torchtitan.version import MAIN_PIN, key_for_checkout
from sweep.plan import render, space
from sweep.plan.spec import parse_spec

pytestmark = pytest.mark.contract

REPO = Path(__file__).resolve().parents[3]
CHECK = Path(__file__).with_name("contract_check_config.py")
DEPS = REPO / ".contract" / "torchtitan-0.3.0"
MAIN_ENV = "SWEEP_TORCHTITAN_MAIN"
HOW_TO_RUN_MAIN = (f"set {MAIN_ENV} to a torchtitan main checkout at {MAIN_PIN[:9]} (git clone "
                   f"https://github.com/pytorch/torchtitan && git -C torchtitan checkout "
                   f"{MAIN_PIN[:9]}; an export of its torchtitan/ and assets/ also works), run "
                   f"scripts/contract/torchtitan.sh for its dependencies, then "
                   f"`{MAIN_ENV}=/path/to/torchtitan .venv/bin/pytest -m contract "
                   f"tests/frameworks/torchtitan/test_contract_config.py`")
SPEC = """
name: tt-contract-03
framework: torchtitan
models: [llama-3.1-8b, llama-3.2-1b, mixtral-8x7b]
nodes: [1, 2]
gpus_per_node: 8
seq_len: 4096
dtype: {dtype}
global_batch: {{sequences: 64}}
axes: {{cp: [1, 2], ep: [1, 2, 4], zero_stage: [0, 2, 3], recompute: [none, selective, full],
        sp: [true, false], pp_schedule: [1f1b, gpipe, interleaved_1f1b]}}
run: {{framework_dir: /opt/torchtitan, steps: 20, seed: 7, compile: {compile},
       framework_version: {version}, moe: {{load_balance_coeff: {coeff},
       force_load_balance: {force}}}}}
"""
# One sampled run per distinct combination of these columns (about 150 runs: torchtitan's
# ConfigManager and checks take about 0.4 s a run, after 15 s of imports).
SAMPLE_BY = {"bf16": ["model", "zero_stage", "pp_schedule", "cp", "ep", "recompute"],
             "fp8": ["model", "zero_stage", "pp_schedule", "ep"],
             "fp32": ["model", "pp_schedule", "tp", "sp"]}
FAMILIES = (("bf16", False, "0.001", "false"), ("fp8", True, "0.002", "true"),
            ("fp32", False, "null", "false"))
SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved_1f1b": "Interleaved1F1B"}


def family(dtype: str, version: str, compile_: bool, coeff: str, force: str) -> tuple[Any, Any]:
    spec = parse_spec(SPEC.format(dtype=dtype, version=version, compile=str(compile_).lower(),
                                  coeff=coeff, force=force))
    return spec, space.plan(spec)


def render_case(env: Any, spec: Any, row: dict[str, Any], tmp: Path, tag: str) -> dict[str, Any]:
    config = render.resolve_run(spec, row)
    files = render.render_files(env, config, tmp / config.run_id,
                                ["launch/torchtitan.config.py.j2"])
    module = tmp / f"{tag}-{config.run_id}.py"
    module.write_text(files["launch/torchtitan.config.py"])
    return {"id": module.stem, "module": str(module), "model_key": f"{config.model.name}-{tag}",
            "world_size": config.nodes * config.gpus_per_node, "config": config}


def rendered_cases(tmp: Path, version: str) -> list[dict[str, Any]]:
    """The sampled kept runs of the bf16, fp8 and fp32 families, rendered into tmp."""
    env = render.make_environment()
    cases = []
    for dtype, compile_, coeff, force in FAMILIES:
        spec, plan = family(dtype, version, compile_, coeff, force)
        kept = plan[plan["status"] == space.KEPT]
        sample = kept.groupby(SAMPLE_BY[dtype], observed=True).head(1)
        for row in render.kept_rows(sample):
            case = render_case(env, spec, row, tmp, dtype)
            case.update(dtype=dtype, compile=compile_, coeff=None if coeff == "null" else float(coeff),
                        force=force == "true")
            cases.append(case)
    return cases


def run_check(cases: list[dict[str, Any]], tmp: Path, checkout: Path | None) -> dict[str, Any]:
    if not (DEPS / ".installed").is_file():
        pytest.skip(f"{DEPS} missing: run scripts/contract/torchtitan.sh")
    listing = tmp / "cases.json"
    listing.write_text(json.dumps([{k: c[k] for k in ("id", "module", "world_size", "model_key")}
                                   for c in cases]))
    path = os.pathsep.join([*([str(checkout)] if checkout else []), str(DEPS)])
    done = subprocess.run([sys.executable, str(CHECK), str(listing)], capture_output=True,
                          text=True, timeout=900, env={**os.environ, "PYTHONPATH": path})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    expected_root = (checkout / "torchtitan") if checkout else DEPS / "torchtitan"
    assert Path(report["torchtitan"]) == expected_root  # the torchtitan under test, not another
    return report


def expected(case: dict[str, Any]) -> dict[str, Any]:
    layout, model = case["config"].layout, case["config"].model
    fsdp = layout.zero_stage > 0
    replicas = layout.dp * layout.ep
    want: dict[str, Any] = {
        "dp_replicate": 1 if fsdp else replicas, "dp_shard": replicas if fsdp else 1,
        "tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "ep": layout.ep,
        "sp": bool(layout.sp) or layout.tp == 1,
        "reshard": ("always" if layout.zero_stage == 3 else "never") if fsdp else "default",
        "schedule": SCHEDULES[layout.pp_schedule] if layout.pp > 1 else None,
        "ac": {"none": None, "selective": "SelectiveAC", "full": "FullAC"}[layout.recompute],
        "seq_len": 4096, "global_batch": 64, "mbs": layout.mbs,
        "pp_microbatches": layout.grad_acc if layout.pp > 1 else 1,
        "grad_accumulation": 1 if layout.pp > 1 else layout.grad_acc,
        "compile": case["compile"], "steps": 20, "seed": 7, "log_freq": 1, "checkpoint": False,
        "mixed_precision_param": "float32" if case["dtype"] == "fp32" else "bfloat16",
        "dtype": "float32", "loss": "ChunkedLossWrapper.Config",
        "cuda_graphs": layout.pp == 1 and layout.ep == 1,
        "float8": case["dtype"] == "fp8",
        "layers": model.num_layers, "dim": model.hidden_size, "vocab": model.vocab_size,
        "tied": model.tie_word_embeddings, "heads": model.num_attention_heads,
        "kv_heads": model.num_kv_heads, "head_dim": model.head_dim, "qk_norm": False,
        "attention": "FlexAttention.Config",
        "nparams": count_parameters(model).total,
    }
    if model.num_experts:
        want.update(experts=model.num_experts, top_k=model.experts_per_token,
                    expert_hidden=model.moe_ffn_hidden_size, score_func="softmax",
                    route_norm=True, load_balance_coeff=case["coeff"],
                    force_load_balance=case["force"])
    else:
        want.update(ffn_hidden=model.ffn_hidden_size, force_load_balance=False)
    return want


def assert_family_passes(cases: list[dict[str, Any]], report: dict[str, Any]) -> None:
    by_id = {c["id"]: c for c in cases}
    failures = [(r["id"], r["errors"]) for r in report["results"] if r["errors"]]
    assert not failures, failures[:5]
    for result in report["results"]:
        want = expected(by_id[result["id"]])
        got = {k: result["parsed"].get(k) for k in want}
        assert got == want, result["id"]
    layouts = [c["config"].layout for c in cases]
    assert {lay.pp_schedule for lay in layouts if lay.pp > 1} == set(SCHEDULES)
    assert {lay.zero_stage for lay in layouts} == {0, 2, 3}
    assert {lay.recompute for lay in layouts} == {"none", "selective", "full"}
    assert any(lay.cp > 1 for lay in layouts) and any(lay.ep > 1 for lay in layouts)
    assert any(lay.tp > 1 and not lay.sp for lay in layouts)
    assert {c["config"].model.name for c in cases} == {"llama-3.1-8b", "llama-3.2-1b",
                                                       "mixtral-8x7b"}


@pytest.fixture(scope="module")
def main_checkout() -> Path:
    value = os.environ.get(MAIN_ENV)
    if not value:
        pytest.skip(f"torchtitan main is not on PyPI and GitHub is not reachable here: "
                    f"{HOW_TO_RUN_MAIN}")
    root = Path(value).expanduser().resolve()
    key, problem = key_for_checkout(root)
    assert key == "main", f"{MAIN_ENV}={root}: {problem}"
    return root


def test_rendered_0_3_0_runs_pass_torchtitans_own_config_and_validators(tmp_path: Path) -> None:
    cases = rendered_cases(tmp_path, "v0.3")
    assert len(cases) > 100
    report = run_check(cases, tmp_path, None)
    assert not any(r["parsed"]["main"] for r in report["results"])
    assert_family_passes(cases, report)


def test_rendered_main_runs_pass_mains_own_config_and_validators(
        tmp_path: Path, main_checkout: Path) -> None:
    cases = rendered_cases(tmp_path, "main")
    assert len(cases) > 100
    report = run_check(cases, tmp_path, main_checkout)
    assert all(r["parsed"]["main"] for r in report["results"])
    assert_family_passes(cases, report)


# Rules whose runs torchtitan itself rejects (the others are runs torchtitan would start, as
# something other than their label: ZeRO-0 with CP or EP, expert TP against the label, or that
# fail only once data flows: a vocabulary below the tokenizer's). The family prunes by the first
# three; the interleaved rules' rows (vpp other than 2, micro-batches not a multiple of the
# rounds) are not among its candidates.
REJECTED_BY_TORCHTITAN = ("torchtitan_pp_tied_embeddings", "torchtitan_seq_len_divisor_v03",
                          "torchtitan_1f1b_microbatches", "torchtitan_interleaved_rounds",
                          "torchtitan_interleaved_stages")
IN_THE_FAMILY = set(REJECTED_BY_TORCHTITAN[:3])


def pruned_cases(tmp: Path, version: str) -> list[dict[str, Any]]:
    """A sample of the rows each torchtitan-rejected rule prunes, rendered anyway."""
    env = render.make_environment()
    cases = []
    for seq_len in (4096, 4100):  # 4100: the sequence does not split over TP with SP or 2·CP
        spec, plan = family("bf16", version, False, "0.001", "false")
        if seq_len != 4096:
            spec = parse_spec(SPEC.format(dtype="bf16", version=version, compile="false",
                                          coeff="0.001", force="false").replace(
                "seq_len: 4096", f"seq_len: {seq_len}"))
            plan = space.plan(spec)
        rule = plan["prune_detail"].str.split(":").str[0]
        pruned = plan[(plan["status"] == "pruned:framework") & rule.isin(REJECTED_BY_TORCHTITAN)]
        sample = pruned.assign(rule=rule).groupby(["rule", "model", "pp", "cp"],
                                                  observed=True).head(1)
        for row in render.kept_rows(sample.assign(status=space.KEPT)):
            case = render_case(env, spec, row, tmp, f"pruned{seq_len}")
            case["rule"] = row["rule"]
            cases.append(case)
    return cases


def assert_pruned_are_rejected(cases: list[dict[str, Any]], report: dict[str, Any]) -> None:
    assert {c["rule"] for c in cases} == IN_THE_FAMILY
    rules = {c["id"]: c["rule"] for c in cases}
    accepted = [(r["id"], rules[r["id"]]) for r in report["results"] if not r["errors"]]
    assert not accepted


def test_runs_0_3_rules_prune_are_ones_torchtitan_0_3_0_rejects(tmp_path: Path) -> None:
    cases = pruned_cases(tmp_path, "v0.3")
    assert_pruned_are_rejected(cases, run_check(cases, tmp_path, None))


def test_runs_0_3_rules_prune_are_ones_main_rejects(tmp_path: Path, main_checkout: Path) -> None:
    cases = pruned_cases(tmp_path, "main")
    assert_pruned_are_rejected(cases, run_check(cases, tmp_path, main_checkout))


def test_the_check_catches_a_module_that_says_something_else(tmp_path: Path) -> None:
    """The same module edited by hand: TP 3 does not divide the heads (torchtitan rejects it),
    and a tensor-parallel degree swapped with the data-parallel one (torchtitan accepts it, the
    comparison with the row does not)."""
    spec, plan = family("bf16", "v0.3", False, "0.001", "false")
    kept = plan[(plan["status"] == space.KEPT) & (plan["model"] == "llama-3.1-8b")
                & (plan["tp"] == 2) & (plan["dp"] == 4) & (plan["pp"] == 1) & (plan["cp"] == 1)
                & (plan["ep"] == 1) & (plan["zero_stage"] == 3) & (plan["nodes"] == 1)]
    env = render.make_environment()
    case = render_case(env, spec, render.kept_rows(kept.head(1))[0], tmp_path, "edited")
    case.update(dtype="bf16", compile=False, coeff=0.001, force=False)
    text = Path(case["module"]).read_text()
    assert "tensor_parallel_degree=2," in text and "data_parallel_shard_degree=4," in text
    bad_tp = {**case, "id": "bad-tp", "module": str(tmp_path / "bad_tp.py"), "world_size": 12}
    Path(bad_tp["module"]).write_text(text.replace("tensor_parallel_degree=2,",
                                                   "tensor_parallel_degree=3,"))
    swapped = {**case, "id": "swapped", "module": str(tmp_path / "swapped.py")}
    Path(swapped["module"]).write_text(
        text.replace("tensor_parallel_degree=2,", "tensor_parallel_degree=4,")
            .replace("data_parallel_shard_degree=4,", "data_parallel_shard_degree=2,"))
    report = run_check([bad_tp, swapped], tmp_path, None)
    results = {r["id"]: r for r in report["results"]}
    assert any("n_heads" in e or "n_kv_heads" in e for e in results["bad-tp"]["errors"])
    assert not results["swapped"]["errors"]
    got = {k: results["swapped"]["parsed"][k] for k in ("tp", "dp_shard")}
    assert got != {k: expected(swapped)[k] for k in ("tp", "dp_shard")}
