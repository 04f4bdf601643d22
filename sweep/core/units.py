"""Binary units of memory, in bytes: KiB, MiB, GiB, TiB (powers of 1024, as PyTorch, CUDA and
Slurm's `M` count them).

One place for them, so every module that turns GiB or MiB into bytes uses the same constant
instead of defining its own.
"""

from __future__ import annotations

from typing import Final

KiB: Final = 1 << 10
MiB: Final = 1 << 20
GiB: Final = 1 << 30
TiB: Final = 1 << 40
