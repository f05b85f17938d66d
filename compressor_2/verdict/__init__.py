"""What a run gained, outside any loop: the front, the baseline and held-out checks, the simpler tools, and the claims with their confidence."""
