"""The adapter registry: every framework is one folder that says what it can run, and how."""

from __future__ import annotations

import numpy as np
import pytest

from sweep.core.layout import FRAMEWORKS, ZERO_STAGES
from sweep.core.model import ModelShape
from sweep.frameworks import ADAPTER_MODULES, all_adapters, get_adapter
from sweep.frameworks.base import CapabilityContext
from sweep.frameworks.capability_check import capability_failures
from sweep.frameworks.log_parser import LogParser

SMALL = ModelShape(name="small", num_layers=8, hidden_size=1024, num_attention_heads=16,
                   num_kv_heads=16, ffn_hidden_size=4096, vocab_size=32000,
                   tie_word_embeddings=False)


def test_every_framework_the_spec_accepts_has_an_adapter() -> None:
    assert set(ADAPTER_MODULES) == set(FRAMEWORKS)
    assert [a.name for a in all_adapters()] == list(ADAPTER_MODULES)


@pytest.mark.parametrize("name", ADAPTER_MODULES)
def test_an_adapter_names_its_parser_versions_and_zero_stages(name: str) -> None:
    adapter = get_adapter(name)
    assert isinstance(adapter.parser(), LogParser)
    assert adapter.parser().framework == name
    assert adapter.version(None).key == adapter.default_version
    assert adapter.zero_stages[0] == 0 and set(adapter.zero_stages) <= set(ZERO_STAGES)
    assert len({v.key for v in adapter.versions}) == len(adapter.versions)
    with pytest.raises(ValueError, match="no supported version"):
        adapter.version("no-such-version")


@pytest.mark.parametrize("name", ADAPTER_MODULES)
def test_an_adapter_says_how_its_runs_report_and_where_its_version_comes_from(name: str) -> None:
    """What the watchdog, collect, provenance and the throughput model ask of a framework, the
    adapter answers: no module outside sweep/frameworks/ names one."""
    import importlib.util

    from sweep.job.provenance import PACKAGES
    from sweep.models.traffic import traffic_for

    adapter = get_adapter(name)
    version_module = importlib.util.find_spec(f"sweep.frameworks.{name}.version")
    # a framework of its own checkout is found by its version module; the bundled one is ours
    assert adapter.bundled == (version_module is None) == (adapter.entry_point == "")
    assert adapter.package in ("", *PACKAGES)  # env.json records the package's version
    assert adapter.bundled or adapter.package
    # only our own workload writes metrics.jsonl; a framework's step records are its log lines
    assert adapter.writes_metrics_file == adapter.bundled
    assert traffic_for(adapter.kernels).name in ("fused", "builtin")
    assert adapter.grad_reduce_bytes in (2, 4)


@pytest.mark.parametrize("name", ADAPTER_MODULES)
def test_every_capability_rule_gives_a_reason_and_a_source_and_a_mask(name: str) -> None:
    adapter = get_adapter(name)
    columns = {k: np.array([v, v], dtype=np.int64) for k, v in
               dict(dp=2, tp=2, pp=2, cp=1, ep=1, mbs=1, grad_acc=8, zero_stage=1, vpp=1,
                    nodes=1, gpus=8).items()}
    columns |= {"sp": np.array([True, True]), "recompute": np.array(["none", "full"]),
                "pp_schedule": np.array(["1f1b", "1f1b"])}
    for version in adapter.versions:
        ctx = CapabilityContext(model=SMALL, dtype="bf16", seq_len=2048, gpus_per_node=8,
                                global_batch_sequences=32, framework_version=version.key)
        for rule in adapter.capabilities:
            assert rule.name and rule.reason and rule.source, rule
            mask = np.asarray(rule.fails(columns, ctx))
            assert mask.dtype == bool and mask.shape in ((2,), ()), rule.name
        failed, first = capability_failures(adapter, columns, ctx)
        assert failed.shape == first.shape == (2,)


def test_an_unknown_framework_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="known frameworks"):
        get_adapter("deepspeed")


def test_sweep_frameworks_prints_every_version_and_rule(capsys: pytest.CaptureFixture[str]) -> None:
    from sweep.cli import main

    assert main(["frameworks", "--capabilities"]) == 0
    printed = capsys.readouterr().out
    for adapter in all_adapters():
        for version in adapter.versions:
            assert f"`{version.key}`" in printed
        for rule in adapter.capabilities:
            assert f"| {adapter.name} | `{rule.name}` |" in printed


def test_the_planner_prunes_what_the_framework_cannot_run_and_says_why() -> None:
    """Megatron has no GPipe schedule: a gpipe row would run 1F1B under a gpipe label."""
    from sweep.plan import space
    from sweep.plan.plan_summary import framework_prunes
    from sweep.plan.spec import parse_spec

    spec = parse_spec("""
name: caps
framework: megatron
models: [playbook-8b]
nodes: [1]
seq_len: 4096
global_batch: {sequences: 64}
axes: {tp: [1, 2], pp: [1, 2], mbs: [1], zero_stage: [1], pp_schedule: [1f1b, gpipe]}
""")
    frame = space.plan(spec)
    gpipe = frame[(frame["pp"] > 1) & (frame["pp_schedule"] == "gpipe")]
    assert len(gpipe) and (gpipe["status"] == "pruned:framework").all()
    assert gpipe["prune_detail"].str.startswith("gpipe_schedule: ").all()
    assert "GPipe" in str(gpipe["prune_detail"].iloc[0])
    others = frame[~frame["status"].isin(["pruned:framework", "pruned:memory"])]
    assert others["prune_detail"].isna().all()
    by_memory = frame[frame["status"] == "pruned:memory"]  # the limit and its source
    assert by_memory["prune_detail"].str.startswith(
        "memory: the predicted peak per rank is over ").all()
    assert by_memory["prune_detail"].str.endswith("(the catalog's h100-sxm)").all()
    assert all("memory:" not in line for line in framework_prunes(spec, frame))
    assert (frame["status"] == "kept").any()


@pytest.mark.parametrize("name", ADAPTER_MODULES)
def test_an_adapter_names_its_memory_profile_and_places_pipeline_stages(name: str) -> None:
    adapter = get_adapter(name)
    assert adapter.memory_profile.name == name
    assert adapter.pipeline_fits(SMALL, 1) and adapter.pipeline_fits(SMALL, 2)
    assert not adapter.pipeline_fits(SMALL, SMALL.num_layers + 10)  # more stages than blocks
