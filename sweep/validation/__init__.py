"""Research on the models, never imported by the product: reference fits on published data,
cross-validation, unseen models, BLOOM, replays of published sweeps, the playbook import.
"""
