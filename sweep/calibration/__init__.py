"""What the product fits from a user's own runs, each module named by the model it serves: the
throughput fit and its coefficient files, the memory model's self-calibration, and the
calibration a plan gets before it is written.
"""
