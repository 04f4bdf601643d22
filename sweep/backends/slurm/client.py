"""The Slurm command line: sbatch, squeue, sacct, scancel, scontrol.

pyslurm cannot build against the Slurm versions clusters run, so we drive the CLI with
machine-readable formats (`--parsable`, `-o` with a separator, `sacct -P`). Parsing is pure
(functions over text); `Slurm` runs the commands, counts them (status must stay within one
squeue and one sacct per 1,000 jobs per poll), and turns failures into `SlurmError` that say
what to do.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

QUERY_CHUNK: Final = 1000  # job ids per squeue/sacct call
SEP: Final = "|"
SQUEUE_FORMAT: Final = SEP.join(["%i", "%T", "%r", "%N", "%k"])
SACCT_FIELDS: Final = ("JobID", "JobIDRaw", "JobName", "State", "ExitCode", "DerivedExitCode",
                       "NodeList", "Start", "End", "ElapsedRaw", "AllocTRES", "SubmitLine")

# scancel of a job that ended meanwhile: nothing left to cancel, not an error.
_GONE: Final = ("Invalid job id specified", "already completing or completed")
Runner = Callable[[Sequence[str]], subprocess.CompletedProcess[str]]


class SlurmError(RuntimeError):
    pass


@dataclass(frozen=True)
class SlurmLimits:
    max_array_size: int  # the highest array index allowed is max_array_size - 1
    max_job_count: int  # jobs slurmctld holds at once, array tasks and finished ones included


@dataclass(frozen=True)
class QueueEntry:
    job_id: str  # "123" or "123_4" (array task) or "123_[5-9]" (pending array remainder)
    state: str
    reason: str
    nodes: str
    comment: str


@dataclass(frozen=True)
class AcctEntry:
    job_id: str  # "123", "123_4", "123_4.batch", "123_4.0"
    job_id_raw: str
    name: str
    state: str  # first word: "CANCELLED by 0" -> "CANCELLED"
    exit_code: str
    derived_exit_code: str
    nodes: str
    start: str
    end: str
    elapsed_s: int
    submit_line: str
    steps: tuple[AcctEntry, ...] = field(default=())

    @property
    def is_step(self) -> bool:
        return "." in self.job_id


def parse_config(text: str) -> dict[str, str]:
    """`scontrol show config` as a mapping (keys as printed)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            values[key.strip()] = value.strip()
    return values


def limits_from_config(config: dict[str, str]) -> SlurmLimits:
    def number(key: str, default: int) -> int:
        raw = config.get(key, "").split()[0] if config.get(key) else ""
        return int(raw) if raw.isdigit() else default

    return SlurmLimits(max_array_size=number("MaxArraySize", 1001),
                       max_job_count=number("MaxJobCount", 10000))


def parse_max_submit(text: str) -> int | None:
    """The smallest MaxSubmit/GrpSubmit of `sacctmgr -P show assoc` lines; None if unset."""
    values = [int(v) for line in text.splitlines() for v in line.split(SEP) if v.strip().isdigit()]
    return min(values) if values else None


def parse_squeue(text: str) -> list[QueueEntry]:
    entries = []
    for line in text.splitlines():
        parts = line.split(SEP, 4)
        if len(parts) == 5:
            entries.append(QueueEntry(*parts))
    return entries


def parse_sacct(text: str) -> list[AcctEntry]:
    """Job rows with their step rows attached (`123_4.batch` under `123_4`)."""
    jobs: dict[str, AcctEntry] = {}
    steps: dict[str, list[AcctEntry]] = {}
    for line in text.splitlines():
        parts = line.split(SEP, len(SACCT_FIELDS) - 1)
        if len(parts) != len(SACCT_FIELDS):
            continue
        job_id, raw, name, state, exit_code, derived, nodes, start, end, elapsed, _tres, submit = parts
        entry = AcctEntry(job_id=job_id, job_id_raw=raw, name=name, state=state.split(" ")[0],
                          exit_code=exit_code, derived_exit_code=derived, nodes=nodes, start=start,
                          end=end, elapsed_s=int(elapsed) if elapsed.isdigit() else 0,
                          submit_line=submit)
        if entry.is_step:
            steps.setdefault(job_id.split(".")[0], []).append(entry)
        else:
            jobs[job_id] = entry
    return [
        AcctEntry(**{**entry.__dict__, "steps": tuple(steps.get(job_id, ()))})
        for job_id, entry in jobs.items()
    ]


# sinfo's long node states (%T) that mean the node itself is at fault; a trailing "*" means
# "not responding" whatever the state. Flags such as "~" (powered off) or "@" (reboot pending)
# say nothing about health and are dropped.
_UNHEALTHY_STATES = frozenset({"down", "drain", "drained", "draining", "fail", "failing"})
_STATE_FLAGS = "*~#!%$@^-+"


def parse_unhealthy_nodes(text: str) -> set[str]:
    """The nodes of `sinfo -h -N -o '%N|%T'` that are down, drained, failing or not responding."""
    nodes = set()
    for line in text.splitlines():
        name, _, state = line.strip().partition(SEP)
        if name and state and (state.endswith("*") or state.rstrip(_STATE_FLAGS).lower()
                               in _UNHEALTHY_STATES):
            nodes.add(name)
    return nodes


def parse_usable_nodes(text: str) -> list[str]:
    """The nodes of `sinfo -h -N -o '%N|%T'` that can run a job (none of the unhealthy states
    of `parse_unhealthy_nodes`), sorted and each once (sinfo lists a node once per partition)."""
    unhealthy = parse_unhealthy_nodes(text)
    names = {line.strip().partition(SEP)[0] for line in text.splitlines() if line.strip()}
    return sorted(name for name in names if name and name not in unhealthy)


def chunks(items: Sequence[str], size: int = QUERY_CHUNK) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


class Slurm:
    """Runs Slurm commands; `calls` counts them per command name."""

    def __init__(self, runner: Runner | None = None) -> None:
        self._runner = runner or _run
        self.calls: dict[str, int] = {}
        # File descriptors the commands inherit: the sweep's submit lock, so that an sbatch
        # outliving a killed submitter holds the lock until its job is in the queue.
        self.inherit_fds: tuple[int, ...] = ()

    def _call(self, argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        name = argv[0]
        if self._runner is _run and shutil.which(name) is None:
            raise SlurmError(
                f"`{name}` is not on PATH: run this on a Slurm login node, or use `sweep run` "
                "to run the sweep on this machine without Slurm")
        self.calls[name] = self.calls.get(name, 0) + 1
        result = _run(argv, self.inherit_fds) if self._runner is _run else self._runner(argv)
        if check and result.returncode != 0:
            message = (result.stderr or result.stdout).strip().splitlines()
            raise SlurmError(f"`{' '.join(argv[:2])} …` failed (exit {result.returncode}): "
                             f"{message[-1] if message else 'no message'}")
        return result

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())

    def limits(self) -> SlurmLimits:
        return limits_from_config(parse_config(self._call(["scontrol", "show", "config"]).stdout))

    def unhealthy_nodes(self) -> set[str]:
        """Nodes Slurm now holds down, drained, failing or not responding (one sinfo call)."""
        return parse_unhealthy_nodes(self._call(["sinfo", "-h", "-N", "-o", f"%N{SEP}%T"]).stdout)

    def usable_nodes(self, partition: str | None = None) -> list[str]:
        """The nodes of `partition` (default: every partition) that can run a job now."""
        argv = ["sinfo", "-h", "-N", "-o", f"%N{SEP}%T", *([f"--partition={partition}"]
                                                          if partition else [])]
        return parse_usable_nodes(self._call(argv).stdout)

    def job_count(self, user: str | None = None) -> int:
        """Jobs slurmctld holds now (every array task counts, and `-t all` adds the finished ones
        it keeps for MinJobAge, which MaxJobCount counts too); `user`: only that user's."""
        argv = ["squeue", "-h", "-r", "-t", "all", "-o", "%i", *(["-u", user] if user else [])]
        out = self._call(argv).stdout
        return sum(1 for line in out.splitlines() if line.strip())

    def max_submit_jobs(self, user: str) -> int | None:
        """The user's MaxSubmitJobs association limit; None when unset or unreadable (no
        accounting database, or sacctmgr missing)."""
        if self._runner is _run and shutil.which("sacctmgr") is None:
            return None
        result = self._call(["sacctmgr", "-n", "-P", "show", "assoc", f"where user={user}",
                             "format=MaxSubmit,GrpSubmit"], check=False)
        if result.returncode != 0:
            return None
        return parse_max_submit(result.stdout)

    def submit(self, script: str, options: Sequence[str], args: Sequence[str] = ()) -> str:
        """sbatch; returns the job id (the array's master id for arrays). `args` go to the
        script."""
        out = self._call(["sbatch", "--parsable", *options, script, *args]).stdout.strip()
        job_id = out.split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch printed no job id: {out!r}")
        return job_id

    def queue(self, job_ids: Sequence[str]) -> list[QueueEntry]:
        """Live jobs among `job_ids`, array tasks expanded: one squeue per 1,000 ids."""
        entries: list[QueueEntry] = []
        for chunk in chunks(sorted(set(job_ids))):
            result = self._call(["squeue", "-h", "-r", "-o", SQUEUE_FORMAT, "-j", ",".join(chunk)],
                                check=False)
            # squeue exits 1 with "Invalid job id specified" when every id has left the queue.
            if result.returncode != 0 and "Invalid job id" not in result.stderr:
                raise SlurmError(f"squeue failed: {result.stderr.strip()}")
            entries += parse_squeue(result.stdout)
        return entries

    def accounting(self, job_ids: Sequence[str]) -> list[AcctEntry]:
        """Accounting rows (jobs with steps) for `job_ids`: one sacct per 1,000 ids."""
        entries: list[AcctEntry] = []
        for chunk in chunks(sorted(set(job_ids))):
            result = self._call(["sacct", "-P", "-n", "--delimiter", SEP, "-o", ",".join(SACCT_FIELDS),
                                 "-j", ",".join(chunk)], check=False)
            if result.returncode != 0:
                raise SlurmError(f"sacct failed: {result.stderr.strip()} (is slurmdbd running?)")
            entries += parse_sacct(result.stdout)
        return entries

    def tagged_jobs(self, since: float) -> list[tuple[str, str]]:
        """(master job id, tag text) of the jobs submitted since `since` (epoch seconds): the
        comment from squeue for jobs slurmctld holds (`-t all`), and the comment and sbatch
        command line from sacct for the others. Used to find which batches reached Slurm when
        a submitter died between sbatch and its ledger record. One squeue, one sacct."""
        tags: list[tuple[str, str]] = []
        out = self._call(["squeue", "-h", "-t", "all", "-o", f"%F{SEP}%k"]).stdout
        for line in out.splitlines():
            master, _, comment = line.partition(SEP)
            tags.append((master.strip(), comment))
        start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since - 60))
        result = self._call(["sacct", "-X", "-n", "-P", "--delimiter", SEP, "-S", start,
                             "-o", "JobID,Comment,SubmitLine"], check=False)
        if result.returncode == 0:
            for line in result.stdout.splitlines():
                job, _, rest = line.partition(SEP)
                tags.append((job.split("_")[0].split(".")[0], rest))
        return tags

    def cancel(self, job_ids: Sequence[str], *, signal: str | None = None,
               states: Sequence[str] = ()) -> None:
        """scancel; `states` (e.g. PENDING) limits it to jobs or tasks in those states."""
        options = [*([f"--signal={signal}"] if signal else []),
                   *([f"--state={','.join(states)}"] if states else [])]
        for chunk in chunks(sorted(set(job_ids))):
            result = self._call(["scancel", *options, *chunk], check=False)
            errors = [line for line in result.stderr.splitlines() if line.strip()
                      and not any(benign in line for benign in _GONE)]
            if result.returncode != 0 and errors:
                raise SlurmError(f"scancel failed (exit {result.returncode}): {errors[-1]}")


def _run(argv: Sequence[str], pass_fds: Sequence[int] = ()) -> subprocess.CompletedProcess[str]:
    # A session of its own: a hang-up of the user's terminal (SIGHUP to the submitter's process
    # group) does not kill an sbatch midway; the submitter waits for it (and, when an exception
    # ends the wait, subprocess.run kills it).
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=180, check=False,
                          pass_fds=tuple(pass_fds), start_new_session=True)
