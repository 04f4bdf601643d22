"""Which torchtitan a job finds: releases, and checkouts by their source markers."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweep.frameworks.torchtitan import version
from sweep.frameworks.torchtitan.version import detect, key_for_release


@pytest.mark.parametrize("release, key", [("0.2.0", "v0.2.0"), ("0.2.1", "v0.2"),
                                          ("0.2.2", "v0.2"), ("0.2.2+git73a0e69", "v0.2"),
                                          ("0.3.0", None), ("0.1.0", None), ("nonsense", None)])
def test_releases(release: str, key: str | None) -> None:
    found, problem = key_for_release(release)
    assert found == key
    assert (problem is None) == (key is not None)
    if release == "0.3.0":
        assert "config registries" in problem and "0.2.2" in problem


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


def test_checkout_with_the_config_registry_is_refused(tmp_path: Path) -> None:
    found = detect(str(checkout(tmp_path, job_config=None, float8=REGISTER, new_config=True)))
    assert found.key is None
    assert "9810191bb" in found.problem and "v0.2.2" in found.problem


def test_not_a_checkout(tmp_path: Path) -> None:
    found = detect(str(tmp_path / "nowhere"))
    assert found.key is None and "no torchtitan/ package" in found.problem


def test_installed_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(version.metadata, "version", lambda name: "0.2.1")
    assert detect(None).key == "v0.2"
    monkeypatch.setattr(version.metadata, "version", lambda name: "0.3.0")
    assert detect(None).key is None

