"""sweep.backends.slurm.observation: how a poll reads attempt folders (its Slurm side is tested live in tests/commands/)."""

from __future__ import annotations

from pathlib import Path

from sweep.backends.slurm.observation import attempt_view
from sweep.core.state import atomic_write_json

LAUNCH_FAILED = "srun: error: Task launch for StepId=3131.0 failed on node node2: Communication connection failure\n"


def test_srun_blaming_a_node_decides_unless_the_run_completed(tmp_path: Path) -> None:
    attempt = tmp_path / "1"
    attempt.mkdir()
    assert attempt_view(attempt, None).outcome is None  # still running, nothing said
    (attempt / "job.err").write_text(LAUNCH_FAILED)
    view = attempt_view(attempt, None)
    assert (view.outcome, view.reason, view.nodes) == ("node_fail", "srun_step_launch_failed: node2", ("node2",))
    cancelled = {"outcome": "cancelled", "reason": "sigterm", "started_at": 10.0, "ended_at": 14.0,
                 "nodes": ["node1", "node2"]}
    atomic_write_json(attempt / "status.json", cancelled)
    view = attempt_view(attempt, cancelled)
    assert (view.outcome, view.nodes, view.elapsed_s) == ("node_fail", ("node2",), 4.0)
    completed = {**cancelled, "outcome": "completed"}
    assert attempt_view(attempt, completed).outcome == "completed"
