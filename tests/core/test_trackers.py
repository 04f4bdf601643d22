"""Tracker targets as a user writes them: `mlflow[:URI]` or `wandb[:ENTITY/PROJECT]`."""

from __future__ import annotations

import pytest

from sweep.core.trackers import TrackerTarget, parse_target


@pytest.mark.parametrize("text, kind, where", [
    ("mlflow", "mlflow", None),
    ("mlflow:http://127.0.0.1:5000", "mlflow", "http://127.0.0.1:5000"),
    ("mlflow:https://mlflow.lab/path", "mlflow", "https://mlflow.lab/path"),
    ("mlflow:databricks", "mlflow", "databricks"),
    ("wandb", "wandb", None),
    ("wandb:team/bench", "wandb", "team/bench"),
    ("wandb:bench", "wandb", "bench"),
])
def test_each_accepted_form_parses_and_prints_as_written(text: str, kind: str, where: str | None) -> None:
    target = parse_target(text)
    assert (target.kind, target.where, str(target)) == (kind, where, text)


def test_a_wandb_target_names_its_entity_and_project() -> None:
    assert (parse_target("wandb:team/bench").entity, parse_target("wandb:team/bench").project) == (
        "team", "bench")
    assert (parse_target("wandb:bench").entity, parse_target("wandb:bench").project) == (None, "bench")
    assert TrackerTarget("mlflow", "http://x").project is None


@pytest.mark.parametrize("text, fragment", [
    ("tensorboard", "is not a tracker: write mlflow[:URI] or wandb[:ENTITY/PROJECT]"),
    ("mlflow:localhost:5000", "has no scheme"),
    ("wandb:team/bench/extra", "wandb:ENTITY/PROJECT or wandb:PROJECT"),
    ("wandb:team name", "wandb:ENTITY/PROJECT or wandb:PROJECT"),
])
def test_a_target_of_no_known_form_is_refused_with_the_forms(text: str, fragment: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_target(text)
    assert fragment in str(caught.value)
