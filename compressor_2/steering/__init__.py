"""Deltas and the logit bias they become: the one place the steering arithmetic lives."""
