"""What builtin cannot run as labelled: the capability table (see sweep.frameworks.base).

Pure: no I/O.
"""

from __future__ import annotations

from typing import Final

from sweep.frameworks.base import CapabilityRule

RULES: Final[tuple[CapabilityRule, ...]] = ()
