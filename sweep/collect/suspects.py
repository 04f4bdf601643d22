"""The straggler nodes of a collected sweep, recorded as `suspects` in its bad_nodes.json.

Collect names a run's straggler node in runs.parquet (sweep.collect.stragglers); this module
counts them over the whole table after every collect, so the list is the table's, whatever was
reused or recomputed, and writes it beside the failures that `sweep status` records. `sweep nodes`
lists them; no submission excludes them (only the failures exclude, and `--exclude` by hand).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sweep.backends.slurm.bad_nodes import BadNodes
from sweep.collect.stragglers import sightings, suspects


def record_suspects(sweep_dir: Path, table: pa.Table) -> dict[str, dict[str, Any]]:
    """Count the table's straggler runs per node into SWEEP_DIR/bad_nodes.json; return them."""
    names = ("run_id", "attempt", "straggler_node", "straggler_ratio", "straggler_factor")
    if "straggler_node" not in table.column_names:
        return {}
    rows = table.select(list(names)).filter(pc.is_valid(table["straggler_node"]))
    found = suspects(sightings(rows.to_pylist()))
    BadNodes(sweep_dir).set_suspects(found)
    return found
