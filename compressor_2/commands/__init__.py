"""The commands `cli` dispatches to: evolve, evaluate, show, export, report, and the run directory's guards."""
