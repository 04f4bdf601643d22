"""The error types a user sees: raised by domain code, printed by the `sweep` command.

They live here, not in `sweep/cli.py`, because domain code (rendering, tracking, the driver)
must not import the command-line layer; the CLI imports these, never the other way round.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


class UserError(Exception):
    """An error caused by input; printed without a traceback, exit code 2."""


class SpecError(ValueError):
    """A spec problem, located: file, line (0 if unknown), field, and the fix."""

    def __init__(self, path: str, line: int, field: str, message: str) -> None:
        self.path, self.line, self.field, self.message = path, line, field, message
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {field}: {message}")


def exit_code_of(command: str, step: Callable[[], int | None]) -> int:
    """Run one `sweep COMMAND`'s work and return its exit code: the step's own (None is 0), 2
    for an error in the user's input (`UserError`, `SpecError`), said in one line on
    stderr without a traceback, 130 when interrupted. Any other error propagates. The command
    line and the detached driver (which runs collect and report without the command line) both
    end a command here, so they exit alike."""
    try:
        return int(step() or 0)
    except (UserError, SpecError) as error:
        print(f"sweep {command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"sweep {command}: interrupted", file=sys.stderr)
        return 130
