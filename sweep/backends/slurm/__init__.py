"""Slurm: submission as job arrays, the tracker and its observations, the preflight, bad nodes.
"""
