"""The preflight: one tiny job on the target partition before a sweep's first array.

A sweep of thousands of jobs that all fail the same way in their first second (the interpreter
is not there on the compute nodes, llm-sweep is not installed in it, the framework checkout is
another version, no GPU is visible, the sweep folder is not on a filesystem the nodes share)
wastes a queue wait and buries the cause under thousands of identical logs. The preflight runs
the same checks once, in seconds, and `sweep submit` submits nothing until it passes.

Two halves:
- on the login node, `run_preflight` writes `preflight/preflight.sh`, submits it with the run's
  own Slurm options (`sbatch --wait`), and reads the verdict the job wrote;
- on the compute node, `python -m sweep.backends.slurm.preflight --node-check ...` (started by that script
  with the run's interpreter) checks what the runs will need and writes `preflight/result-<job>.json`
  into the sweep folder, which proves that folder is shared and writable from the node.

A pass is remembered (`preflight/passed.json`, keyed by everything the checks depend on), so
`sweep resume` and later submits of the same sweep do not repeat it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

PREFLIGHT_DIR: Final = "preflight"
PASSED_FILE: Final = "passed.json"
SCRIPT_FILE: Final = "preflight.sh"
DEFAULT_TIMEOUT_S: Final = 600.0  # queue wait included; --preflight-timeout changes it
OUTPUT_TAIL_LINES: Final = 15
SLURM_OPTIONS: Final = ("partition", "account", "qos", "constraint", "reservation")


class PreflightError(RuntimeError):
    """The preflight failed or could not run; the message says what to fix."""


@dataclass(frozen=True)
class PreflightTarget:
    """What the runs of a sweep need on a compute node (from one rendered run.json)."""

    python: str
    framework: str
    framework_version: str
    framework_dir: str | None
    checkout_env: str
    gpus_per_node: int | None  # None: CPU runs
    slurm: tuple[tuple[str, str], ...]  # (option, value) pairs: partition, account, ...
    gpu: str | None = None  # the catalog GPU type the runs' MFU divides by; None: CPU runs
    setup: tuple[str, ...] = ()
    container_image: str | None = None
    container_mounts: tuple[str, ...] = ()

    def key(self) -> str:
        """Everything the verdict depends on: a pass holds while this is unchanged."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def target_of(run_json: dict[str, Any]) -> PreflightTarget:
    """The preflight target of one run (run.json's document)."""
    from sweep.frameworks import get_adapter

    settings = run_json.get("settings") or {}
    framework = str(run_json["framework"])
    adapter = get_adapter(framework)
    gpu = str(run_json.get("gpu", "cpu"))
    return PreflightTarget(
        python=str(settings.get("python") or sys.executable),
        framework=framework,
        framework_version=adapter.version(settings.get("framework_version")).key,
        framework_dir=settings.get("framework_dir"),
        checkout_env=adapter.checkout_env,
        gpus_per_node=None if gpu == "cpu" else int(run_json.get("gpus_per_node") or 1),
        gpu=None if gpu == "cpu" else gpu,
        slurm=tuple((name, str(settings[name])) for name in SLURM_OPTIONS if settings.get(name)),
        setup=tuple(settings.get("setup") or ()),
        container_image=settings.get("container_image"),
        container_mounts=tuple(settings.get("container_mounts") or ()),
    )


# The login node ------------------------------------------------------------------------------

def script_text(target: PreflightTarget, sweep_dir: Path) -> str:
    """The preflight job: the run's setup lines, then the node check with the run's interpreter.
    Every value is shell-quoted; setup lines are the user's own shell, as in job.sbatch."""
    folder = sweep_dir / PREFLIGHT_DIR
    python = shlex.quote(target.python)
    check = ["-m", "sweep.backends.slurm.preflight", "--node-check", "--out",
             f"{folder}/result-${{SLURM_JOB_ID}}.json", "--framework", target.framework,
             "--want", target.framework_version]
    if target.gpus_per_node:
        check += ["--gpus", str(target.gpus_per_node)]
    if target.gpu:
        check += ["--gpu", target.gpu]
    quoted = " ".join(shlex.quote(a) if "$" not in a else f'"{a}"' for a in check)
    lines = ["#!/bin/bash",
             "# llm-sweep preflight (written by `sweep submit`): can this sweep's runs start here?",
             "set -u", *target.setup]
    if target.checkout_env:
        lines += [f"FRAMEWORK_DIR=$(printenv {shlex.quote(target.checkout_env)} || true)",
                  f"FRAMEWORK_DIR=${{FRAMEWORK_DIR:-{shlex.quote(target.framework_dir or '')}}}"]
    else:
        lines += [f"FRAMEWORK_DIR={shlex.quote(target.framework_dir or '')}"]
    run = (f'{python} {quoted} ${{FRAMEWORK_DIR:+--framework-dir "$FRAMEWORK_DIR"}}')
    if target.container_image:
        mounts = ",".join([f"{sweep_dir}:{sweep_dir}", *target.container_mounts])
        run = (f"srun --ntasks=1 --container-image={shlex.quote(target.container_image)} "
               f"--container-mounts={shlex.quote(mounts)} {run}")
    else:
        lines += [f'if ! command -v {python} >/dev/null 2>&1; then',
                  f'  echo "preflight: the interpreter {target.python} is not there on '
                  f'$(hostname): set run.python in the spec to an interpreter the compute nodes '
                  f'have, with llm-sweep installed" >&2',
                  "  exit 2",
                  "fi"]
    lines += [f"exec {run}" if not target.container_image else run, ""]
    return "\n".join(lines)


def sbatch_options(target: PreflightTarget, output: Path) -> list[str]:
    options = ["--parsable", "--wait", "--job-name=llm-sweep-preflight", "--nodes=1",
               "--ntasks=1", "--time=00:05:00", f"--output={output}", f"--error={output}"]
    options += [f"--{name}={value}" for name, value in target.slurm]
    if target.gpus_per_node:
        options.append(f"--gpus-per-node={target.gpus_per_node}")
    return options


def passed_before(sweep_dir: Path, target: PreflightTarget) -> bool:
    try:
        record = json.loads((sweep_dir / PREFLIGHT_DIR / PASSED_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("key") == target.key()


def ensure_passed(sweep_dir: Path, timeout_s: float, say: Callable[[str], None]) -> None:
    """Run the preflight once per sweep and settings, before anything is submitted: nothing when
    there is nothing to check it by (no run rendered, or a hand-made job.sbatch) or a pass is
    remembered for the same settings; else one job, saying (`say`, e.g. print) what it checks
    before it waits for it and where it passed after. UserError when the preflight fails or a
    run's framework or version is one this llm-sweep does not know."""
    from sweep.core.errors import UserError
    from sweep.core.state import read_json
    from sweep.plan.render import run_dirs_of

    run_dirs = run_dirs_of(sweep_dir)
    if not run_dirs:
        return
    document = read_json(run_dirs[0] / "run.json")
    if not isinstance(document, dict) or "framework" not in document:
        return  # not a run `sweep render` wrote (a hand-made job.sbatch): nothing to check it by
    try:
        target = target_of(document)
    except ValueError as error:  # a framework or version this llm-sweep does not know
        raise UserError(f"preflight: {run_dirs[0] / 'run.json'}: {error}") from None
    if passed_before(sweep_dir, target):
        return
    say(f"preflight: one job on {dict(target.slurm).get('partition', 'the default partition')}"
        f" checks {target.python}, {target.framework} and the sweep folder ...")
    try:
        result = run_preflight(sweep_dir, target, timeout_s)
    except PreflightError as error:
        raise UserError(f"preflight failed: {error}") from None
    say(f"preflight passed on {result['host']} in {result['seconds']:.1f} s "
        f"({result['framework']['found']})")


def run_preflight(sweep_dir: Path, target: PreflightTarget,
                  timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """Submit the preflight job, wait for it, and return its result; PreflightError when it
    failed or could not run. Nothing else is submitted by this function."""
    from sweep.core.state import atomic_write_json, atomic_write_text

    if shutil.which("sbatch") is None:
        raise PreflightError("sbatch is not on PATH: run this on a Slurm login node, or use "
                             "`sweep run` for a local sweep")
    folder = sweep_dir.resolve() / PREFLIGHT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / SCRIPT_FILE
    atomic_write_text(script, script_text(target, sweep_dir.resolve()))
    script.chmod(0o755)
    output = folder / "slurm-%j.out"
    argv = ["sbatch", *sbatch_options(target, output), str(script)]
    started = time.monotonic()
    # `sbatch --wait` runs in a session of its own, so a hang-up of the submitter's terminal
    # (SIGHUP to its process group) does not kill it: the submitter, which notes the SIGHUP and
    # goes on (sweep.backends.slurm.submit_record), still waits for it. Whatever else ends the
    # wait (the timeout, Ctrl-C, SIGTERM) ends sbatch and cancels the job: nothing is orphaned.
    wait = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = wait.communicate(timeout=timeout_s)
    except BaseException as error:
        wait.kill()
        stdout, _ = wait.communicate()
        _cancel((stdout or "").strip().split(";")[0])
        if not isinstance(error, subprocess.TimeoutExpired):
            raise
        raise PreflightError(
            f"the preflight job did not finish within {timeout_s:.0f} s (queued behind other "
            "jobs?); nothing was submitted. Try again with a longer --preflight-timeout, or skip "
            "it with --no-preflight") from None
    job_id = stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise PreflightError(f"sbatch refused the preflight job: {stderr.strip()} "
                             f"(options: {' '.join(argv[1:-1])}); fix the spec's Slurm settings")
    result = _read_result(folder / f"result-{job_id}.json")
    log = _tail(folder / f"slurm-{job_id}.out")
    if result is None:
        raise PreflightError(
            f"the preflight job {job_id} wrote no result to {folder} (exit code of sbatch "
            f"--wait: {wait.returncode}). Either its interpreter could not run llm-sweep, or the "
            f"sweep folder is not on a filesystem the compute nodes share. Its output:\n{log}")
    problems = list(result.get("problems") or [])
    if problems:
        raise PreflightError(f"the preflight on {result.get('host')} (job {job_id}) found:\n"
                             + "\n".join(f"  - {p}" for p in problems)
                             + "\nnothing was submitted; fix these, or skip the check with "
                               "--no-preflight")
    result["job_id"], result["seconds"] = job_id, round(time.monotonic() - started, 3)
    atomic_write_json(folder / PASSED_FILE, {"key": target.key(), "result": result,
                                             "time": time.time()})
    return result


def _read_result(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "  (no output file)"
    return "\n".join(f"  | {line}" for line in lines[-OUTPUT_TAIL_LINES:]) or "  (empty)"


def _cancel(job_id: str) -> None:
    if job_id.isdigit():
        subprocess.run(["scancel", job_id], capture_output=True, check=False)


# The compute node ----------------------------------------------------------------------------

def _nvidia_smi(*arguments: str) -> list[str]:
    """nvidia-smi's non-empty output lines; [] without nvidia-smi or when it fails to answer."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        done = subprocess.run(["nvidia-smi", *arguments], capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def visible_gpu_ids() -> list[str]:
    """GPUs this process can use, as CUDA_VISIBLE_DEVICES names them: its own entries when set
    (by Slurm, or by hand), else the indices of nvidia-smi's list; none without nvidia-smi."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    count = sum(1 for line in _nvidia_smi("-L") if line.startswith("GPU "))
    return [str(index) for index in range(count)]


def visible_gpus() -> int:
    """How many GPUs this job can use (`visible_gpu_ids`)."""
    return len(visible_gpu_ids())


def gpu_models() -> list[str]:
    """The product name of each GPU nvidia-smi lists (all of the node's: a job's devices are of
    one node, and mixed nodes are rare enough to report as a whole); [] without nvidia-smi."""
    return _nvidia_smi("--query-gpu=name", "--format=csv,noheader")


def node_check(framework: str, want: str, framework_dir: str | None,
               gpus: int | None, gpu: str | None = None) -> dict[str, Any]:
    """What this node says about the runs' needs: a list of problems, empty when all is well."""
    import sweep
    from sweep.core.catalog import gpu_mismatch
    from sweep.frameworks.versions import detect, missing_requirements, refusal

    problems: list[str] = []
    detected = detect(framework, framework_dir)
    refused = refusal(framework, want, detected)
    if refused:
        problems.append(refused)
    problems += missing_requirements(framework, want)
    found_gpus = visible_gpus() if gpus else None
    if gpus and (found_gpus or 0) < gpus:
        problems.append(f"{found_gpus or 0} GPU(s) visible, the runs need {gpus} per node: "
                        "check the partition (run.partition) and --gpus-per-node on this cluster")
    models = gpu_models() if gpu else []
    mismatch = gpu_mismatch(gpu, models) if gpu else None
    if mismatch:
        problems.append(mismatch)
    return {"host": socket.gethostname(), "python": sys.executable,
            "llm_sweep": sweep.__version__, "framework": asdict(detected),
            "gpus_visible": found_gpus, "gpu_models": models, "problems": problems,
            "time": time.time()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweep.backends.slurm.preflight",
                                     description="the compute-node half of `sweep submit`'s "
                                                 "preflight")
    parser.add_argument("--node-check", action="store_true", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--framework", required=True)
    parser.add_argument("--want", required=True)
    parser.add_argument("--framework-dir", default=None)
    parser.add_argument("--gpus", type=int, default=None)
    parser.add_argument("--gpu", default=None, help="the catalog GPU type the runs ask for")
    args = parser.parse_args(argv)
    from sweep.core.state import atomic_write_json

    result = node_check(args.framework, args.want, args.framework_dir or None, args.gpus,
                        args.gpu)
    try:
        atomic_write_json(args.out, result)
    except OSError as error:
        print(f"preflight: cannot write {args.out} from {result['host']}: {error}; the sweep "
              "folder must be on a filesystem the compute nodes share and can write",
              file=sys.stderr)
        return 2
    for problem in result["problems"]:
        print(f"preflight: {problem}", file=sys.stderr)
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
