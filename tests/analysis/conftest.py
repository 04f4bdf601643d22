"""Small runs.parquet tables built by hand, for the checks, marks and flags of the analysis."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from sweep.collect.schema import to_table

FLOPS_PER_TOKEN = {"megatron": 1.0e8, "full_attention": 1.2e8, "6N": 0.9e8}
CPU_PEAK = 2.0e11


def _run_row(run_id: str, tokens_per_sec_per_gpu: float | None, *, model: str = "tiny-4l",
            nodes: int = 1, outcome: str = "completed", peak: float = CPU_PEAK,
            issues: tuple[str, ...] = (), tp: int = 1, pp: int = 1, **extra: Any) -> dict[str, Any]:
    """One attempt of the demo's shape (2 ranks per node on CPU). MFU under every convention is
    tokens/s/GPU × FLOPs per token ÷ `peak`, as collect computes it; `mfu_reported` is the
    full_attention figure unless `extra` says otherwise."""
    dp = 2 * nodes // (tp * pp)
    row: dict[str, Any] = {
        "schema_version": 1, "sweep": "local-cpu", "run_id": run_id, "attempt": 1,
        "source": "collect", "framework": "builtin", "model": model, "model_label": model,
        "model_params": 4.2e6, "nodes": nodes, "gpus_per_node": 2, "world_size": 2 * nodes,
        "gpu": "cpu", "dtype": "fp32", "seq_len": 128, "global_batch_sequences": 8,
        "dp": dp, "tp": tp, "pp": pp, "cp": 1, "ep": 1, "mbs": 2, "grad_acc": 8 // (2 * dp),
        "zero_stage": 0, "recompute": "none",
        "layout_label": f"DP{dp} TP{tp} PP{pp} GAS{8 // (2 * dp)} MBS2 ZeRO-0",
        "outcome": outcome, "collect_issues": list(issues),
        "tokens_per_sec_per_gpu": tokens_per_sec_per_gpu, "peak_flops": peak,
        "peak_flops_source": "measured:matmul", "mem_reserved_bytes": 3 * 2**28,
        "mfu_reported_convention": "full_attention",
    }
    for convention, per_token in FLOPS_PER_TOKEN.items():
        row[f"flops_per_token_{convention}"] = per_token
        if tokens_per_sec_per_gpu is not None:
            row[f"mfu_{convention}"] = tokens_per_sec_per_gpu * per_token / peak
    if tokens_per_sec_per_gpu is not None:
        row["mfu_reported"] = row["mfu_full_attention"]
        row["flops_per_token_reported"] = FLOPS_PER_TOKEN["full_attention"]
    row.update(extra)
    return row


def _table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows as runs.parquet reads back (Arrow types, lists as arrays)."""
    return to_table(rows).to_pandas()


@pytest.fixture
def run_row() -> Callable[..., dict[str, Any]]:
    """Builds one row (see _run_row)."""
    return _run_row


@pytest.fixture
def make_runs() -> Callable[[list[dict[str, Any]]], pd.DataFrame]:
    """Turns rows into a runs.parquet-like frame."""
    return _table


DISAGREEING = ("the log's tokens/s (1450) differs by more than 5 % from global batch tokens / mean "
               "step time (1200): does the run's batch match run.json?")


def cpu_rows() -> list[dict[str, Any]]:
    """The issue's demo, in small: one cell where the highest MFU is impossible (a peak measured
    far too low), the next one's log disagrees with its batch, and the third is clean; a second
    cell that is clean but for a harmless collect issue on its winner."""
    return [
        _run_row("impossible", 1500.0, peak=3.88e10),      # MFU 464 % under full_attention
        _run_row("disputed", 1200.0, tp=2, issues=(DISAGREEING,)),
        _run_row("clean", 1000.0, pp=2),
        _run_row("two-node", 800.0, nodes=2,
                 issues=("metrics.jsonl: 1 unreadable line(s) skipped (torn or corrupt write)",)),
        _run_row("oom", None, nodes=2, tp=2, outcome="oom"),
    ]


@pytest.fixture
def cpu_runs() -> pd.DataFrame:
    return _table(cpu_rows())


@pytest.fixture(scope="module")
def demo_rows() -> tuple[Callable[..., dict[str, Any]], list[dict[str, Any]]]:
    """For module-scoped fixtures: the row builder (_run_row) and the demo's rows (cpu_rows)."""
    return _run_row, cpu_rows()


def _svg_words(path: Path) -> str:
    """The text a reader sees in an SVG figure: every <text> element, lines joined by spaces
    (a wrapped title is one phrase again)."""
    texts = re.findall(r"<text\b[^>]*>(.*?)</text>", path.read_text(encoding="utf-8"), flags=re.S)
    plain = " ".join(re.sub(r"<[^>]+>", "", t) for t in texts)
    return " ".join(plain.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">").split())


@pytest.fixture
def svg_words() -> Callable[[Path], str]:
    """Reads an SVG figure's text as one string (see _svg_words)."""
    return _svg_words
