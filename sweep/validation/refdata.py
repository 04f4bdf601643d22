"""Where the third-party reference data is: one setting, `SWEEP_REFDATA`.

The published tables and logs that tests, benchmarks and examples use as oracles are other
people's numbers: llm-sweep does not redistribute them. `scripts/get-refdata.sh` puts them in
`data/refdata/` of the checkout (git-ignored), checked against the sha256 of each file listed in
`data/README.md`; `SWEEP_REFDATA` points anywhere else.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

ENV_VAR: Final = "SWEEP_REFDATA"
FETCH_HINT: Final = "run `bash scripts/get-refdata.sh --from DIR` (see data/README.md) or set SWEEP_REFDATA"


def checkout_root() -> Path:
    return Path(__file__).resolve().parents[2]  # the checkout, above sweep/validation/


def refdata_dir() -> Path:
    """`$SWEEP_REFDATA`, else `data/refdata/` in the checkout."""
    configured = os.environ.get(ENV_VAR)
    return Path(configured).expanduser() if configured else checkout_root() / "data" / "refdata"


def refdata_file(name: str) -> Path:
    """A reference file by its name in data/README.md; a clear error when it is missing."""
    path = refdata_dir() / name
    if not path.is_file():
        raise FileNotFoundError(f"reference data {name} not found in {refdata_dir()}: {FETCH_HINT}")
    return path
