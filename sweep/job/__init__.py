"""What runs inside a job on the compute node: the watchdog and what it needs.

No numpy or pandas here: the watchdog lives in the job's small memory cgroup.
"""
