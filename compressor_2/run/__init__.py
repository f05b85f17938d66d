"""The loop and its services: `drive` runs a `Strategy` over `Run` (evaluate, admit, assess), budget, best-ever."""

from compressor_2.run.best import DELTAS_BEST, PROCESSOR_BEST, BestEver
from compressor_2.run.budget import Budget, Cost, Limits, shortfall
from compressor_2.run.driver import Report, Strategy, drive
from compressor_2.run.services import NewCandidate, Run
from compressor_2.run.workers import Workers

__all__ = ["DELTAS_BEST", "PROCESSOR_BEST", "BestEver", "Budget", "Cost", "Limits", "NewCandidate", "Report", "Run",
           "Strategy", "Workers", "drive", "shortfall"]
