"""The walkthroughs' figures come from the code and the benchmarks, so they cannot drift:

- the number of runs and job arrays docs/cluster.md states is what `sweep submit --dry-run`
  makes of examples/local-slurm.yaml;
- the wall-clock figures the README and docs/cluster.md quote are the ones docs/speed.md records
  for `benchmarks/walkthrough_speed.py`, and the pages name that benchmark.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sweep.cli import main

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "docs" / "cluster.md"
README = ROOT / "README.md"
SPEED = ROOT / "docs" / "speed.md"


def flat(path: Path) -> str:
    """A page's text with its line breaks (and a shell comment's #) as single spaces."""
    return " ".join(path.read_text(encoding="utf-8").replace("\n#", "\n").split())


def recorded() -> dict[str, int]:
    """The figures of walkthrough_speed.py's row of docs/speed.md."""
    [row] = [line for line in SPEED.read_text(encoding="utf-8").splitlines()
             if line.startswith("| `walkthrough_speed.py`")]
    demo = re.search(r"demo (\d+) s", row)
    cluster = re.search(r"(\d+) runs in (\d+) arrays done in (\d+) s", row)
    assert demo and cluster, row
    return {"demo_s": int(demo.group(1)), "runs": int(cluster.group(1)),
            "arrays": int(cluster.group(2)), "cluster_s": int(cluster.group(3))}


def test_the_cluster_walkthrough_states_the_arrays_submit_makes(
        slurm_cluster: None, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["submit", "examples/local-slurm.yaml", "--out", str(tmp_path / "dry"),
                 "--dry-run"]) == 0
    found = re.search(r"would submit (\d+) run\(s\) in (\d+) array\(s\)", capsys.readouterr().out)
    assert found
    runs, arrays = int(found.group(1)), int(found.group(2))
    text = CLUSTER.read_text(encoding="utf-8")
    assert f"{runs} runs in {arrays} arrays" in text
    assert f"submitted {runs} run(s) in {arrays} array(s)" in text
    figures = recorded()
    assert (figures["runs"], figures["arrays"]) == (runs, arrays)


def test_the_wall_clock_figures_are_the_benchmarks() -> None:
    figures = recorded()
    readme = flat(README)
    assert f"about {figures['demo_s']} s on 2 cores, `benchmarks/walkthrough_speed.py`" in readme
    cluster = flat(CLUSTER)
    minutes = figures["cluster_s"] / 60
    assert (f"in about {figures['cluster_s']} s ({minutes:.1f} minutes) on 2 cores "
            "(`benchmarks/walkthrough_speed.py`") in cluster
    for text in (readme, cluster):
        assert "about 90 s" not in text and "about 6 minutes" not in text
