"""Attempt folders (+ Slurm accounting) -> runs.parquet: its schema, its rows and what each attempt
measured.
"""
