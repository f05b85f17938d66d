"""The services every strategy is handed: the run (`services.Run`), its budget, best-ever
tracker, lock, state and history files, evolution tree, plots and progress lines."""
