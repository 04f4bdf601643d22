"""The vocabulary every layer shares: the spec's building blocks (model shapes, the catalog, the
layout's axes), units, errors, the files of a sweep folder and Slurm's state names.

Imports nothing else of llm-sweep.
"""
