"""The run archive: every candidate a run made, its lineage and its per-example results,
in one SQLite file in the run directory (`run.sqlite`)."""
