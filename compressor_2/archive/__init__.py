"""The run archive, run.sqlite: `RunArchive`, its typed rows, the checks' `CheckStore` and `genome_key`."""

from compressor_2.archive.candidates import Rank, rank
from compressor_2.archive.database import BEST_FLOOR, CheckStore, RunArchive
from compressor_2.archive.lineage import Lineage
from compressor_2.archive.rows import (
    SEED_STEP, Answer, CallRecord, Candidate, CheckResult, Placement, ReplyTally, Spot, genome_key,
)
from compressor_2.archive.schema import ARCHIVE_FILE

__all__ = ["ARCHIVE_FILE", "BEST_FLOOR", "SEED_STEP", "Answer", "CallRecord", "Candidate", "CheckResult", "CheckStore",
           "Lineage", "Placement", "Rank", "ReplyTally", "RunArchive", "Spot", "genome_key", "rank"]
