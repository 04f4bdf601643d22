"""The embedded backend: the very job.sbatch a cluster would run, run on this machine, with
stand-ins for `srun` and `scontrol`.
"""
