"""The runs.parquet schema is data: every column typed, united, described, and round-trips."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sweep.collect import schema
from sweep.models import flops


def test_column_names_are_unique_and_typed() -> None:
    names = [c.name for c in schema.COLUMNS]
    assert len(names) == len(set(names))
    for column in schema.COLUMNS:
        assert column.description, column.name
        assert isinstance(column.arrow_type, pa.DataType)


def test_every_flops_convention_has_flops_and_mfu_columns() -> None:
    assert schema.CONVENTIONS == flops.CONVENTIONS
    for convention in flops.CONVENTIONS:
        assert f"flops_per_token_{convention}" in schema.BY_NAME
        assert f"mfu_{convention}" in schema.BY_NAME
    assert schema.BY_NAME["mfu_full_attention"].unit == "fraction"


def test_issue_columns_are_present() -> None:
    required = {"outcome", "reason", "evidence", "step_time_mean_s", "step_time_std_s",
                "step_time_n", "warmup_steps_skipped", "steady_state_policy", "tokens_per_sec",
                "tokens_per_sec_per_gpu", "mem_allocated_bytes", "mem_reserved_bytes",
                "mem_predicted_reserved_bytes", "slurm_job_id", "node_list", "started_at", "ended_at",
                "elapsed_s", "gpu_hours", "spec_hash", "harness_git_sha", "harness_version",
                "framework", "framework_version", "torch_version", "parser"}
    assert required <= set(schema.COLUMN_NAMES)


def test_rows_round_trip_through_parquet_without_rounding(tmp_path) -> None:
    value = 0.1 + 0.2  # 0.30000000000000004: must survive exactly
    table = schema.to_table([{"run_id": "r", "attempt": 1, "tokens_per_sec": value,
                              "evidence": ["line one", "line two"], "sp": True}])
    pq.write_table(table, tmp_path / "runs.parquet")
    back = pq.read_table(tmp_path / "runs.parquet")
    assert back.schema.equals(schema.arrow_schema(), check_metadata=True)
    row = back.to_pylist()[0]
    assert row["tokens_per_sec"] == value
    assert row["evidence"] == ["line one", "line two"]
    assert row["outcome"] is None  # a missing key is null, not a default


def test_values_are_converted_but_never_truncated() -> None:
    rows = [{"run_id": "a", "attempt": 3.0, "last_step": 7.5, "slurm_job_id": 123_4,
             "step_time_n": float("nan"), "tokens_per_sec": 5},
            {"run_id": "b", "attempt": 1, "last_step": 2}]
    first, second = schema.to_table(rows).to_pylist()
    assert (first["attempt"], first["last_step"], first["step_time_n"]) == (3, None, None)
    assert first["slurm_job_id"] == "1234" and first["tokens_per_sec"] == 5.0
    assert (second["attempt"], second["last_step"]) == (1, 2)


def test_unknown_column_is_refused_with_its_name() -> None:
    with pytest.raises(KeyError, match="mfu_typo"):
        schema.to_table([{"run_id": "r", "mfu_typo": 0.5}])


def test_check_frame_names_the_missing_columns_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"old\.parquet: missing columns .*re-run `sweep collect`"):
        schema.check_frame(["run_id", "attempt"], "old.parquet")
    schema.check_frame(schema.COLUMN_NAMES)


def test_markdown_table_documents_every_column() -> None:
    table = schema.markdown_table()
    for column in schema.COLUMNS:
        assert f"| `{column.name}` | {column.dtype} |" in table
    assert table.startswith("| column | type | unit | description |")
