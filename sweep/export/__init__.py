"""Export a sweep's attempts to experiment trackers (MLflow, Weights & Biases): `sweep export`,
and the end of a sweep whose spec has an `export:` section (docs/trackers.md)."""
