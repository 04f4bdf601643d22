"""What `sweep submit` and `sweep resume` are doing, recorded in the sweep folder, and what they
do with the signals a login shell sends: nothing of a sweep depends on the terminal.

From the moment the command starts, its phase (planning, preflight, submitting, starting the
driver, searching) is known, and from the moment it knows the sweep folder it is recorded in
`submit.json`, with the command that finishes the sweep if this one never does (`sweep resume
DIR`). Then:

- SIGHUP (a dropped SSH session) during the preflight, the submission or the driver's start is
  noted and ignored: the command goes on and finishes, its output now also in `submit.log` (a
  terminal that went away cannot show it). Its Slurm commands run in sessions of their own
  (sweep.backends.slurm.client, sweep.backends.slurm.preflight), so the hang-up does not reach
  them either: they are waited for, never orphaned.
- SIGTERM and Ctrl-C (SIGINT) stop it: `Stopped` is raised where it is, so a child it waits on
  is ended (and the preflight job cancelled), the stop is recorded, and the command says why it
  stopped, what it left and which command finishes it.
- A foreground search (`sweep submit --foreground`) has nothing to go on with once its terminal
  is gone: there, SIGHUP stops it like SIGTERM.

`sweep status` reads `submit.json`: a sweep whose submit never reached its end is shown as
half-submitted, with the command that finishes it.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import IO, Any, Final

from sweep.core.errors import UserError
from sweep.core.state import atomic_write_json, read_json

SUBMIT_FILE: Final = "submit.json"
SUBMIT_LOG: Final = "submit.log"
_SIGNALS: Final = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)


class Stopped(BaseException):  # noqa: N818 - a stop, like KeyboardInterrupt, not an error
    """A signal stopped the command (SIGTERM, Ctrl-C, or SIGHUP in the foreground search)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(self.name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _Tee:
    """A stream that writes to the terminal while it is there, and to the log once it is set."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream: IO[str] | None = stream
        self.log: IO[str] | None = None
        self.pending: list[str] = []  # written before the sweep folder (and its log) was known

    def write(self, text: str) -> int:
        if self.stream is not None:
            try:
                self.stream.write(text)
                self.stream.flush()
            except (OSError, ValueError):
                self.stream = None  # the terminal went away
        if self.log is not None:
            self.log.write(text)
            self.log.flush()
        else:
            self.pending.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def attach(self, log: IO[str]) -> None:
        self.log = log
        for text in self.pending:
            log.write(text)
        self.pending.clear()
        log.flush()


class SubmitSession:
    """One `sweep submit` or `sweep resume`: its phase, its record in submit.json and its
    signal handlers (`with SubmitSession("submit") as session: ...`)."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.folder: Path | None = None
        self.phase = "planning"
        self.hangup_stops = False  # the foreground search: SIGHUP stops it
        self.hung_up = False
        self.fields: dict[str, Any] = {}
        self._previous: dict[int, Any] = {}
        self._tees: list[_Tee] = []
        self._log: IO[str] | None = None

    def __enter__(self) -> SubmitSession:
        if threading.current_thread() is not threading.main_thread():
            return self  # only the main thread may set handlers: signals keep their defaults
        for signum in _SIGNALS:
            self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        if self._tees:
            sys.stdout, sys.stderr = (tee.stream or open(os.devnull, "w")  # noqa: SIM115
                                      for tee in self._tees)
        if self._log is not None:
            self._log.close()

    # -- the record ---------------------------------------------------------------------------

    def attach(self, folder: Path, **fields: Any) -> None:
        """The sweep folder is known: record the command there (a fresh record: an earlier
        submit's is replaced)."""
        self.folder = folder
        self.fields = {"command": self.command, "argv": sys.argv[1:], "pid": os.getpid(),
                       "host": socket.gethostname(), "started_at": time.time(),
                       "finish": f"sweep resume {folder}", **fields}
        if self.hung_up:
            self._open_log()
        self._write()

    def enter(self, phase: str, **fields: Any) -> None:
        self.phase = phase
        self.fields.update(fields)
        self._write()

    def done(self, **fields: Any) -> None:
        self.enter("done", ended_at=time.time(), **fields)

    def stopped(self, stop: Stopped, **fields: Any) -> None:
        self.fields.update(stopped_by=stop.name, stopped_at=time.time(), **fields)
        self._write()

    def failed(self, error: BaseException) -> None:
        """The command ended on an error (a failed preflight, a refused sbatch): recorded, so
        that status says why the sweep is half-submitted."""
        self.fields.update(error=str(error).splitlines()[0][:300], stopped_at=time.time())
        self._write()

    def _write(self) -> None:
        if self.folder is not None and self.folder.is_dir():
            atomic_write_json(self.folder / SUBMIT_FILE, {**self.fields, "phase": self.phase})

    # -- the signals --------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum != signal.SIGHUP or self.hangup_stops:
            if signum == signal.SIGHUP:
                self._divert_output()
            raise Stopped(signum)
        first = not self.hung_up
        self._divert_output()
        self.fields.setdefault("hangup", {"phase": self.phase, "at": time.time()})
        self._write()
        if first:
            where = f"; its output goes on in {self.folder / SUBMIT_LOG}" if self.folder else ""
            print(f"sweep {self.command}: SIGHUP (the terminal went away) during {self.phase}: "
                  f"ignored, going on{where}", file=sys.stderr, flush=True)

    def ignore_signals(self) -> None:
        """From here on (the clean-up after a stop) every signal of _SIGNALS is ignored."""
        for signum in _SIGNALS:
            signal.signal(signum, signal.SIG_IGN)

    def _divert_output(self) -> None:
        self.hung_up = True
        if not self._tees:
            self._tees = [_Tee(sys.stdout), _Tee(sys.stderr)]
            sys.stdout, sys.stderr = self._tees
        if self.folder is not None:
            self._open_log()

    def _open_log(self) -> None:
        if self._log is None and self.folder is not None and self.folder.is_dir():
            self._log = open(self.folder / SUBMIT_LOG, "a", encoding="utf-8")  # noqa: SIM115
            for tee in self._tees:
                tee.attach(self._log)


def run_in_session(command: str, step: Callable[[SubmitSession], int],
                   folder: Path | None = None) -> int:
    """Run `sweep COMMAND`'s work (submit or resume) in a SubmitSession: a user error is recorded
    before it propagates; a stop signal is recorded and said in one line, with the command that
    finishes the sweep (in `folder` until the session knows its own), and sets the exit code."""
    with SubmitSession(command) as session:
        try:
            return step(session)
        except UserError as error:
            session.failed(error)
            raise
        except Stopped as stop:
            session.ignore_signals()
            session.stopped(stop)
            where = session.folder or folder
            finish = (f"; `sweep resume {where}` finishes the sweep" if where is not None
                      else "; nothing was submitted")
            print(f"sweep {command}: stopped by {stop.name} during {session.phase}{finish}",
                  file=sys.stderr, flush=True)
            return stop.exit_code


def read_submit(folder: Path) -> dict[str, Any]:
    record = read_json(folder / SUBMIT_FILE)
    return record if isinstance(record, dict) else {}


def _alive(record: dict[str, Any]) -> bool:
    """Whether the recorded command still runs (on this host; another host's is assumed to)."""
    pid = record.get("pid")
    if record.get("host") != socket.gethostname():
        return True
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def describe_submit(folder: Path) -> str | None:
    """`sweep status`'s line on a submit or resume that did not reach its end: still at work,
    or stopped (by which signal, in which phase), with the command that finishes the sweep.
    None: it finished, or there is no record."""
    record = read_submit(folder)
    phase = record.get("phase")
    if not record or phase == "done":
        return None
    command = f"sweep {record.get('command', 'submit')}"
    finish = record.get("finish") or f"sweep resume {folder}"
    if record.get("stopped_by"):
        what = ("the foreground search stopped" if phase == "searching"
                else f"{command} stopped during {phase}")
        left = f"; {record['left']}" if record.get("left") else ""
        return (f"half-submitted: {what} by {record['stopped_by']}{left}; "
                f"`{finish}` finishes it")
    if record.get("error"):
        return (f"half-submitted: {command} failed during {phase} ({record['error']}); once "
                f"that is fixed, `{finish}` finishes it")
    if _alive(record):
        return f"{command} (pid {record.get('pid')}) is at work: {phase}"
    return (f"half-submitted: {command} ended during {phase} without finishing (killed?); "
            f"`{finish}` finishes it")
