"""launch/nanotron.yaml loads strictly into nanotron's config, and says what the run is.

nanotron reads its YAML with `dacite.from_dict(Config, ..., strict=True)`: an unknown key, a
missing required field or a wrongly typed value is an error. nanotron itself (CUDA, flash-attn)
is not installable here, so its dataclasses are mirrored, per supported version, in
sweep/frameworks/nanotron/config_schema.py (with the commits they are read from), together with a
strict loader; tests/frameworks/nanotron/test_contract.py checks a wider family at both versions.
The negative tests show the loader is strict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sweep.frameworks.nanotron.config_checks import validate
from sweep.frameworks.nanotron.config_schema import MAIN, PLAYBOOK, ConfigError
from sweep.plan import render, space
from sweep.plan.spec import load_spec


# The tests ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def playbook_runs(repo_root: Path) -> list[tuple[Any, dict[str, str]]]:
    """A spread of the playbook's kept runs: every (model, nodes) and both ZeRO stages."""
    spec = load_spec(repo_root / "examples" / "playbook.yaml")
    plan = space.plan(spec)
    kept = plan[plan["status"] == space.KEPT]
    sample = kept.groupby(["model", "nodes", "zero_stage", "pp"], observed=True).head(1)
    env = render.make_environment()
    names = render.launch_templates(env, "nanotron")
    out = []
    for row in render.kept_rows(sample):
        config = render.resolve_run(spec, row)
        out.append((config, render.render_files(env, config, Path("/sweep/runs") / config.run_id,
                                                names)))
    return out


def test_every_sampled_playbook_yaml_loads_strictly(playbook_runs: list) -> None:
    assert len(playbook_runs) > 20
    for config, files in playbook_runs:
        data = yaml.safe_load(files["launch/nanotron.yaml"])
        # examples/playbook.yaml pins the playbook's own nanotron commit, which has no CP key.
        validate(data, PLAYBOOK, world_size=config.nodes * config.gpus_per_node)
        loaded = _Attrs.of(data)
        layout, model = config.layout, config.model
        par = loaded.parallelism
        assert (par.dp, par.tp, par.pp) == (layout.dp, layout.tp, layout.pp)
        assert "context_parallel_size" not in data["parallelism"]
        assert par.dp * par.tp * par.pp == config.nodes * config.gpus_per_node
        assert par.expert_parallel_size == 1
        assert par.tp_mode == ("REDUCE_SCATTER" if layout.sp else "ALL_REDUCE")
        assert par.pp_engine == "1f1b"
        assert loaded.optimizer.zero_stage == layout.zero_stage
        assert loaded.optimizer.accumulate_grad_in_fp32 is True
        tokens = loaded.tokens
        assert (tokens.micro_batch_size, tokens.batch_accumulation_per_replica,
                tokens.sequence_length) == (layout.mbs, layout.grad_acc, 4096)
        assert tokens.micro_batch_size * tokens.batch_accumulation_per_replica * par.dp == 256
        llama = loaded.model.model_config
        assert (llama.num_hidden_layers, llama.hidden_size, llama.intermediate_size,
                llama.num_attention_heads, llama.num_key_value_heads, llama.vocab_size,
                llama.tie_word_embeddings) == (
            model.num_layers, model.hidden_size, model.ffn_hidden_size,
            model.num_attention_heads, model.num_kv_heads, model.vocab_size,
            model.tie_word_embeddings)
        assert loaded.model.dtype == "bfloat16"
        assert loaded.general.run == config.run_id
        assert [s.start_training_step for s in loaded.data_stages] == [1]


def test_the_launcher_points_torchrun_at_the_yaml(playbook_runs: list) -> None:
    config, files = playbook_runs[0]
    script = files["launch/nanotron.sh"]
    assert '"$FRAMEWORK_DIR/run_train.py" --config-file "$RUN_DIR/launch/nanotron.yaml"' in script
    assert f"--nproc-per-node={config.gpus_per_node}" in script


def test_the_strict_loader_rejects_what_nanotron_would(playbook_runs: list) -> None:
    data = yaml.safe_load(playbook_runs[0][1]["launch/nanotron.yaml"])
    data["parallelism"]["sequence_parallel"] = True
    with pytest.raises(ConfigError, match="unknown key"):
        validate(data, MAIN)
    data = yaml.safe_load(playbook_runs[0][1]["launch/nanotron.yaml"])
    data["optimizer"]["learning_rate_scheduler"]["min_decay_lr"] = "1e-5"  # YAML 1.1: a string
    with pytest.raises(ConfigError, match="min_decay_lr"):
        validate(data, MAIN)
    data = yaml.safe_load(playbook_runs[0][1]["launch/nanotron.yaml"])
    del data["tokens"]["train_steps"]
    with pytest.raises(ConfigError, match="train_steps"):
        validate(data, MAIN)


class _Attrs:
    """A loaded YAML mapping read with attributes, like nanotron's dataclasses."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    @classmethod
    def of(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return cls(value)
        if isinstance(value, list):
            return [cls.of(v) for v in value]
        return value

    def __getattr__(self, name: str) -> Any:
        try:
            return self.of(self._data[name])
        except KeyError:
            raise AttributeError(name) from None
