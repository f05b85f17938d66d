"""The run archive, run.sqlite: `RunArchive`, its typed rows, the checks' `CheckStore` and `genome_key`."""

from compressor_2.archive.database import BEST_FLOOR, CORRECTNESS_EPSILON, CheckStore, RunArchive
from compressor_2.archive.lineage import Lineage
from compressor_2.archive.rows import (
    SEED_STEP, Answer, CallRecord, Candidate, CheckResult, Placement, ReplyTally, Spot, genome_key,
)
from compressor_2.archive.schema import ARCHIVE_FILE

__all__ = ["ARCHIVE_FILE", "BEST_FLOOR", "CORRECTNESS_EPSILON", "SEED_STEP", "Answer", "CallRecord", "Candidate",
           "CheckResult", "CheckStore", "Lineage", "Placement", "ReplyTally", "RunArchive", "Spot", "genome_key"]
