"""`sweep import-playbook CSV --out runs.parquet`: the playbook's published runs in our schema."""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

from sweep.collect.attempts import write_runs
from sweep.collect.schema import to_table
from sweep.core.errors import UserError
from sweep.validation.playbook_import import PlaybookFormatError, import_playbook


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("csv", type=Path, help="playbook_runs_*.csv or playbook_bench_full_*.csv")
    parser.add_argument("--out", type=Path, required=True, help="runs.parquet to write")


def run(args: argparse.Namespace) -> int:
    if not args.csv.is_file():
        raise UserError(f"{args.csv}: no such file; pass a playbook CSV such as "
                        "$SWEEP_REFDATA/playbook_runs_1B_8B.csv")
    try:
        rows = import_playbook(args.csv)
    except PlaybookFormatError as error:
        raise UserError(str(error)) from None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_runs(to_table(rows), args.out)
    counts = collections.Counter(row["outcome"] for row in rows)
    print(f"{len(rows)} run(s) ({', '.join(f'{n} {k}' for k, n in counts.most_common())}) → {args.out}")
    return 0
