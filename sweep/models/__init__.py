"""The memory and throughput models: pure functions, a configuration in, numbers out.
"""
