"""What a run shows, drawn from its archive and history: the tree, the plots, front.png and report.html."""
