"""`srun` inside a locally emulated allocation: one task per emulated node.

It starts the command once per node of SLURM_JOB_NODELIST (as `srun --ntasks-per-node=1`
would) with SLURM_NODEID, SLURM_PROCID, SLURM_LOCALID and SLURMD_NODENAME set per task,
forwards TERM/INT/HUP/USR1/USR2/CONT to every task (srun forwards these), and with
`--kill-on-bad-exit` stops the other tasks (TERM, then KILL after KillWait) as soon as one
exits non-zero. Its exit status is the highest task status (128+N for a task killed by
signal N), as srun's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from sweep.core.hostlist import expand

# The GPUs of each emulated node of a job, "0,1;2,3" (set by sweep.backends.local.backend): node i's
# CUDA_VISIBLE_DEVICES is the i-th.
NODE_GPUS_ENV = "SWEEP_LOCAL_NODE_GPUS"

KILL_WAIT_S = float(os.environ.get("SWEEP_LOCAL_KILL_WAIT_S", "5"))  # slurm.conf KillWait
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGCONT)
_VALUE_OPTIONS = {"-N": "nodes", "--nodes": "nodes", "-n": "ntasks", "--ntasks": "ntasks",
                  "--ntasks-per-node": "ntasks_per_node", "-c": "cpus", "--cpus-per-task": "cpus",
                  "--export": "export", "-J": "name", "--job-name": "name", "-o": "output",
                  "--output": "output", "-e": "error", "--error": "error", "--mem": "mem",
                  "--gpus-per-node": "gpus", "--cpu-bind": "cpu_bind", "--mpi": "mpi",
                  "-t": "time", "--time": "time", "--signal": "signal"}
_FLAGS = {"-l", "--label", "-u", "--unbuffered", "--exclusive", "--overlap", "-K",
          "--kill-on-bad-exit"}


class UsageError(ValueError):
    pass


@dataclass(frozen=True)
class Options:
    nodes: int
    kill_on_bad_exit: bool
    command: list[str]


def parse(argv: list[str], environ: dict[str, str]) -> Options:
    values: dict[str, str] = {}
    kill_on_bad_exit = False
    index = 0
    while index < len(argv) and argv[index].startswith("-"):
        arg = argv[index]
        name, has_value, value = arg.partition("=")
        if name in ("-K", "--kill-on-bad-exit"):
            kill_on_bad_exit = not has_value or value != "0"
        elif name in _FLAGS:
            pass
        elif name in _VALUE_OPTIONS:
            if not has_value:
                index += 1
                if index == len(argv):
                    raise UsageError(f"option {name} needs a value")
                value = argv[index]
            values[_VALUE_OPTIONS[name]] = value
        else:
            raise UsageError(f"option {name!r} is not emulated by the local backend's srun")
        index += 1
    command = argv[index:]
    if not command:
        raise UsageError("no command given")
    available = len(expand(environ.get("SLURM_JOB_NODELIST", "")))
    nodes = int(values.get("nodes", environ.get("SLURM_NNODES", str(available))).split("-")[0])
    if not 0 < nodes <= available:
        raise UsageError(f"--nodes={nodes}, but the allocation has {available} node(s)")
    if values.get("ntasks_per_node", "1") != "1" or values.get("ntasks", str(nodes)) != str(nodes):
        raise UsageError("the local backend runs one task per node (--ntasks-per-node=1)")
    return Options(nodes=nodes, kill_on_bad_exit=kill_on_bad_exit, command=command)


def task_env(environ: dict[str, str], nodes: list[str], index: int) -> dict[str, str]:
    env = dict(environ)
    node_gpus = environ.get(NODE_GPUS_ENV)
    if node_gpus:
        env["CUDA_VISIBLE_DEVICES"] = node_gpus.split(";")[index]
    env.update({
        "SLURM_NODEID": str(index), "SLURM_PROCID": str(index), "SLURM_LOCALID": "0",
        "SLURMD_NODENAME": nodes[index], "SLURM_NTASKS": str(len(nodes)),
        "SLURM_NPROCS": str(len(nodes)), "SLURM_STEP_NUM_TASKS": str(len(nodes)),
        "SLURM_STEP_NUM_NODES": str(len(nodes)), "SLURM_STEP_NODELIST": ",".join(nodes),
        "SLURM_STEP_ID": environ.get("SLURM_STEP_ID", "0"), "SLURM_TASKS_PER_NODE": "1",
    })
    return env


def status_of(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def describe(node: str, index: int, returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"srun: error: {node}: task {index}: {name}"
    return f"srun: error: {node}: task {index}: Exited with exit code {returncode}"


def run(options: Options, environ: dict[str, str]) -> int:
    nodes = expand(environ["SLURM_JOB_NODELIST"])[: options.nodes]
    tasks: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: object) -> None:
        for task in tasks:
            if task.poll() is None:
                try:
                    task.send_signal(signum)
                except ProcessLookupError:
                    pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    for index in range(len(nodes)):
        try:
            tasks.append(subprocess.Popen(options.command, env=task_env(environ, nodes, index)))
        except OSError as error:
            print(f"srun: error: {nodes[index]}: task {index}: execve(): {options.command[0]}: "
                  f"{error.strerror}", file=sys.stderr)
            forward(signal.SIGKILL, None)
            return 2
    reported: set[int] = set()
    kill_at: float | None = None
    while any(task.poll() is None for task in tasks):
        for index, task in enumerate(tasks):
            code = task.poll()
            if code is None or code == 0 or index in reported:
                continue
            reported.add(index)
            print(describe(nodes[index], index, code), file=sys.stderr, flush=True)
            if options.kill_on_bad_exit and kill_at is None:
                print("srun: error: Terminating job step (--kill-on-bad-exit)", file=sys.stderr,
                      flush=True)
                forward(signal.SIGCONT, None)
                forward(signal.SIGTERM, None)
                kill_at = time.monotonic() + KILL_WAIT_S
        if kill_at is not None and time.monotonic() >= kill_at:
            forward(signal.SIGKILL, None)
            kill_at = float("inf")
        time.sleep(0.05)
    for index, task in enumerate(tasks):
        if task.returncode and index not in reported:
            print(describe(nodes[index], index, task.returncode), file=sys.stderr, flush=True)
    return max(status_of(task.returncode) for task in tasks)


def main(argv: list[str] | None = None) -> int:
    environ = dict(os.environ)
    try:
        options = parse(list(sys.argv[1:] if argv is None else argv), environ)
    except (UsageError, ValueError) as error:
        print(f"srun (llm-sweep local backend): error: {error}", file=sys.stderr)
        return 2
    return run(options, environ)


if __name__ == "__main__":
    sys.exit(main())
