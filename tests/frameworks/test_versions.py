"""The job's framework version check: a run starts only on the version it was rendered for,
and env.json records what was found."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sweep.frameworks.versions import LAUNCH_REFUSED, DetectedVersion, detect, refusal
from sweep.job.provenance import collect


def run_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sweep.frameworks.versions", *args],
                          capture_output=True, text=True, check=False, timeout=60)


def test_the_builtin_workload_is_this_installation() -> None:
    found = detect("builtin", None)
    assert found.key == "bundled" and found.found.startswith("llm-sweep ")
    assert refusal("builtin", "bundled", found) is None


def test_a_matching_version_starts_and_is_recorded(tmp_path: Path) -> None:
    out = tmp_path / "framework.json"
    done = run_check("--framework", "builtin", "--want", "bundled", "--out", str(out))
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert record["key"] == "bundled" and record["refused"] is None


def test_another_version_is_refused_with_the_line_the_classifier_knows(tmp_path: Path) -> None:
    out = tmp_path / "framework.json"
    done = run_check("--framework", "builtin", "--want", "v9", "--out", str(out))
    assert done.returncode == 3
    assert done.stderr.startswith(LAUNCH_REFUSED)
    assert json.loads(out.read_text())["refused"]


def test_a_refusal_says_what_was_found_and_what_to_do() -> None:
    other = DetectedVersion(found="megatron-core 0.12.0", key=None,
                            problem="megatron-core 0.12.0 is older than 0.17: install 0.17 or later")
    message = refusal("megatron", "core_r0.17+", other)
    assert message is not None
    assert "found megatron-core 0.12.0" in message and "install 0.17 or later" in message


def test_env_json_records_the_framework_the_job_found() -> None:
    record = collect(None, None, ["node1"], environ={}, framework="builtin")
    assert record["framework"]["name"] == "builtin"
    assert record["framework"]["detected"]["key"] == "bundled"
