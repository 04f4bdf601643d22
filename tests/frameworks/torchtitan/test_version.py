"""Which torchtitan a job finds: releases, and checkouts by their source markers (and, for main,
by git: the pinned commit or an ancestor of it, never a later one)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sweep.frameworks.torchtitan import version
from sweep.frameworks.torchtitan.version import detect, key_for_release
from sweep.frameworks.versions import DetectedVersion, refusal


@pytest.mark.parametrize("release, key", [("0.2.0", "v0.2.0"), ("0.2.1", "v0.2"),
                                          ("0.2.2", "v0.2"), ("0.2.2+git73a0e69", "v0.2"),
                                          ("0.3.0", "v0.3"), ("0.3.0.dev20260901", None),
                                          ("0.3.1", None), ("0.4.0", None), ("0.1.0", None),
                                          ("nonsense", None)])
def test_releases(release: str, key: str | None) -> None:
    found, problem = key_for_release(release)
    assert found == key
    assert (problem is None) == (key is not None)


@pytest.mark.parametrize("release", ["0.3.0.dev20260901", "0.3.1", "0.4.0"])
def test_a_nightly_or_later_release_is_refused_by_name_with_the_fix(release: str) -> None:
    _, problem = key_for_release(release)
    assert f"torchtitan {release}" in problem
    assert "torchtitan==0.3.0" in problem and version.MAIN_PIN[:9] in problem


def checkout(tmp_path: Path, *, job_config: str | None, float8: str | None,
             new_config: bool = False) -> Path:
    """A checkout with only the files detection reads (their markers as in the real sources)."""
    (tmp_path / "torchtitan" / "config").mkdir(parents=True)
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "version.txt").write_text("0.2.2\n")
    if job_config is not None:
        (tmp_path / version.JOB_CONFIG).write_text(job_config)
    if new_config:
        (tmp_path / "torchtitan" / "config" / "configs.py").write_text("")
    if float8 is not None:
        (tmp_path / version.FLOAT8).parent.mkdir(parents=True)
        (tmp_path / version.FLOAT8).write_text(float8)
    return tmp_path


REGISTER = 'register_model_converter(Float8LinearConverter, "quantize.linear.float8")\n'


def test_checkout_of_0_2_1_or_later(tmp_path: Path) -> None:
    found = detect(str(checkout(tmp_path, job_config="@dataclass\nclass Debug:\n", float8=REGISTER)))
    assert (found.key, found.problem) == ("v0.2", None)
    assert found.found.startswith("torchtitan 0.2.2")


def test_checkout_of_0_2_0(tmp_path: Path) -> None:
    found = detect(str(checkout(tmp_path, job_config="class Training:\n    seed: int | None = None\n",
                                float8=REGISTER)))
    assert (found.key, found.problem) == ("v0.2.0", None)


def test_checkout_before_0_2_0(tmp_path: Path) -> None:
    found = detect(str(checkout(tmp_path, job_config="class Training:\n",
                                float8='register_model_converter(Float8Converter, "float8")\n')))
    assert found.key is None and "predates" in found.problem


def test_checkout_with_a_config_registry_of_neither_form_is_refused(tmp_path: Path) -> None:
    found = detect(str(checkout(tmp_path, job_config=None, float8=REGISTER, new_config=True)))
    assert found.key is None
    assert "neither 0.3.0's nor the pinned main's settings" in found.problem


# The fields each Python-config form's torchtitan/config/configs.py defines (0.3.0's wheel; main
# at b5bcd76c6).
V03_CONFIGS = ("class TrainingConfig:\n    local_batch_size: int = 8\n"
               "class ParallelismConfig:\n    pipeline_parallel_microbatch_size: int = 1\n")
MAIN_CONFIGS = ("class TrainingConfig:\n    num_tokens_per_microbatch_per_dp_rank: int = 16384\n"
                "    max_context_length: int = 2048\n"
                "class ParallelismConfig:\n    num_pp_microbatches: int = 1\n")


def config_checkout(tmp_path: Path, configs: str, stated: str) -> Path:
    root = checkout(tmp_path, job_config=None, float8=REGISTER, new_config=True)
    (root / version.CONFIGS).write_text(configs)
    (root / "assets" / "version.txt").write_text(stated + "\n")
    return root


def test_a_0_3_0_source_tree(tmp_path: Path) -> None:
    found = detect(str(config_checkout(tmp_path, V03_CONFIGS, "0.3.0")))
    assert (found.key, found.problem) == ("v0.3", None)


def test_a_0_3_style_tree_that_does_not_say_0_3_0_is_refused(tmp_path: Path) -> None:
    found = detect(str(config_checkout(tmp_path, V03_CONFIGS, "0.2.2")))
    assert found.key is None and "does not say it is 0.3.0" in found.problem


def test_a_main_export_is_told_by_its_markers(tmp_path: Path) -> None:
    """main's version.txt still says 0.2.2; an export (no .git) is main by its settings."""
    found = detect(str(config_checkout(tmp_path, MAIN_CONFIGS, "0.2.2")))
    assert (found.key, found.problem) == ("main", None)
    assert found.found.startswith("torchtitan main in ")  # not its stale "0.2.2"


def git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                          check=True, env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                                           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
                                           "PATH": "/usr/bin:/bin"})
    return done.stdout.strip()


def test_a_main_repository_after_the_pin_is_refused_by_name(tmp_path: Path) -> None:
    """A git repository whose HEAD is not the pin nor an ancestor of it (here: a history without
    the pinned commit at all) is refused, naming the pin and how to check it out."""
    root = config_checkout(tmp_path, MAIN_CONFIGS, "0.2.2")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "later main")
    found = detect(str(root))
    assert found.key is None
    assert "later than (or not on) b5bcd76c6" in found.problem
    assert "checkout b5bcd76c6" in found.problem


def test_main_repository_at_the_pin_and_before_it(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The ancestor check itself, on a two-commit history whose second commit stands in for
    the pin: HEAD at the pin or before it is main; a 0.3-style tree before the token budgets is
    an old main, refused."""
    root = config_checkout(tmp_path, V03_CONFIGS, "0.2.2")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "main before the token budgets")
    old = git(root, "rev-parse", "HEAD")
    (root / version.CONFIGS).write_text(MAIN_CONFIGS)
    git(root, "commit", "-q", "-am", "fold batch dim")
    monkeypatch.setattr(version, "MAIN_PIN", git(root, "rev-parse", "HEAD"))
    assert detect(str(root)).key == "main"
    git(root, "checkout", "-q", old)
    found = detect(str(root))
    assert found.key is None and "a main from before 73aed7f6c" in found.problem


def test_not_a_checkout(tmp_path: Path) -> None:
    found = detect(str(tmp_path / "nowhere"))
    assert found.key is None and "no torchtitan/ package" in found.problem


def test_installed_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(version.metadata, "version", lambda name: "0.2.1")
    assert detect(None).key == "v0.2"
    monkeypatch.setattr(version.metadata, "version", lambda name: "0.3.0")
    assert detect(None).key == "v0.3"
    monkeypatch.setattr(version.metadata, "version", lambda name: "0.3.1")
    assert detect(None).key is None



@pytest.mark.parametrize("rendered_for, found", [("v0.2", "v0.3"), ("v0.3", "v0.2"),
                                                 ("v0.3", "main"), ("main", "v0.3")])
def test_the_job_refuses_a_version_the_run_was_not_rendered_for(rendered_for: str,
                                                                 found: str) -> None:
    """A TOML run on 0.3, a config module on 0.2, and 0.3.0's module on main or back (their
    batch settings differ): each refused, naming what was found and the key to re-render for."""
    detected = DetectedVersion(found=f"torchtitan ({found})", key=found)
    problem = refusal("torchtitan", rendered_for, detected)
    assert problem is not None
    assert f"supported as {found!r}, not the {rendered_for!r}" in problem
    assert f"set run.framework_version to {found!r} and re-render" in problem
    assert refusal("torchtitan", found, detected) is None
