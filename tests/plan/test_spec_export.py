"""The spec's `export:` section: the trackers a sweep exports to when it ends (docs/spec.md)."""

from __future__ import annotations

import pytest

from sweep.plan.spec import SpecError, parse_spec
from tests.specs import MINIMAL_SPEC as MINIMAL


def test_the_export_section_lists_trackers_in_their_written_form() -> None:
    spec = parse_spec(MINIMAL + "export:\n  to: [mlflow:http://mlflow.lab:5000, wandb:team/bench, wandb]\n")
    assert spec.export is not None
    assert spec.export.to == ["mlflow:http://mlflow.lab:5000", "wandb:team/bench", "wandb"]
    assert parse_spec(MINIMAL).export is None


def test_where_a_sweep_is_exported_changes_neither_its_hash_nor_its_plan() -> None:
    with_export = parse_spec(MINIMAL + "export: {to: [wandb:team/bench]}\n")
    assert with_export.spec_hash() == parse_spec(MINIMAL).spec_hash()


@pytest.mark.parametrize("section, field, fragment", [
    ("export: {to: [neptune:proj]}", "export.to", "'neptune:proj' is not a tracker: write mlflow[:URI] "
                                                  "or wandb[:ENTITY/PROJECT]"),
    ("export: {to: ['mlflow:localhost:5000']}", "export.to", "has no scheme; write mlflow:http://HOST:PORT"),
    ("export: {to: ['wandb:a/b/c']}", "export.to", "write wandb:ENTITY/PROJECT or wandb:PROJECT"),
    ("export: {to: []}", "export.to", "at least 1 item"),
    ("export: {trackers: [wandb]}", "export.trackers", "unknown field 'trackers'"),
])
def test_a_bad_export_section_is_located_with_the_fix(section: str, field: str, fragment: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(MINIMAL + section + "\n", "spec.yaml")
    assert (caught.value.field, caught.value.line) == (field, 6)
    assert fragment in caught.value.message
