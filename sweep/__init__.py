"""llm-sweep: a benchmark sweep harness for distributed LLM training on Slurm."""

__version__ = "0.1.0"
