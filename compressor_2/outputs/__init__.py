"""What a run shows, drawn from its archive and history: `Refresh`, the tree, the plots, report.html."""

from compressor_2.outputs.plots import FITNESS_PLOT, FRONT_PLOT, LENGTHS_PLOT
from compressor_2.outputs.refresh import Refresh, refresh_outputs
from compressor_2.outputs.report import REPORT_FILE, status, write_report
from compressor_2.outputs.tree import TREE_FILE, TREE_PLOT

__all__ = ["FITNESS_PLOT", "FRONT_PLOT", "LENGTHS_PLOT", "REPORT_FILE", "TREE_FILE", "TREE_PLOT", "Refresh",
           "refresh_outputs", "status", "write_report"]
