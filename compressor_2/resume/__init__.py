"""Resuming a run exactly: its state file (`StateFormat`), history, identity compared on a rerun, and lock."""

from compressor_2.resume.fields import FieldError
from compressor_2.resume.history import (
    HISTORY_FILE, Score, StepEntry, Work, append_log, load_history, log_lines, save_history, step_entry, truncate_log,
    work_entry,
)
from compressor_2.resume.identity import (
    CONCURRENCY, IDENTITY_KEY, IN_SEARCH, STEPS, Option, RunInputs, check_identity, check_settings, compared,
    model_identity, recorded_context,
)
from compressor_2.resume.lock import RUN_LOCK_FILE, check_lock_file, check_not_in_use, run_lock
from compressor_2.resume.state import (
    GLOBAL_RNGS, Member, RunFiles, Saved, StateFormat, candidate_ids, capture_rngs, check_state, held_list, read_member,
    read_state, restore_rngs, save_state, seed_rng, state_json,
)

__all__ = ["CONCURRENCY", "GLOBAL_RNGS", "HISTORY_FILE", "IDENTITY_KEY", "IN_SEARCH", "RUN_LOCK_FILE", "STEPS",
           "FieldError", "Member", "Option", "RunFiles", "RunInputs", "Saved", "Score", "StateFormat", "StepEntry", "Work", "append_log",
           "candidate_ids", "capture_rngs", "check_identity", "check_lock_file", "check_not_in_use", "check_settings",
           "check_state", "compared", "held_list", "load_history", "log_lines", "model_identity", "read_member", "read_state",
           "recorded_context", "restore_rngs", "run_lock", "save_history", "save_state", "seed_rng", "state_json",
           "step_entry", "truncate_log", "work_entry"]
