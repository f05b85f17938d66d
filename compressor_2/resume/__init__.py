"""Resuming a run exactly: the state file, the history, the run identity compared on a rerun, and the lock."""
