"""Files on the shared filesystem: atomic JSON writes, the append-only ledger, attempt folders.

There is no database: login and compute nodes share only a filesystem, and SQLite on NFS/Lustre
corrupts. Every file is written atomically (temp file in the same directory, fsync, rename), so a
reader sees the old content or the new one, never half of it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

RUN_FILE = "run.json"
STATUS_FILE = "status.json"
METRICS_FILE = "metrics.jsonl"
ENV_FILE = "env.json"  # provenance, written by job.sbatch: slurm_job_id, slurm_array
LEDGER_FILE = "ledger.jsonl"
SEARCH_PROGRESS_FILE = "search_progress.csv"  # a search's decisions per cell, rewritten each round
BUDGET_LEFT_OUT_FILE = "budget_left_out.txt"  # run ids a GPU-hour cap kept from being launched
ATTEMPTS_DIR = "attempts"
SLURM_STDERR_LINK = "job.err"  # in an attempt folder: the batch script's stderr (job.sbatch links it)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates files 0600; a sweep folder is shared (login node, compute nodes, colleagues),
# so files written through a temporary name get the mode an ordinary open would give them.
FILE_MODE = 0o666 & ~_umask()


def make_temp(path: Path) -> tuple[int, str]:
    """A temporary file beside `path` (for an atomic rename onto it), with the usual file mode."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, FILE_MODE)
    return fd, tmp


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = make_temp(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_with(path: str | Path, write: Callable[[str], None]) -> None:
    """Write `path` whole or not at all: `write` fills a temporary file beside it (a parquet
    writer, say), which then replaces it; a reader sees the old file or the new one."""
    path = Path(path)
    fd, tmp = make_temp(path)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: str | Path) -> Any | None:
    """The parsed file, or None when it does not exist."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append one record as one line; a single write(2) of a short line, then fsync."""
    line = json.dumps(record, sort_keys=True, default=str) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def json_record(line: str) -> dict[str, Any] | None:
    """The record a line of one of our JSON-lines files holds, or None when it holds none.

    One rule for every reader (the ledger, metrics.jsonl in collect and in the watchdog, the
    built-in workload's parser): a record is a whole JSON object on one line. A torn line (its
    writer killed mid-write), a corrupt one, a bare value and nesting too deep to decode are not
    records; what to say about them is the caller's business."""
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def read_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """Records of a JSON-lines file; a torn last line (a writer killed mid-write) is skipped."""
    try:
        handle = open(path, encoding="utf-8")
    except FileNotFoundError:
        return
    with handle:
        for line in handle:
            if line.strip() and (record := json_record(line)) is not None:
                yield record


def attempt_dirs(run_dir: str | Path) -> list[Path]:
    """A run's attempt folders, oldest first (attempts/1, attempts/2, ...)."""
    root = Path(run_dir) / ATTEMPTS_DIR
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and p.name.isdigit()),
                  key=lambda p: int(p.name))


def new_attempt_dir(run_dir: str | Path) -> Path:
    """Create the next attempt folder; safe against a concurrent creator (mkdir is atomic)."""
    root = Path(run_dir) / ATTEMPTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    number = len(attempt_dirs(run_dir)) + 1
    while True:
        candidate = root / str(number)
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            number += 1


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class LockHeld(RuntimeError):
    """Another process holds the lock."""


@contextlib.contextmanager
def exclusive_lock(path: str | Path, wait_s: float = 0.0,
                   on_wait: Callable[[], None] | None = None) -> Iterator[IO[str]]:
    """Hold an exclusive flock on `path` (created if missing) for the block; yields the open
    file, whose descriptor child processes may inherit to keep holding the lock. Waits up to
    `wait_s` (calling `on_wait` once when it starts waiting), then raises LockHeld. The
    kernel drops the lock when its holder dies, so a killed process never leaves a stale lock."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        deadline = time.monotonic() + wait_s
        waiting = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockHeld(str(path)) from None
                if not waiting and on_wait is not None:
                    on_wait()
                waiting = True
                time.sleep(0.2)
        yield handle


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB blocks: the provenance of fitted values."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
