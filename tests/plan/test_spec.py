"""The spec: what it accepts, and the located errors it gives for what it does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweep.models.memory_profiles import RESERVED_BAND
from sweep.plan.spec import SpecError, load_spec, parse_spec
from tests.specs import MINIMAL_SPEC as MINIMAL


def error_of(text: str) -> SpecError:
    with pytest.raises(SpecError) as caught:
        parse_spec(text, "spec.yaml")
    return caught.value


def test_minimal_spec_takes_sensible_defaults() -> None:
    spec = parse_spec(MINIMAL)
    assert spec.framework == "builtin" and spec.gpu == "h100-sxm"
    assert spec.gpus_per_node_resolved == 8 and spec.max_tp == 8
    assert spec.zero_stages == (0, 1, 2, 3)
    assert spec.global_batch_sequences == 256
    assert spec.axes.recompute == ["none"] and spec.axes.sp == [True]


def test_global_batch_in_tokens_is_converted_to_sequences() -> None:
    spec = parse_spec(MINIMAL.replace("{sequences: 256}", "{tokens: 1048576}"))
    assert spec.global_batch_sequences == 256


def test_framework_restricts_zero_stages() -> None:
    assert parse_spec(MINIMAL + "framework: nanotron\n").zero_stages == (0, 1)
    error = error_of(MINIMAL + "framework: nanotron\naxes: {zero_stage: [3]}\n")
    assert error.field == "axes.zero_stage" and error.line == 7 and "[0, 1]" in error.message


def test_spec_hash_ignores_key_order() -> None:
    reordered = "seq_len: 4096\n" + MINIMAL.replace("seq_len: 4096\n", "")
    assert parse_spec(MINIMAL).spec_hash() == parse_spec(reordered).spec_hash()
    assert parse_spec(MINIMAL).spec_hash() != parse_spec(MINIMAL.replace("[1, 2]", "[1]")).spec_hash()


@pytest.mark.parametrize("text, field, line, fragment", [
    (MINIMAL.replace("playbook-1b", "gpt-9"), "models[0]", 2, "unknown model 'gpt-9'"),
    (MINIMAL + "gpu: tpu-v9\n", "gpu", 6, "unknown GPU type"),
    (MINIMAL.replace("[1, 2]", "[0, 2]"), "nodes[0]", 3, "greater than 0"),
    (MINIMAL.replace("[1, 2]", "[-4]"), "nodes[0]", 3, "greater than 0"),
    (MINIMAL.replace("sequences: 256", "sequences: 0"), "global_batch.sequences", 5, "greater than 0"),
    (MINIMAL.replace("seq_len: 4096", "seq_len: -1"), "seq_len", 4, "greater than 0"),
    (MINIMAL.replace("{sequences: 256}", "{tokens: 1000}"), "global_batch.tokens", 5, "multiple of seq_len"),
    (MINIMAL + "axes: {recompute: [sometimes]}\n", "axes.recompute[0]", 6, "'none', 'selective' or 'full'"),
    (MINIMAL + "nodez: [1]\n", "nodez", 6, "unknown field"),
    (MINIMAL + "run: {time_limit: soon}\n", "run.time_limit", 6, "HH:MM:SS"),
    (MINIMAL + "run: {time_limit: '00:02:00'}\n", "run", 6,
     "signal_before_s (120 s) must be shorter than time_limit (00:02:00 = 120 s)"),
    (MINIMAL + "overrides:\n  - where: {tp: 2}\n    set: {time_limit: soon}\n", "overrides[0].set", 8,
     "time_limit: use Slurm's format"),
    (MINIMAL + "overrides:\n  - where: {tp: 2}\n    set: {partiton: gpu}\n", "overrides[0].set", 8,
     "unknown field 'partiton': did you mean 'partition'?"),
])
def test_bad_specs_are_located(text: str, field: str, line: int, fragment: str) -> None:
    error = error_of(text)
    assert (error.field, error.line) == (field, line)
    assert fragment in error.message
    assert str(error).startswith(f"spec.yaml:{line}: {field}: ")


@pytest.mark.parametrize("hostile", [
    "name: 'x; rm -rf /'",
    "name: '$(reboot)'",
    "name: \"a`id`\"",
    "name: \"a\\nb\"",
])
def test_hostile_names_are_rejected(hostile: str) -> None:
    error = error_of(MINIMAL.replace("name: demo", hostile))
    assert error.field == "name" and "not allowed" in error.message


@pytest.mark.parametrize("setting", [
    "partition: 'gpu; reboot'", "account: '$(id)'", "qos: 'a b'", "exclude: ['node1`id`']",
    "framework_dir: '/opt/x; rm'", "env: {'BAD NAME': x}",
])
def test_values_that_reach_the_shell_are_checked(setting: str) -> None:
    error = error_of(MINIMAL + f"run: {{{setting}}}\n")
    assert error.field.startswith("run.")


def test_inline_model_shape_is_validated() -> None:
    text = MINIMAL.replace("models: [playbook-1b]", """models:
  - name: mini
    num_layers: 2
    hidden_size: 64
    num_attention_heads: 4
    num_kv_heads: 3
    ffn_hidden_size: 128
    vocab_size: 100""")
    error = error_of(text)
    assert error.field == "models[0]" and "num_kv_heads" in error.message


def test_overrides_change_run_settings_for_matching_runs_only() -> None:
    spec = parse_spec(MINIMAL + "overrides:\n  - where: {mbs: 8}\n    set: {rank_memory_limit_mb: 500}\n")
    assert spec.run_settings_for({"mbs": 8}).rank_memory_limit_mb == 500
    assert spec.run_settings_for({"mbs": 4}).rank_memory_limit_mb is None


def test_two_overrides_that_clash_on_one_run_are_a_spec_error_naming_both() -> None:
    spec = parse_spec(MINIMAL + "overrides:\n  - where: {mbs: 8}\n    set: {time_limit: '00:05:00'}\n"
                                "  - where: {tp: 2}\n    set: {signal_before_s: 400}\n")
    assert spec.run_settings_for({"mbs": 8, "tp": 1}).time_limit == "00:05:00"
    assert spec.run_settings_for({"mbs": 4, "tp": 2}).signal_before_s == 400
    with pytest.raises(SpecError) as caught:
        spec.run_settings_for({"model": "playbook-1b", "nodes": 2, "mbs": 8, "tp": 2})
    assert caught.value.field == "overrides[0, 1]"
    assert "signal_before_s (400 s) must be shorter than time_limit (00:05:00 = 300 s)" in caught.value.message


def test_unreadable_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(bad)


def test_example_specs_are_valid(repo_root: Path) -> None:
    for path in sorted((repo_root / "examples").glob("*.yaml")):
        load_spec(path)


def test_early_stop_is_off_by_default_and_absent_from_the_dumped_settings() -> None:
    spec = parse_spec(MINIMAL)
    assert spec.run.early_stop is None and "early_stop" not in spec.run.model_dump(mode="json")
    explicit_off = parse_spec(MINIMAL + "run: {early_stop: null}\n")
    assert explicit_off.spec_hash() == spec.spec_hash()


def test_early_stop_settings_reach_the_run_settings() -> None:
    spec = parse_spec(MINIMAL + "run: {steps: 40, early_stop: {window: 5, max_cv: 0.02, min_steps: 12}}\n")
    assert spec.run.model_dump(mode="json")["early_stop"] == {"window": 5, "max_cv": 0.02, "min_steps": 12}
    assert spec.spec_hash() != parse_spec(MINIMAL).spec_hash()


@pytest.mark.parametrize("early_stop, field, fragment", [
    ("{window: 1, max_cv: 0.02}", "run.early_stop.window", "greater than or equal to 2"),
    ("{window: 5, max_cv: 0}", "run.early_stop.max_cv", "greater than 0"),
    ("{window: 5}", "run.early_stop.max_cv", "Field required"),
    ("{window: 5, max_cv: 0.1, min_steps: -1}", "run.early_stop.min_steps", "greater than or equal to 0"),
    ("{window: 5, max_cv: 0.1, cv: 3}", "run.early_stop.cv", "unknown field"),
    ("{window: 10, max_cv: 0.1}", "run.early_stop", "must fit in steps (10)"),
    ("{window: 5, max_cv: 0.1, min_steps: 11}", "run.early_stop", "must fit in steps (10)"),
])
def test_bad_early_stop_settings_name_their_field(early_stop: str, field: str, fragment: str) -> None:
    error = error_of(MINIMAL + f"run:\n  early_stop: {early_stop}\n")
    assert error.field == field and error.line == 7 and fragment in error.message


def test_a_framework_version_must_be_one_the_adapter_renders_for() -> None:
    error = error_of(MINIMAL + "framework: megatron\nrun: {framework_version: core_r0.11}\n")
    assert "run.framework_version" in error.message or error.field.startswith("run")
    assert "core_r0.17+" in error.message  # names what it may be


@pytest.mark.parametrize("setting, fragment", [
    ("setup: [\"module load cuda\\nrm -rf /\"]", "one non-empty shell line"),
    ("setup: ['  ']", "one non-empty shell line"),
    ("container_mounts: ['/data:/data:rw;id']", "SRC[:DST[:ro|rw]]"),
    ("container_image: 'nvcr.io/nvidia/pytorch:25.01-py3 $(id)'", "image names"),
])
def test_cluster_environment_settings_are_checked(setting: str, fragment: str) -> None:
    error = error_of(MINIMAL + f"run: {{{setting}}}\n")
    assert error.field.startswith("run.") and fragment in error.message


def test_a_misspelt_key_is_named_with_a_suggestion_not_reported_as_a_missing_field() -> None:
    error = error_of(MINIMAL.replace("global_batch:", "global_bach:"))
    assert error.field == "global_bach" and error.line == 5
    assert "did you mean 'global_batch'" in error.message
    nested = error_of(MINIMAL + "run: {stpes: 3}\n")
    assert nested.field == "run.stpes" and "did you mean 'steps'" in nested.message


def test_a_key_in_the_wrong_section_is_told_where_it_belongs() -> None:
    """Not 'did you mean' its own name: the section that holds it."""
    error = error_of(MINIMAL + "framework_version: main\n")
    assert error.field == "framework_version"
    assert error.message == ("unknown field 'framework_version' at the top level: it belongs "
                             "under `run:` (run.framework_version); move it there (docs/spec.md "
                             "lists every field)")
    nested = error_of(MINIMAL + "run: {max_tp: 4}\n")
    assert nested.field == "run.max_tp"
    assert "in run: it belongs under `constraints:` (constraints.max_tp)" in nested.message
    both = error_of(MINIMAL + "partition: cpu\n")
    assert "under `run:` (run.partition) or under `driver:` (driver.partition)" in both.message
    deeper = error_of(MINIMAL + "window: 5\n")
    assert "under `run.early_stop:` (run.early_stop.window)" in deeper.message
    override = error_of(MINIMAL + "overrides:\n  - where: {nodes: 1}\n    set: {max_tp: 4}\n")
    assert "it belongs under `constraints:` (constraints.max_tp)" in override.message
    for message in (error.message, nested.message, override.message):
        assert "did you mean" not in message and "README" not in message
    misspelt = error_of(MINIMAL + "run: {framework_versio: main}\n")
    assert "did you mean 'framework_version'?; check the spelling against the spec reference " \
           "(docs/spec.md)" in misspelt.message


ALLOCATOR = "constraints:\n  allocator: {sequential: 0.2, pipelined: 0.5, logits: 0.25, floor_mib: 512}\n"


def test_allocator_constants_in_the_spec_replace_the_profiles_own() -> None:
    from sweep.core.units import MiB
    from sweep.models.memory_profiles import get_profile

    shipped = parse_spec(MINIMAL)
    assert shipped.memory_profile == get_profile("builtin")
    own = parse_spec(MINIMAL + ALLOCATOR).memory_profile
    assert (own.fragmentation_sequential, own.fragmentation_pipelined, own.fragmentation_logits,
            own.reserved_floor_bytes) == (0.2, 0.5, 0.25, 512 * MiB)
    assert own.weight_bytes == shipped.memory_profile.weight_bytes  # only the four constants change
    # unset is absent, so the hashes of specs that never set it stay as they were
    assert "allocator" not in shipped.model_dump(mode="json")["constraints"]
    assert parse_spec(MINIMAL + ALLOCATOR).spec_hash() != shipped.spec_hash()
    # no band of their own: the probes keep the shipped constants' left-out band
    assert parse_spec(MINIMAL + ALLOCATOR).reserved_band == RESERVED_BAND == shipped.reserved_band
    assert "band" not in parse_spec(MINIMAL + ALLOCATOR).model_dump(mode="json")["constraints"][
        "allocator"]
    banded = parse_spec(MINIMAL + ALLOCATOR.replace("}", ", band: [-0.25, 0.125]}"))
    assert banded.reserved_band == (-0.25, 0.125)


@pytest.mark.parametrize("replace_from, replace_to, field", [
    ("sequential: 0.2", "sequential: -0.1", "constraints.allocator.sequential"),
    ("logits: 0.25", "logits: 9", "constraints.allocator.logits"),
    ("floor_mib: 512", "floor_mib: many", "constraints.allocator.floor_mib"),
    (", floor_mib: 512", "", "constraints.allocator.floor_mib"),
    ("floor_mib: 512", "floor_mib: 512, band: [0.1, -0.1]", "constraints.allocator.band"),
    ("floor_mib: 512", "floor_mib: 512, band: [-1.0, 0.1]", "constraints.allocator.band"),
    ("floor_mib: 512", "floor_mib: 512, band: [-0.1]", "constraints.allocator.band"),
])
def test_allocator_constants_out_of_range_are_refused_by_name(
        replace_from: str, replace_to: str, field: str) -> None:
    error = error_of(MINIMAL + ALLOCATOR.replace(replace_from, replace_to))
    assert error.field == field and error.line == 7


def test_a_key_given_twice_is_refused_not_silently_dropped() -> None:
    """YAML keeps the second of two equal keys; a spec with two `constraints:` blocks (the second
    pasted from `sweep memory-check --write-constants`) would lose the first block's settings."""
    error = error_of(MINIMAL + "constraints: {max_mbs: 8}\n" + ALLOCATOR)
    assert (error.field, error.line) == ("constraints", 7)
    assert "appears twice (lines 6 and 7)" in error.message and "merge them" in error.message
    nested = error_of(MINIMAL + "run:\n  steps: 5\n  env: {A: '1'}\n  steps: 6\n")
    assert (nested.field, nested.line) == ("run.steps", 9)


def test_the_memory_profile_is_the_one_of_the_framework_version_the_runs_are_rendered_for() -> None:
    from sweep.frameworks import get_adapter
    from sweep.models.memory_profiles import TORCHTITAN, TORCHTITAN_03, profile_for

    def profile(version: str) -> str:
        pinned = f"run: {{framework_version: {version}}}\n" if version else ""
        return parse_spec(MINIMAL + "framework: torchtitan\n" + pinned).memory_profile.name

    assert profile("v0.3") == TORCHTITAN_03.name
    assert profile("v0.2") == profile("v0.2.0") == TORCHTITAN.name
    default = get_adapter("torchtitan").default_version
    assert profile("") == profile_for("torchtitan", default).name
