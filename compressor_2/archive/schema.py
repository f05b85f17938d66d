"""`run.sqlite`'s file: its tables, its connection, its transactions and its meta table.

Tables:
- `candidates`: every genome a strategy evaluated or proposed and rejected: its deltas
  and scratchpad, the operator that made it, the strategy, the generation (or
  iteration), its status and, once assessed on the whole training pool, its fitness;
- `lineage`: one row per (child, parent);
- `placements`: where a candidate stood in a strategy's structure (the GA's
  `g{g}_pop{i}` / `_pre` / `_mut` node ids), for the evolution tree;
- `evaluations`: one answer per (genome, example, context), the evaluation cache;
- `reflector_calls`: kind, candidate, tokens, latency and outcome (`verdict`) of every attempt;
- `selections`, `selection_rounds`: the GA's LLM selections per generation (candidate,
  category, reasoning) and the round's summary, or why it fell back;
- `merges`: GEPA's merges: the two descendants, their common ancestor, which of them
  each component came from, and whether the merge was kept;
- `feedback`: the archive strategy's memory, one entry per assessed or rejected proposal: parent,
  generator, change summary, observed outcome;
- `check_answers`: the answers of the run's checks, kept apart from the search's so they
  never count against its budget: the held-out set, and the unsteered baseline on the pool
  when the search never answered with it;
- `check_results`: per split ("training", "heldout") and genome, the mean tokens,
  correctness and fitness the checks measured;
- `events`: starts, resumes, interruptions and stop reasons;
- `meta`: schema version, strategy, cumulative wall time and cache hits (the search's and
  the checks').

WAL mode with one transaction per batch of results: a SIGKILL loses at most the batch
being written, never the file's integrity. `synchronous=NORMAL` skips the fsync on each
commit, which a process crash does not need (only a power cut could lose the last
transactions, and the file would still be sound). One writer at a time: `evolve` holds
the run directory's lock; `show` opens the file read-only.
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from compressor_2.common import ConfigError, RunError, shown

ARCHIVE_FILE = "run.sqlite"
SCHEMA_VERSION = 1
# The counters kept in meta, each refused on reading when it is not a number >= 0 (an integer
# where it counts things): `store` once reset a hand-edited cache_hits='NaN' to 0 without a word.
COUNTERS = {"wall_seconds": False, "cache_hits": True, "check_cache_hits": True, "fresh_answers": True,
            "check_fresh_answers": True, "training_checked": True, "heldout_checked": True}

# The search's answers (evaluations) and the checks' (check_answers) have one shape.
_ANSWERS = """(
    genome TEXT NOT NULL,
    example TEXT NOT NULL,
    context TEXT NOT NULL,
    answer TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    is_correct INTEGER NOT NULL,
    reasoning TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (genome, example, context)
) WITHOUT ROWID"""
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS candidates (
    id INTEGER PRIMARY KEY,
    deltas TEXT NOT NULL,
    genome TEXT NOT NULL,
    scratchpad TEXT NOT NULL,
    operator TEXT NOT NULL,
    strategy TEXT NOT NULL,
    generation INTEGER NOT NULL,
    status TEXT NOT NULL,
    note TEXT NOT NULL DEFAULT '',
    fitness REAL,
    mean_tokens REAL,
    correctness REAL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS lineage (
    child INTEGER NOT NULL REFERENCES candidates(id),
    parent INTEGER NOT NULL REFERENCES candidates(id),
    position INTEGER NOT NULL,
    PRIMARY KEY (child, position)
);
CREATE INDEX IF NOT EXISTS lineage_parent ON lineage(parent);
CREATE TABLE IF NOT EXISTS placements (
    label TEXT PRIMARY KEY,
    candidate INTEGER NOT NULL REFERENCES candidates(id),
    generation INTEGER NOT NULL,
    stage TEXT NOT NULL,
    idx INTEGER NOT NULL,
    step INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS evaluations {_ANSWERS};
CREATE TABLE IF NOT EXISTS check_answers {_ANSWERS};
CREATE TABLE IF NOT EXISTS check_results (
    split TEXT NOT NULL,
    genome TEXT NOT NULL,
    examples INTEGER NOT NULL,
    mean_tokens REAL NOT NULL,
    correctness REAL NOT NULL,
    fitness REAL NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (split, genome)
);
CREATE TABLE IF NOT EXISTS reflector_calls (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    candidate INTEGER,
    parents TEXT NOT NULL,
    generation INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    latency REAL NOT NULL,
    verdict TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS selections (
    generation INTEGER NOT NULL,
    position INTEGER NOT NULL,
    candidate INTEGER NOT NULL,
    category TEXT NOT NULL,
    reasoning TEXT NOT NULL,
    PRIMARY KEY (generation, position)
);
CREATE TABLE IF NOT EXISTS selection_rounds (
    generation INTEGER PRIMARY KEY,
    summary TEXT NOT NULL,
    fallback TEXT
);
CREATE TABLE IF NOT EXISTS feedback (
    candidate INTEGER PRIMARY KEY,
    parent INTEGER NOT NULL,
    iteration INTEGER NOT NULL,
    generator TEXT NOT NULL,
    change TEXT NOT NULL,
    outcome TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS merges (
    candidate INTEGER PRIMARY KEY,
    first INTEGER NOT NULL,
    second INTEGER NOT NULL,
    ancestor INTEGER NOT NULL,
    sources TEXT NOT NULL,
    accepted INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL,
    created REAL NOT NULL
);
"""


class Database:
    """The open file. Methods may be called from several threads (reflector calls record
    themselves from the pool); one lock serialises them. `seconds` is the time spent
    inside it, for the overhead benchmark."""

    def __init__(self, connection: sqlite3.Connection, path: Path) -> None:
        self._db = connection
        self.path = path
        self._lock = threading.RLock()
        self.seconds = 0.0

    @classmethod
    def open(cls, path: Path) -> Database:
        """Opens (creating if needed) the file for writing."""
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA foreign_keys=ON")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA_VERSION):
                raise ConfigError(f"'{path}' has archive schema {version}, this version reads "
                                  f"{SCHEMA_VERSION}; move the run directory away to start afresh")
            db.executescript(SCHEMA)
            if version != SCHEMA_VERSION:  # a new file: an open of an existing one writes nothing to it
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except sqlite3.OperationalError as exc:  # a full disk, a read-only file: the file is sound
            raise RunError(f"'{path}' cannot be written: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"'{path}' is not a usable run database ({exc}); move it away "
                              "(or choose another CONFIG_OUTPUT_DIR) to start a fresh run") from None
        database = cls(db, path)
        try:
            for key in COUNTERS:
                database.meta_count(key)
        except ConfigError:
            database.close()
            raise
        return database

    @classmethod
    def open_read_only(cls, path: Path) -> Database:
        if not path.is_file():
            raise ConfigError(f"no run database at '{path}': has `evolve` run with this config?")
        try:
            db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
            db.execute("SELECT count(*) FROM candidates").fetchone()
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"'{path}' is not a readable run database ({exc})") from None
        return cls(db, path)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            started = time.perf_counter()
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                else:
                    self._db.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                # A full disk, a read-only file: said with the file's name, not as SQLite's bare text.
                raise RunError(f"'{self.path}' cannot be written: {exc}") from None
            finally:
                self.seconds += time.perf_counter() - started

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            started = time.perf_counter()
            try:
                return self._db.execute(sql, params).fetchall()
            finally:
                self.seconds += time.perf_counter() - started

    def has_table(self, table: str) -> bool:
        """Whether the file has `table` (an archive written before the checks opened read
        only has none of theirs)."""
        return bool(self.query("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?",
                               (table,))[0][0])

    def integrity(self) -> str:
        return str(self.query("PRAGMA integrity_check")[0][0])

    def bad_row(self, table: str, row: object, problem: str) -> ConfigError:
        """A hand-edited row the run cannot use, named by its table and row."""
        return ConfigError(f"'{self.path}' table {table}, row {row}: {problem}; restore it, or move the run "
                           "directory away to start afresh")

    # -- meta -------------------------------------------------------------------------------

    def meta(self, key: str, default: str | None = None) -> str | None:
        rows = self.query("SELECT value FROM meta WHERE key = ?", (key,))
        return rows[0][0] if rows else default

    def meta_count(self, key: str) -> float:
        """A counter kept in meta (0 when absent): a finite number >= 0 (an integer for the
        counters of things), else refused, naming the row."""
        text = self.meta(key, "0")
        try:
            value = float(text) if isinstance(text, str) else math.nan
        except ValueError:
            value = math.nan
        integer = COUNTERS.get(key, False)
        if not 0 <= value < float("inf") or (integer and not value.is_integer()):
            raise ConfigError(f"'{self.path}' table meta, row {key}: {shown(text)} is not "
                              f"{'an integer' if integer else 'a number'} >= 0; delete that row to count from 0 again")
        return value

    def set_meta(self, values: Mapping[str, object]) -> None:
        with self.transaction() as db:
            db.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                           [(k, str(v)) for k, v in values.items()])

    def delete_meta(self, key: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM meta WHERE key = ?", (key,))
