"""Stand-ins for `srun` and `scontrol` that the local backend puts first on PATH.

They emulate just what job.sbatch uses, the way Slurm behaves, so that the local backend runs
the very script a cluster would run. Each is a module with `main(argv) -> int`.
"""
