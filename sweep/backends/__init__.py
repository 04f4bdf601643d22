"""Where a sweep's runs execute: one interface (`sweep.backends.base.base`), the embedded backend
(`local/`) and Slurm (`slurm/`).
"""
