"""Pipeline split: contiguous layer ranges, stage contents, and layouts that cannot be pipelined."""

from __future__ import annotations

import pytest

from sweep.core.catalog import get_model
from sweep.core.layout import Layout
from sweep.workload.model import Transformer, keep_stage, layer_range
from sweep.workload.pipeline import pipeline_problems, stage_indices


@pytest.mark.parametrize(("layers", "stages"), [(4, 2), (4, 4), (5, 2), (7, 3), (8, 8)])
def test_layer_ranges_are_contiguous_and_cover_every_layer(layers: int, stages: int) -> None:
    ranges = [layer_range(layers, s, stages) for s in range(stages)]
    assert [i for r in ranges for i in r] == list(range(layers))
    assert max(map(len, ranges)) - min(map(len, ranges)) <= 1


def test_interleaved_stages_are_looped_over_ranks() -> None:
    layout = Layout(dp=1, tp=1, pp=2, vpp=2, grad_acc=2, pp_schedule="interleaved_1f1b")
    assert stage_indices(layout, 0) == [0, 2] and stage_indices(layout, 1) == [1, 3]


def test_a_stage_keeps_its_layers_under_their_global_names() -> None:
    first = keep_stage(Transformer(get_model("tiny-4l")), 0, 2)
    last = keep_stage(Transformer(get_model("tiny-4l")), 1, 2)
    assert list(first.layers) == ["0", "1"] and list(last.layers) == ["2", "3"]
    assert first.tok_embeddings is not None and first.output is None and first.norm is None
    assert last.tok_embeddings is None and last.output is not None and last.norm is not None


@pytest.mark.parametrize(("layout", "tied", "message"), [
    (Layout(dp=1, tp=1, pp=2, grad_acc=1), False, "1F1B needs at least pp=2 micro-batches"),
    (Layout(dp=1, tp=1, pp=2, grad_acc=3, vpp=2, pp_schedule="interleaved_1f1b"), False, "multiple of pp"),
    (Layout(dp=1, tp=1, pp=2, grad_acc=2, vpp=2), False, "need pp_schedule interleaved_1f1b"),
    (Layout(dp=1, tp=1, pp=8, grad_acc=8), False, "at least as many layers"),
    (Layout(dp=1, tp=1, pp=2, grad_acc=2, pp_schedule="zb"), False, "pp_schedule"),
    (Layout(dp=1, tp=1, pp=2, grad_acc=2), True, "tie_word_embeddings"),
])
def test_layouts_that_cannot_be_pipelined_say_why(layout: Layout, tied: bool, message: str) -> None:
    problems = pipeline_problems(layout, 4, tied)
    assert any(message in p for p in problems), problems


def test_a_sound_pipeline_layout_has_no_problems() -> None:
    assert pipeline_problems(Layout(dp=1, tp=1, pp=2, grad_acc=2), 4, False) == []
    assert pipeline_problems(Layout(dp=1, tp=1, pp=1), 4, True) == []
