"""Every rendered launch/megatron.args passes Megatron's own argument checks, and means its label.

A family of specs (TP, PP, CP, EP with a MoE model, ZeRO 0/1, recompute none/selective/full,
1F1B and interleaved schedules, sequence parallelism on/off, tied and untied embeddings, bf16,
fp8, fp16 and fp32, the overlap settings on and off) is planned and rendered by the real planner
and renderer; a deterministic spread of the kept runs goes, in one subprocess per megatron-core
version, through Megatron's parse_args, validate_args and core_transformer_config_from_args
(contract_check.py, with what a CPU machine lacks stood in, each labelled there). Then what
Megatron made of the arguments is compared with the run's layout. A few hand-broken argument
lists show that the checks are strict.

scripts/contract/megatron.sh installs the versions under .contract/ (scripts/test.sh runs it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from sweep.frameworks.megatron import ADAPTER
from sweep.models.pipeline_stages import stage_layer_counts
from sweep.plan import space

pytestmark = pytest.mark.contract

REPO = Path(__file__).resolve().parents[3]
VERSIONS = ("0.17.1", "0.19.2")
HARNESS = Path(__file__).with_name("contract_check.py")
LAYOUT_AXES = ["model", "tp", "pp", "cp", "ep", "pp_schedule", "sp"]
SETTING_AXES = ["model", "recompute", "zero_stage", "pp_schedule", "nodes"]


def test_tested_versions_are_the_adapters() -> None:
    (supported,) = ADAPTER.versions
    assert supported.tested_with == tuple(f"megatron-core {v}" for v in VERSIONS)


def _family(m: Any) -> list[tuple[Any, dict[str, str]]]:
    """(RunConfig, files) of about 300 runs covering every axis value with every model
    (`m`: the megatron_family helpers)."""
    family_spec, rendered, sample_kept = m.family_spec, m.rendered, m.sample_kept
    runs = []
    bf16 = family_spec("contract-bf16", "bf16")
    plan = space.plan(bf16)
    runs += rendered(bf16, pd.concat([sample_kept(plan, 1, LAYOUT_AXES),
                                      sample_kept(plan, 1, SETTING_AXES)]).drop_duplicates("run_id"))
    for dtype in ("fp8", "fp16", "fp32"):
        spec = family_spec(f"contract-{dtype}", dtype, nodes=(1,))
        runs += rendered(spec, sample_kept(space.plan(spec), 1, ["model", "tp", "pp", "ep", "sp"]))
    for name, settings in (("no-overlap", {"overlap_communication": False}),
                           ("tp-comm-overlap", {"tp_comm_overlap": True})):
        spec = family_spec(f"contract-{name}", "bf16", nodes=(1,), **settings)
        plan = space.plan(spec)
        if name == "tp-comm-overlap":  # the launcher refuses TP without SP (test_templates.py)
            plan = plan[~((plan["tp"] > 1) & ~plan["sp"].astype(bool))]
        runs += rendered(spec, sample_kept(plan, 1, ["model", "tp", "pp", "zero_stage"]))
    return runs


def _key(config: Any) -> str:
    """Run ids name the layout, not the settings: the same layout in two specs has one id."""
    return f"{config.sweep}/{config.run_id}"


def _request(m: Any, config: Any, files: dict[str, str]) -> dict[str, Any]:
    return {"id": _key(config), "argv": m.argv(files["launch/megatron.args"]),
            "env": {**m.exports(files["launch/megatron.sh"]),
                    "WORLD_SIZE": config.layout.world_size, "RANK": 0}}


def _broken(request: dict[str, Any]) -> dict[str, tuple[dict[str, Any], str]]:
    """Argument lists Megatron must reject, made from a real rendered one (id: (run, error))."""
    args = request["argv"]

    def variant(extra: list[str], env: dict[str, Any] | None = None,
                drop: str | None = None) -> dict[str, Any]:
        kept = [a for a in args if a != drop]
        return {**request, "argv": kept + extra, "env": {**request["env"], **(env or {})}}

    return {
        "unknown-flag": (variant(["--overlap-p2p-comm"]), "unrecognized arguments"),
        "param-gather-without-distributed-optimizer": (
            variant(["--overlap-param-gather"], drop="--use-distributed-optimizer"),
            "--overlap-param-gather only supported with distributed optimizer"),
        "tp-comm-overlap-without-sp": (
            variant(["--tp-comm-overlap"], drop="--sequence-parallel"),
            "only when sequence parallelism is enabled"),
        "world-size": (variant([], env={"WORLD_SIZE": 3}), "not divisible"),
        "cuda-device-max-connections": (variant([], env={"CUDA_DEVICE_MAX_CONNECTIONS": "8"}),
                                        "CUDA_DEVICE_MAX_CONNECTIONS to 1"),
    }


@pytest.fixture(scope="module")
def contract(megatron_family: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The family's runs and both versions' verdicts (the two subprocesses run side by side)."""
    missing = [v for v in VERSIONS if not (REPO / ".contract" / f"megatron-{v}" / "megatron"
                                           / "training" / "arguments.py").is_file()]
    if missing:
        pytest.skip(f"megatron-core {', '.join(missing)} not installed: bash scripts/contract/megatron.sh")
    runs = _family(megatron_family)
    requests = [_request(megatron_family, config, files) for config, files in runs]
    base = next(r for c, r in zip(runs, requests, strict=True)
                if c[0].layout.tp == 2 and c[0].layout.zero_stage == 1 and c[0].layout.sp)
    broken = _broken(base)
    payload = requests + [{**run, "id": f"broken:{name}"} for name, (run, _) in broken.items()]
    path = tmp_path_factory.mktemp("megatron-contract") / "requests.json"
    path.write_text(json.dumps(payload))
    processes = {
        version: subprocess.Popen(
            [sys.executable, str(HARNESS), str(path)], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO / ".contract" / f"megatron-{version}")})
        for version in VERSIONS}
    verdicts = {}
    for version, process in processes.items():
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, f"megatron-core {version}: harness failed:\n{err[-3000:]}"
        verdicts[version] = {v["id"]: v for v in json.loads(out)}
    return {"runs": runs, "broken": broken, "verdicts": verdicts}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_rendered_run_passes_megatrons_checks(contract: dict[str, Any], version: str) -> None:
    runs, verdicts = contract["runs"], contract["verdicts"][version]
    assert len(runs) > 250
    failed = [(_key(c), c.layout.label(), verdicts[_key(c)]["error"])
              for c, _ in runs if not verdicts[_key(c)]["ok"]]
    assert not failed, f"megatron-core {version} rejects {len(failed)} runs, e.g. {failed[:3]}"


def _expected(config: Any) -> dict[str, Any]:
    """What Megatron should make of a run, from its label and settings alone."""
    layout, s, dtype = config.layout, config.settings, config.dtype
    return {
        "tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "ep": layout.ep,
        "data_parallel_size": layout.dp * layout.ep, "vpp": layout.vpp,
        "sp": layout.sp and layout.tp > 1, "distributed_optimizer": layout.zero_stage == 1,
        "recompute": layout.recompute, "micro_batches": layout.grad_acc,
        "params_dtype": {"bf16": "bfloat16", "fp8": "bfloat16", "fp16": "float16"}.get(dtype,
                                                                                      "float32"),
        "fp8": "hybrid" if dtype == "fp8" else None,
        "overlap_grad_reduce": s["overlap_communication"],
        "overlap_param_gather": s["overlap_communication"] and layout.zero_stage == 1,
        "tp_comm_overlap": s["tp_comm_overlap"] and layout.sp and layout.tp > 1,
        "num_experts": config.model.num_experts, "untied": not config.model.tie_word_embeddings,
    }


@pytest.mark.parametrize("version", VERSIONS)
def test_megatron_runs_what_the_label_says(contract: dict[str, Any], version: str) -> None:
    verdicts = contract["verdicts"][version]
    for config, _ in contract["runs"]:
        assert verdicts[_key(config)]["resolved"] == _expected(config), \
            (_key(config), config.layout.label())


@pytest.mark.parametrize("version", VERSIONS)
def test_the_memory_model_puts_on_each_stage_the_layers_megatron_builds_there(
        contract: dict[str, Any], version: str) -> None:
    """sweep.models.pipeline_stages's "megatron" split against get_num_layers_to_build on every
    pipeline rank, summed over its virtual stages (the loss, then the embedding, counted as a layer
    where the rendered flags say so)."""
    verdicts = contract["verdicts"][version]
    checked = accounted = interleaved = 0
    for config, _ in contract["runs"]:
        built = verdicts[_key(config)]["layers_per_stage"]
        assert tuple(built) == stage_layer_counts(config.model, config.layout.pp, "megatron"), \
            (_key(config), config.model.num_layers, config.layout.label())
        layout = config.layout
        checked += layout.pp > 1
        accounted += config.model.num_layers % (layout.pp * layout.vpp) != 0
        interleaved += layout.vpp > 1
    assert checked > 50 and accounted > 0 and interleaved > 0


def test_the_family_covers_every_axis_value(contract: dict[str, Any],
                                             megatron_family: Any) -> None:
    """The sample is a spread, not the first few rows: every value of every axis, every model."""
    runs = contract["runs"]
    layouts = [c.layout for c, _ in runs]
    assert {c.model.name for c, _ in runs} == {m["name"] for m in megatron_family.MODELS}
    assert {(ln.tp, ln.pp, ln.cp, ln.ep) for ln in layouts} >= {(4, 1, 1, 1), (1, 4, 1, 1),
                                                            (1, 1, 2, 1), (1, 1, 1, 4)}
    assert {ln.zero_stage for ln in layouts} == {0, 1}
    assert {ln.recompute for ln in layouts} == {"none", "selective", "full"}
    assert {ln.pp_schedule for ln in layouts if ln.pp > 1} == {"1f1b", "interleaved_1f1b"}
    assert {ln.sp for ln in layouts if ln.tp > 1} == {True, False}
    assert {c.dtype for c, _ in runs} == {"bf16", "fp8", "fp16", "fp32"}
    assert any("--account-for-loss-in-pipeline-split" in f["launch/megatron.args"]
               and "--account-for-embedding-in-pipeline-split" in f["launch/megatron.args"]
               for _, f in runs)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_checks_reject_what_megatron_rejects(contract: dict[str, Any], version: str) -> None:
    verdicts = contract["verdicts"][version]
    for name, (_, error) in contract["broken"].items():
        verdict = verdicts[f"broken:{name}"]
        assert not verdict["ok"] and error in verdict["error"], (name, verdict)
