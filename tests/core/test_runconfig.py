"""run.json: a stable identity, a faithful round trip, and tamper detection."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sweep.core.catalog import get_model
from sweep.core.layout import Layout
from sweep.core.runconfig import RunConfig, load


def config(**changes) -> RunConfig:
    base = RunConfig(sweep="demo", framework="builtin", model=get_model("tiny-4l"),
                     layout=Layout(dp=2, tp=1, pp=1, mbs=2, grad_acc=1), nodes=1, gpus_per_node=2,
                     gpu="cpu", dtype="fp32", seq_len=256, global_batch_sequences=4,
                     settings={"steps": 5})
    return replace(base, **changes)


def test_run_id_names_the_model_and_nodes_and_is_stable() -> None:
    run_id = config().run_id
    assert run_id.startswith("tiny-4l-n1-") and run_id == config().run_id


def test_run_id_ignores_settings_but_not_the_layout() -> None:
    assert config(settings={"steps": 50}).run_id == config().run_id
    assert config(sweep="other").run_id == config().run_id
    assert config(layout=Layout(dp=1, tp=2, pp=1, mbs=4)).run_id != config().run_id


def test_round_trip_through_a_file(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps(config().to_json()))
    assert load(tmp_path) == config()


def test_hand_edited_content_is_detected(tmp_path: Path) -> None:
    data = config().to_json()
    data["layout"]["mbs"] = 8
    (tmp_path / "run.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="does not match its content"):
        load(tmp_path)


def test_unknown_schema_is_refused() -> None:
    with pytest.raises(ValueError, match="schema"):
        RunConfig.from_json({**config().to_json(), "schema": 99})
