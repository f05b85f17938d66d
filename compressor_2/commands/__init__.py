"""The commands `cli` runs, each a module loaded when run: evolve, evaluate, show, export, report; files."""
