"""launch/torchtitan.sh with launch/torchtitan.toml (0.2) or launch/torchtitan.config.py (0.3.0 and
main): the whole config is ours, paths come from the checkout, every rank's line is prefixed with
its rank, and the version check runs first."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from sweep.plan import render, space
from sweep.plan.spec import parse_spec

SPEC = """
name: tt-launch
framework: torchtitan
models: [llama-3.1-8b]
nodes: [2]
gpus_per_node: 8
seq_len: 4096
dtype: {dtype}
global_batch: {{sequences: 64}}
axes: {{zero_stage: [2], pp_schedule: [interleaved_1f1b], pp: [2], tp: [2], dp: [4]}}
run: {{framework_dir: /opt/torchtitan, compile: true, framework_version: {version}}}
"""


def rendered(dtype: str = "fp8", version: str = "v0.2") -> dict[str, str]:
    spec = parse_spec(SPEC.format(dtype=dtype, version=version))
    rows = render.kept_rows(space.plan(spec))
    assert rows
    config = render.resolve_run(spec, rows[0])
    env = render.make_environment()
    return render.render_files(env, config, Path("/sweep/runs") / config.run_id,
                               render.launch_templates(env, "torchtitan"))


def test_launcher_uses_its_own_toml_and_the_checkouts_assets() -> None:
    script = rendered()["launch/torchtitan.sh"]
    assert "debug_model.toml" not in script and "train_configs" not in script
    assert '--job.config_file "$RUN_DIR/launch/torchtitan.toml"' in script
    assert '--model.hf_assets_path "$FRAMEWORK_DIR/tests/assets/tokenizer"' in script
    assert '--training.dataset_path "$FRAMEWORK_DIR/tests/assets/c4_test"' in script
    assert "-m sweep.frameworks.versions --framework torchtitan" in script
    assert "--want v0.2 " in script
    assert "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${rank}]:'" in script and "--tee=3" in script


@pytest.mark.parametrize("version, seed_section", [("v0.2", "debug"), ("v0.2.0", "training")])
def test_toml_is_complete_and_versioned(version: str, seed_section: str) -> None:
    config = tomllib.loads(rendered(version=version)["launch/torchtitan.toml"])
    assert config[seed_section]["seed"] == 1234
    other = "training" if seed_section == "debug" else "debug"
    assert "seed" not in config.get(other, {})
    assert config["model"] == {"name": "llama3", "flavor": "8B",
                               "converters": ["quantize.linear.float8"]}
    assert config["quantize"]["linear"]["float8"]["filter_fqns"] == ["output"]
    assert config["compile"]["enable"] is True
    par = config["parallelism"]
    assert "pipeline_parallel_layers_per_stage" not in par
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert (par["data_parallel_shard_degree"], par["tensor_parallel_degree"],
            par["pipeline_parallel_degree"]) == (4, 2, 2)
    assert config["training"]["dataset"] == "c4_test"
    assert config["training"]["mixed_precision_param"] == "bfloat16"


@pytest.mark.parametrize("version", ["v0.2", "v0.3", "main"])
def test_shellcheck(tmp_path: Path, version: str) -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed")
    path = tmp_path / "torchtitan.sh"
    path.write_text(rendered(version=version)["launch/torchtitan.sh"])
    done = subprocess.run(["shellcheck", "-x", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("version", ["v0.3", "main"])
def test_a_0_3_run_has_a_config_module_and_no_toml(version: str) -> None:
    files = rendered(version=version)
    assert "launch/torchtitan.toml" not in files
    module = files["launch/torchtitan.config.py"]
    compile(module, "torchtitan.config.py", "exec")  # valid Python
    assert "def llm_sweep_config() -> Trainer.Config:" in module
    script = files["launch/torchtitan.sh"]
    assert '--module llm_sweep_run --config llm_sweep_config' in script
    assert 'cp "$RUN_DIR/launch/torchtitan.config.py" "$MODULE_DIR/llm_sweep_run.py"' in script
    assert '--hf_assets_path "$FRAMEWORK_DIR/tests/assets/tokenizer"' in script
    assert f"--want {version} " in script
    assert "--job.config_file" not in script


def test_a_0_2_run_has_a_toml_and_no_config_module() -> None:
    files = rendered(version="v0.2")
    assert "launch/torchtitan.toml" in files and "launch/torchtitan.config.py" not in files


def test_the_default_renders_the_config_module() -> None:
    spec = parse_spec(SPEC.format(dtype="bf16", version="null"))
    config = render.resolve_run(spec, render.kept_rows(space.plan(spec))[0])
    env = render.make_environment()
    files = render.render_files(env, config, Path("/sweep/runs") / config.run_id,
                                render.launch_templates(env, "torchtitan"))
    assert "torchtitan v0.3" in files["launch/torchtitan.config.py"]
    assert "--want v0.3 " in files["launch/torchtitan.sh"]


def test_switching_versions_leaves_no_stale_launch_file(tmp_path: Path) -> None:
    """Re-rendering a run for another form removes the other form's file."""
    for version in ("v0.2", "v0.3"):
        render.write_run(tmp_path, rendered(version=version))
    assert sorted(p.name for p in (tmp_path / "launch").iterdir()) == [
        "torchtitan.config.py", "torchtitan.sh"]
