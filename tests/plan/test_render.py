"""Rendering: run folders from a plan, idempotent, overridable, and safe against hostile input."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from sweep.core.runconfig import load as load_run
from sweep.plan import render
from sweep.plan.spec import SpecError, parse_spec

SPEC = """
name: rendertest
framework: builtin
gpu: cpu
gpus_per_node: 2
models: [tiny-4l, tiny-gqa-4l]
nodes: [1, 2]
seq_len: 64
global_batch: {sequences: 8}
run: {steps: 4, warmup_steps: 1, partition: debug, account: proj-1, exclude: [n1, "n[3-4]"]}
overrides:
  - where: {model: tiny-gqa-4l, nodes: 2}
    set: {rank_memory_limit_mb: 300}
"""


def row(model: str = "tiny-4l", nodes: int = 1, tp: int = 1, **extra: object) -> dict[str, object]:
    dp = 2 * nodes // tp
    base = {"model": model, "nodes": nodes, "dp": dp, "tp": tp, "pp": 1, "cp": 1, "ep": 1,
            "mbs": 1, "grad_acc": 8 // dp, "zero_stage": 0, "vpp": 1, "recompute": "none",
            "sp": False, "pp_schedule": "1f1b"}
    return {**base, **extra}


def plan(*rows: dict[str, object]) -> pd.DataFrame:
    return pd.DataFrame(list(rows) or [row(), row("tiny-gqa-4l", 2), row(tp=2)])


def test_every_kept_row_becomes_a_run_folder(tmp_path: Path) -> None:
    frame = plan(row(), row(tp=2, status="pruned:memory"), row("tiny-gqa-4l", 2))
    frame["status"] = ["kept", "pruned:memory", "kept"]
    dirs = render.render_runs(parse_spec(SPEC), frame, tmp_path)
    assert len(dirs) == 2
    for run_dir in dirs:
        config = load_run(run_dir)
        assert run_dir == tmp_path.resolve() / "runs" / config.run_id
        assert (run_dir / "job.sbatch").read_text().startswith("#!/bin/bash\n")
        assert (run_dir / "launch" / "builtin.sh").is_file()
        assert (run_dir / "attempts").is_dir()
    assert sorted(load_run(d).layout.tp for d in dirs) == [1, 1]


def test_overrides_reach_run_json(tmp_path: Path) -> None:
    one, two = render.render_runs(parse_spec(SPEC), plan(row(), row("tiny-gqa-4l", 2)), tmp_path)
    assert load_run(one).settings["rank_memory_limit_mb"] is None
    assert load_run(two).settings["rank_memory_limit_mb"] == 300


def test_the_sbatch_script_carries_the_slurm_options(tmp_path: Path) -> None:
    [run_dir] = render.render_runs(parse_spec(SPEC), plan(row(nodes=2, tp=2)), tmp_path)
    script = (run_dir / "job.sbatch").read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --time=00:20:00",
                 "#SBATCH --partition=debug", "#SBATCH --account=proj-1",
                 "#SBATCH --exclude=n1,n[3-4]", "#SBATCH --signal=B:USR1@120",
                 "#SBATCH --exclusive", "#SBATCH --no-requeue",
                 f"#SBATCH --output={run_dir}/attempts/slurm-%j.out",
                 "export CUDA_DEVICE_MAX_CONNECTIONS=1", "export NCCL_DEBUG=WARN",
                 "export TORCH_NCCL_ASYNC_ERROR_HANDLING=3", "srun --kill-on-bad-exit=1"):
        assert line in script, line
    assert "--gpus-per-node" not in script  # gpu "cpu"
    assert "--qos" not in script and "--reservation" not in script


def test_tp1_runs_leave_cuda_connections_alone(tmp_path: Path) -> None:
    [run_dir] = render.render_runs(parse_spec(SPEC), plan(row()), tmp_path)
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in (run_dir / "job.sbatch").read_text()


def test_gpu_runs_ask_for_gpus_and_exclusive_is_configurable(tmp_path: Path) -> None:
    text = SPEC.replace("gpu: cpu", "gpu: h100-sxm").replace("gpus_per_node: 2", "gpus_per_node: 8")
    text = text.replace("run: {", "run: {exclusive: false, ")
    [run_dir] = render.render_runs(parse_spec(text), plan(row(dp=8, grad_acc=1)), tmp_path)
    script = (run_dir / "job.sbatch").read_text()
    assert "#SBATCH --gpus-per-node=8" in script
    assert "--exclusive" not in script
    assert "--nproc-per-node=8" in (run_dir / "launch" / "builtin.sh").read_text()


def test_rendering_again_rewrites_nothing(tmp_path: Path) -> None:
    spec = parse_spec(SPEC)
    dirs = render.render_runs(spec, plan(), tmp_path)
    files = sorted(p for d in dirs for p in d.rglob("*") if p.is_file())
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in files}
    assert render.render_runs(spec, plan(), tmp_path) == dirs
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in files} == before


def test_a_changed_setting_rewrites_only_what_changed(tmp_path: Path) -> None:
    dirs = render.render_runs(parse_spec(SPEC), plan(row()), tmp_path)
    launcher = dirs[0] / "launch" / "builtin.sh"
    stamp = launcher.stat().st_mtime_ns
    dirs2 = render.render_runs(parse_spec(SPEC.replace("steps: 4,", "steps: 5,")), plan(row()),
                               tmp_path)
    assert dirs2 == dirs  # settings are not part of the run id
    assert load_run(dirs[0]).settings["steps"] == 5
    assert launcher.stat().st_mtime_ns == stamp


def test_user_templates_override_the_packaged_ones_file_by_file(tmp_path: Path) -> None:
    mine = tmp_path / "mytemplates"
    mine.mkdir()
    (mine / "job.sbatch.j2").write_text(
        "#!/bin/bash\n# mine {{ run_id | comment }} {{ s.steps }}\n")
    spec = parse_spec(SPEC + "templates_dir: mytemplates\n")
    [run_dir] = render.render_runs(spec, plan(row()), tmp_path / "out", spec_dir=tmp_path)
    assert (run_dir / "job.sbatch").read_text() == f"#!/bin/bash\n# mine {run_dir.name} 4\n"
    assert "-m sweep.workload --run-dir" in (run_dir / "launch" / "builtin.sh").read_text()


def test_a_missing_templates_dir_is_named(tmp_path: Path) -> None:
    spec = parse_spec(SPEC + "templates_dir: nowhere\n")
    with pytest.raises(render.RenderError, match="templates_dir: .*nowhere is not a directory"):
        render.render_runs(spec, plan(row()), tmp_path, spec_dir=tmp_path)


@pytest.mark.parametrize("body, line, message", [
    ("#!/bin/bash\n# ok\necho {{ no_such_variable }}\n", 3, "no_such_variable"),
    ("#!/bin/bash\n{% if %}\n", 2, "syntax error"),
    ("#!/bin/bash\n\n\n#SBATCH --partition={{ 'a b' | slurm }}\n", 4,
     "cannot appear in an #SBATCH"),
    ("#!/bin/bash\n{% if true %}\necho {{ run_id }}\n{% endif %}\n", 3, "is output unquoted"),
    ("#!/bin/bash\necho {{ s.env }}\n", 2, "cannot be output as it is"),
])
def test_template_errors_name_the_template_and_line(tmp_path: Path, body: str, line: int,
                                                    message: str) -> None:
    mine = tmp_path / "t"
    mine.mkdir()
    (mine / "job.sbatch.j2").write_text(body)
    spec = parse_spec(SPEC + f"templates_dir: {mine}\n")
    with pytest.raises(render.RenderError) as caught:
        render.render_runs(spec, plan(row()), tmp_path / "out")
    assert f"job.sbatch.j2:{line}:" in str(caught.value)
    assert message in str(caught.value)


def test_the_quoting_filter_makes_any_value_one_shell_word() -> None:
    assert render.shq("plain") == "plain"
    assert render.shq("a b") == "'a b'"
    assert render.shq("$(touch x)`id`'") == "'$(touch x)`id`'\"'\"''"
    assert render.shq(True) == "true"


@pytest.mark.parametrize("field, value", [
    ("name", "x; rm -rf ~"), ("name", "$(id)"), ("run.partition", "gpu --wrap=id"),
    ("run.account", "a'b"), ("run.python", "python3; id"), ("run.framework_dir", "/opt/$(id)"),
    ("run.exclude", ["n1 n2"]),
])
def test_hostile_spec_values_are_rejected_before_rendering(field: str, value: object) -> None:
    data = {"name": "ok", "framework": "builtin", "gpu": "cpu", "models": ["tiny-4l"],
            "nodes": [1], "seq_len": 64, "global_batch": {"sequences": 8}, "run": {}}
    section, _, key = field.rpartition(".")
    (data[section] if section else data)[key] = value
    with pytest.raises(SpecError):
        parse_spec(json.dumps(data))


def test_hostile_env_values_are_quoted_into_inert_words(tmp_path: Path) -> None:
    hostile = "$(touch pwned1)`touch pwned2`'; touch pwned3; echo \""
    spec = parse_spec(SPEC.replace("run: {", f"run: {{env: {{HOSTILE: {json.dumps(hostile)}}}, "))
    [run_dir] = render.render_runs(spec, plan(row()), tmp_path)
    exports = [line for line in (run_dir / "job.sbatch").read_text().splitlines()
               if line.startswith("export HOSTILE=")]
    done = subprocess.run(["bash", "-c", exports[0] + '\nprintf %s "$HOSTILE"'], cwd=tmp_path,
                          capture_output=True, text=True, check=True)
    assert done.stdout == hostile
    assert not list(tmp_path.glob("pwned*"))


def test_a_sweep_folder_that_sbatch_lines_cannot_carry_is_refused(tmp_path: Path) -> None:
    with pytest.raises(render.RenderError, match="--out: .*#SBATCH"):
        render.render_runs(parse_spec(SPEC), plan(row()), tmp_path / "my results")


def test_plan_rows_for_unknown_models_are_refused(tmp_path: Path) -> None:
    with pytest.raises(render.RenderError, match="does not list"):
        render.render_runs(parse_spec(SPEC), plan(row("playbook-8b")), tmp_path)


def test_sweep_render_writes_the_kept_runs_of_a_spec(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from sweep.cli import main

    spec = tmp_path / "spec.yaml"
    axes = "axes: {tp: [1], pp: [1], mbs: [1], zero_stage: [0]}\n"
    spec.write_text(SPEC.replace("overrides:", axes + "overrides:"))
    assert main(["render", str(spec), "--out", str(tmp_path / "sweep")]) == 0
    dirs = sorted((tmp_path / "sweep" / "runs").iterdir())
    assert len(dirs) == 4  # two models x one and two nodes, DP only
    assert "rendered 4 run(s) of 4 candidate(s) from a new plan" in capsys.readouterr().out
    planned = pd.read_parquet(tmp_path / "sweep" / "plan.parquet")  # as `sweep plan` writes it
    assert (planned.pred_rank == 1).sum() == 4 and planned.pred_tokens_per_s_per_gpu.gt(0).all()
    assert main(["render", str(spec), "--out", str(tmp_path / "sweep")]) == 0
    assert f"from plan {tmp_path / 'sweep' / 'plan.parquet'}" in capsys.readouterr().out
    spec.write_text(spec.read_text().replace("steps: 4", "steps: 5"))  # another spec hash
    assert main(["render", str(spec), "--out", str(tmp_path / "sweep")]) == 2
    assert "holds runs of another spec" in capsys.readouterr().err
    assert main(["render", str(spec), "--out", str(tmp_path / "bad dir")]) == 2
    assert "--out:" in capsys.readouterr().err


def test_a_damaged_script_is_repaired_by_the_next_render(tmp_path: Path) -> None:
    [run_dir] = render.render_runs(parse_spec(SPEC), plan(row()), tmp_path)
    script = run_dir / "job.sbatch"
    whole = script.read_text()
    script.write_text(whole[: len(whole) // 2])  # as if a render had been killed mid-write
    (run_dir / "launch" / "stale.sh").write_text("left over\n")
    render.render_runs(parse_spec(SPEC), plan(row()), tmp_path)
    assert script.read_text() == whole
    assert sorted(p.name for p in (run_dir / "launch").iterdir()) == ["builtin.sh"]


def test_rendering_in_several_processes_writes_exactly_what_one_process_writes(
        tmp_path: Path, repo_root: Path) -> None:
    from sweep.plan import space
    from sweep.plan.spec import load_spec

    spec = load_spec(repo_root / "examples" / "playbook.yaml")
    plan = space.plan(spec)
    plan = plan[plan.status == "kept"].head(600)
    serial = render.render_runs(spec, plan, tmp_path / "serial", workers=1)
    forked = render.render_runs(spec, plan, tmp_path / "forked", workers=3)
    assert [d.name for d in forked] == [d.name for d in serial] == list(plan.run_id)

    def files(root: Path) -> dict[str, str]:
        return {str(p.relative_to(root)): p.read_text().replace(str(root), "<out>")
                for p in root.rglob("*") if p.is_file()}

    assert files(tmp_path / "forked") == files(tmp_path / "serial")


@pytest.mark.parametrize("workers", [1, 2])
def test_duplicate_plan_rows_are_refused_before_anything_is_written(
        workers: int, tmp_path: Path, repo_root: Path) -> None:
    from sweep.plan import space
    from sweep.plan.spec import load_spec

    spec = load_spec(repo_root / "examples" / "local-cpu.yaml")
    plan = space.plan(spec)
    kept = plan[plan.status == "kept"]
    doubled = pd.concat([kept, kept.head(1)])
    with pytest.raises(render.RenderError, match="duplicate rows"):
        render.render_runs(spec, doubled, tmp_path / "out", workers=workers)
    assert not (tmp_path / "out" / "runs").exists()


CLUSTER_SPEC = SPEC.replace(
    "run: {steps: 4,",
    "run: {setup: ['module load cuda/12.4', 'source /opt/venvs/bench/bin/activate'], "
    "container_image: 'nvcr.io#nvidia/pytorch:25.01-py3', container_mounts: ['/datasets:/data:ro'], "
    "steps: 4,")


def test_setup_lines_appear_verbatim_before_launch_and_containers_wrap_the_watchdog(
        tmp_path: Path) -> None:
    [run_dir] = render.render_runs(parse_spec(CLUSTER_SPEC), plan(row()), tmp_path)
    job = (run_dir / "job.sbatch").read_text()
    assert "\nmodule load cuda/12.4\nsource /opt/venvs/bench/bin/activate\n" in job
    assert job.index("module load cuda/12.4") < job.index("sweep.job.provenance") < job.index("srun ")
    assert "--container-image='nvcr.io#nvidia/pytorch:25.01-py3'" in job
    assert 'CONTAINER_MOUNTS="$RUN_DIR:$RUN_DIR",/datasets:/data:ro' in job
    done = subprocess.run(["bash", "-n", str(run_dir / "job.sbatch")], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_jobs_run_the_interpreter_that_rendered_them_unless_the_spec_names_one(
        tmp_path: Path) -> None:
    import os
    import sys

    [run_dir] = render.render_runs(parse_spec(SPEC), plan(row()), tmp_path / "a")
    job = (run_dir / "job.sbatch").read_text()
    assert f"PYTHON={os.path.abspath(sys.executable)}\n" in job
    named = SPEC.replace("run: {steps: 4,", "run: {python: /opt/bench/bin/python, steps: 4,")
    [run_dir] = render.render_runs(parse_spec(named), plan(row()), tmp_path / "b")
    assert "PYTHON=/opt/bench/bin/python\n" in (run_dir / "job.sbatch").read_text()
