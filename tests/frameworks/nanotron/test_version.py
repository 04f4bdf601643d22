"""Version detection judges a nanotron checkout by its source markers, and never raises."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sweep.frameworks.nanotron import version
from sweep.frameworks.nanotron.config_schema import MAIN, PLAYBOOK

# The marker lines as each version has them (trainer.py train_step_logs, parallelism_config.py).
NEW_TRAINER = '    LogItem("time_per_iteration_ms", elapsed_time_per_iteration_ms, "human_format"),\n'
OLD_TRAINER = '    LogItem("elapsed_time_per_iteration_ms", elapsed_time_per_iteration_ms, "human_format"),\n'
WITH_CP = "class ParallelismArgs:\n    expert_parallel_size: int = 1\n    context_parallel_size: int = 1\n"
WITHOUT_CP = "class ParallelismArgs:\n    expert_parallel_size: int = 1\n"


def checkout(root: Path, trainer: str, parallelism: str) -> Path:
    (root / "src/nanotron/config").mkdir(parents=True)
    (root / version.TRAINER).write_text(trainer)
    (root / version.PARALLELISM).write_text(parallelism)
    return root


@pytest.mark.parametrize(("trainer", "parallelism", "playbook_config", "key", "problem"), [
    (NEW_TRAINER, WITH_CP, False, MAIN, None),
    (OLD_TRAINER, WITHOUT_CP, True, PLAYBOOK, None),
    (OLD_TRAINER, WITHOUT_CP, False, None, "config classes differ"),
    (OLD_TRAINER, WITH_CP, False, None, "2025-03-21..25"),
    ("", WITH_CP, False, None, "neither of nanotron's known step-time keys"),
])
def test_classify(trainer: str, parallelism: str, playbook_config: bool, key: str | None,
                  problem: str | None) -> None:
    found_key, found_problem = version.classify(trainer, parallelism, playbook_config)
    assert found_key == key
    assert (found_problem is None) == (problem is None)
    if problem:
        assert problem in found_problem and "8279c784" in found_problem


def test_a_main_checkout_with_its_commit(tmp_path: Path) -> None:
    root = checkout(tmp_path, NEW_TRAINER, WITH_CP)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "."], check=True)
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-qm", "x"], check=True)
    detected = version.detect(str(root))
    assert detected.key == MAIN and detected.problem is None
    assert detected.found.startswith("nanotron @ ") and "(20" in detected.found


def test_the_playbook_key_needs_the_playbook_s_config_files(tmp_path: Path, monkeypatch) -> None:
    root = checkout(tmp_path, OLD_TRAINER, WITHOUT_CP)
    assert version.detect(str(root)).key is None
    blobs = {path: version._blob_id(root / path) for path in (version.TRAINER, version.PARALLELISM)}
    monkeypatch.setattr(version, "PLAYBOOK_BLOBS", blobs)
    assert version.detect(str(root)).key == PLAYBOOK


def test_the_blob_id_is_git_s(tmp_path: Path) -> None:
    path = tmp_path / "f.py"
    path.write_text("x = 1\n")
    git = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True)
    assert version._blob_id(path) == git.stdout.strip()


@pytest.mark.parametrize("where", [None, "", "/nonexistent/nanotron"])
def test_no_checkout_is_a_problem_not_an_exception(where: str | None) -> None:
    detected = version.detect(where)
    assert detected.key is None and "framework_dir" in detected.problem


def check_main_checkout(root: Path, *python_path: Path) -> subprocess.CompletedProcess[str]:
    """The job's version check, as the rendered script runs it, against a main checkout."""
    import os
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [*map(str, python_path), str(Path(__file__).resolve().parents[3])])}
    return subprocess.run([sys.executable, "-m", "sweep.frameworks.versions", "--framework",
                           "nanotron", "--want", MAIN, "--framework-dir", str(root)],
                          capture_output=True, text=True, env=env, check=False, timeout=60)


def test_main_is_refused_before_launch_without_grouped_gemm_and_says_how_to_install_it(
        tmp_path: Path) -> None:
    """nanotron main imports grouped_gemm for every run, dense ones too, and does not install
    it: the job refuses to start, with the command that installs it, rather than dying at import
    after its allocation started. This Python has no grouped_gemm; a package of that name on the
    path (an empty one: the check looks the module up, never imports it) is enough to pass."""
    from sweep.frameworks.versions import LAUNCH_REFUSED

    root = checkout(tmp_path / "nanotron", NEW_TRAINER, WITH_CP)
    refused = check_main_checkout(root)
    assert refused.returncode == 3, refused.stderr
    assert refused.stderr.startswith(LAUNCH_REFUSED)
    assert "'grouped_gemm' is not installed" in refused.stderr
    assert "pip install --no-build-isolation git+https://github.com/fanshiqing/grouped_gemm@main" \
        in refused.stderr

    site = tmp_path / "site"
    (site / "grouped_gemm").mkdir(parents=True)
    (site / "grouped_gemm" / "__init__.py").write_text("raise ImportError('needs a GPU')\n")
    started = check_main_checkout(root, site)
    assert started.returncode == 0, started.stderr
    assert f"supported as {MAIN}" in started.stdout


def test_the_playbook_commit_needs_no_grouped_gemm() -> None:
    from sweep.frameworks.versions import missing_requirements

    assert missing_requirements("nanotron", PLAYBOOK) == []
    [problem] = missing_requirements("nanotron", MAIN)
    assert "grouped_gemm" in problem
