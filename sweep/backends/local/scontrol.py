"""`scontrol show hostnames [LIST]`, the one scontrol call job.sbatch makes."""

from __future__ import annotations

import os
import sys

from sweep.core.hostlist import expand


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:2] != ["show", "hostnames"] or len(args) > 3:
        print(f"scontrol (llm-sweep local backend): only `show hostnames [LIST]` is emulated, "
              f"not {' '.join(args)!r}", file=sys.stderr)
        return 1
    hostlist = args[2] if len(args) == 3 else os.environ.get("SLURM_JOB_NODELIST", "")
    try:
        hosts = expand(hostlist)
    except ValueError as error:
        print(f"scontrol: error: {error}", file=sys.stderr)
        return 1
    if not hosts:
        print("scontrol: error: no host list given and SLURM_JOB_NODELIST is empty",
              file=sys.stderr)
        return 1
    print("\n".join(hosts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
