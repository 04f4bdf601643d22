"""Searches over a sweep: strategies, what an OOM rules out, the live search and its rounds, and the
detached driver that runs a search on the cluster.
"""
