"""Planning: the spec, the configuration space and its rules, the rendered run folders, the plan
file and its summary, and the resources and GPU-hours a plan asks for.
"""
