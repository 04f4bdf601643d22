"""The error types a user sees: raised by domain code, printed by the `sweep` command.

They live here, not in `sweep/cli.py`, because domain code (rendering, tracking, the driver)
must not import the command-line layer; the CLI imports these, never the other way round.
"""

from __future__ import annotations


class UserError(Exception):
    """An error caused by input; printed without a traceback, exit code 2."""
