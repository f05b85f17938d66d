"""The DEAP genetic algorithm over delta vectors (seed 000)."""
