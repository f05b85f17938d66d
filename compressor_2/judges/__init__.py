"""Correctness judges: per example is_correct and reasoning; chosen by name from the config."""
