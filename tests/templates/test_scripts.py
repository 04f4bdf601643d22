"""Every shell script rendered from the playbook spec passes `bash -n` and shellcheck, under each
of the four frameworks, and sbatch accepts the job scripts.

The playbook renders thousands of scripts that differ only in numbers and run ids. Checking each
would take minutes, so the scripts are grouped by their text with every run id and every digit
masked: neither bash's parser nor shellcheck's rules depend on a numeral's value, so one script
per group stands for all of its group, and every template branch that any run takes is checked.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sweep.plan import render, space
from sweep.plan.spec import load_spec, parse_spec

FRAMEWORK_ZERO = {"nanotron": "[0, 1]", "megatron": "[0, 1]", "torchtitan": "[0, 2, 3]",
                  "builtin": "[0, 1, 2, 3]"}


def rendered_scripts(spec_text: str, source: str) -> dict[str, str]:
    """Every shell script of every kept run, in memory: {"<run id>/<file>": text}."""
    spec = parse_spec(spec_text, source)
    env = render.make_environment()
    names = render.launch_templates(env, spec.framework)
    scripts = {}
    for row in render.kept_rows(space.plan(spec)):
        config = render.resolve_run(spec, row)
        files = render.render_files(env, config, Path("/sweep/runs") / config.run_id, names)
        scripts.update({f"{config.run_id}/{rel}": text for rel, text in files.items()
                        if rel.endswith((".sh", ".sbatch"))})
    return scripts


def representatives(scripts: dict[str, str]) -> dict[str, str]:
    groups: dict[str, str] = {}
    for key, text in scripts.items():
        run_id = key.split("/")[0]
        masked = re.sub(r"\d+", "0", text.replace(run_id, "RUN"))
        groups.setdefault(masked, key)
    return {key: scripts[key] for key in groups.values()}


@pytest.fixture(scope="module", params=list(FRAMEWORK_ZERO))
def playbook_scripts(request: pytest.FixtureRequest, repo_root: Path,
                     tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list[Path]]:
    framework = request.param
    text = (repo_root / "examples" / "playbook.yaml").read_text()
    text = text.replace("framework: nanotron", f"framework: {framework}")
    if framework != "nanotron":  # the playbook pins a nanotron commit
        text = text.replace("framework_version: playbook-e24d2483", "framework_version: null")
    if framework == "torchtitan":  # it defines the Llama 3 shapes, not the playbook's
        text = text.replace("models: [playbook-1b, playbook-3b, playbook-8b, playbook-80b]",
                            "models: [llama-3.1-8b, llama-3.1-70b]")
    text = text.replace("zero_stage: [0, 1]", f"zero_stage: {FRAMEWORK_ZERO[framework]}")
    scripts = rendered_scripts(text, f"playbook.yaml ({framework})")
    folder = tmp_path_factory.mktemp(framework)
    paths = []
    for index, (key, body) in enumerate(sorted(representatives(scripts).items())):
        path = folder / f"{index:03d}-{Path(key).name}"
        path.write_text(body)
        paths.append(path)
    return len(scripts), paths


def test_the_playbook_renders_thousands_of_scripts_in_few_shapes(playbook_scripts) -> None:
    total, paths = playbook_scripts
    assert total > 1000
    assert {p.name.split("-", 1)[1] for p in paths} >= {"job.sbatch"}
    assert 2 <= len(paths) < 200


def test_bash_parses_every_rendered_script(playbook_scripts) -> None:
    for path in playbook_scripts[1]:
        done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert done.returncode == 0, f"{path.name}: {done.stderr}"


def test_shellcheck_passes_every_rendered_script(playbook_scripts) -> None:
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is missing: apt-get install shellcheck (scripts/test.sh does)")
    done = subprocess.run(["shellcheck", "--shell=bash", "--severity=info",
                           *map(str, playbook_scripts[1])], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-6000:]


def test_shellcheck_would_catch_an_unquoted_expansion(tmp_path: Path) -> None:
    """Negative control: the check above is able to fail."""
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is missing")
    bad = tmp_path / "bad.sh"
    bad.write_text('#!/bin/bash\nRUN_DIR=$1\nrm -rf $RUN_DIR/attempts\n')
    assert subprocess.run(["shellcheck", str(bad)], capture_output=True).returncode != 0


@pytest.mark.slurm
def test_sbatch_accepts_the_job_scripts(slurm_cluster: None, repo_root: Path,
                                        tmp_path: Path) -> None:
    """`sbatch --test-only` against the local cluster (scripts/local-slurm.sh start): the demo's
    scripts as they are; the playbook's with one override, --gpus-per-node=0, because the local
    cluster has no GPUs (an honest stand-in for a GPU partition), for the runs on <= 2 nodes."""
    demo = load_spec(repo_root / "examples" / "local-cpu.yaml")
    demo_dirs = render.render_runs(demo, space.plan(demo), tmp_path / "demo")
    playbook = load_spec(repo_root / "examples" / "playbook.yaml")
    plan = space.plan(playbook)
    small = plan[(plan["status"] == space.KEPT) & (plan["nodes"] <= 2)]
    small = small.groupby(["model", "nodes"], observed=True).head(1)
    playbook_dirs = render.render_runs(playbook, small, tmp_path / "playbook")
    assert demo_dirs and playbook_dirs
    for run_dir, extra in [(d, []) for d in demo_dirs] + \
                          [(d, ["--gpus-per-node=0"]) for d in playbook_dirs]:
        done = subprocess.run(["sbatch", "--test-only", *extra, str(run_dir / "job.sbatch")],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{run_dir.name}: {done.stderr}"
        assert "to start at" in done.stderr
