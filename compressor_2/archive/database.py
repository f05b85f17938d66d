"""`run.sqlite`: the run's database, through the standard library's sqlite3.

Tables:
- `candidates`: every genome a strategy evaluated or proposed and rejected: its deltas
  and scratchpad, the operator that made it, the strategy, the generation (or
  iteration), its status and, once assessed on the whole training pool, its fitness;
- `lineage`: one row per (child, parent);
- `placements`: where a candidate stood in a strategy's structure (the GA's
  `g{g}_pop{i}` / `_pre` / `_mut` node ids of seed 000 §8), for the evolution tree;
- `evaluations`: one answer per (genome, example, context), the evaluation cache;
- `reflector_calls`: kind, candidate, tokens, latency and verdict of every attempt;
- `selections`, `selection_rounds`: seed 002's selections per generation (candidate,
  category, reasoning) and the round's summary, or why it fell back;
- `merges`: seed 004's merges: the two descendants, their common ancestor, which of them
  each component came from, and whether the merge was kept;
- `feedback`: seed 003's memory, one entry per assessed or rejected proposal: parent,
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

import json
import math
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from compressor_2.api_key import scrub
from compressor_2.archive.lineage import Lineage
from compressor_2.chat_reply import MAX_TOKENS
from compressor_2.errors import ConfigError, RunError
from compressor_2.json_values import as_count, as_float, shown

ARCHIVE_FILE = "run.sqlite"
SCHEMA_VERSION = 1
MAX_ID = 2**63 - 1  # SQLite's largest integer
# The counters kept in meta, each refused on reading when it is not a number >= 0 (an integer
# where it counts things): `store` once reset a hand-edited cache_hits='NaN' to 0 without a word.
SEED_GENERATION = -1  # the strategies' seed candidates stand before their first step
COUNTERS = {"wall_seconds": False, "cache_hits": True, "check_cache_hits": True}

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


@dataclass(frozen=True)
class Candidate:
    """One genome in the archive. `id` is None until `RunArchive.add` gives it one."""

    deltas: Mapping[str, float]  # canonical cluster order
    scratchpad: str
    operator: str  # initial, crossover, clone, mutation, ...
    parents: tuple[int, ...]
    strategy: str
    generation: int
    status: str = "evaluated"  # or "rejected": proposed, assessed, not kept
    note: str = ""  # why it was rejected
    fitness: float | None = None  # on the whole training pool
    mean_tokens: float | None = None
    correctness: float | None = None
    id: int | None = None
    created: float = 0.0


@dataclass(frozen=True)
class Answer:
    """One stored answer: what the engine said and what the judge made of it."""

    answer: str
    tokens: int
    is_correct: bool
    reasoning: str


@dataclass(frozen=True)
class CheckResult:
    """A genome measured by a check on one split ("training" or "heldout")."""

    split: str
    genome: str
    examples: int
    mean_tokens: float
    correctness: float
    fitness: float


@dataclass(frozen=True)
class CallRecord:
    kind: str  # mutation, merge, ...
    candidate: int | None  # the candidate the call is about, when it exists yet
    parents: tuple[int, ...]
    generation: int
    attempt: int
    prompt_tokens: int
    completion_tokens: int
    latency: float
    verdict: str


@dataclass(frozen=True)
class Spot:
    """Where a candidate stands in a strategy's structure: the GA's population member
    (`pop`), offspring (`pre`) and mutated offspring (`mut`) of a generation (seed 000
    §8), or a kept candidate of the other strategies (`cand`), in the column of the step
    that made it."""

    generation: int
    stage: str
    index: int


@dataclass(frozen=True)
class Placement:
    """A candidate at a spot; its label is the evolution tree's node id."""

    candidate: int
    spot: Spot

    @property
    def label(self) -> str:
        g, stage, i = self.spot.generation, self.spot.stage, self.spot.index
        if stage == "pop":
            return f"g{g}_pop{i}"
        if stage in ("pre", "mut"):
            return f"g{g}_child{i}_{stage}"
        return f"c{self.candidate}"


def genome_key(deltas: Sequence[float]) -> str:
    """The exact genome as text: repr round-trips every float."""
    return ",".join(repr(float(x)) for x in deltas)


class RunArchive:
    """The run database. Methods may be called from several threads (reflector calls
    record themselves from the pool); one lock serialises them. `seconds` is the time
    spent inside the archive, for the overhead benchmark."""

    def __init__(self, connection: sqlite3.Connection, path: Path) -> None:
        self._db = connection
        self.path = path
        self._lock = threading.RLock()
        self.seconds = 0.0
        self._lineage_checked = False

    @classmethod
    def open(cls, path: Path) -> RunArchive:
        """Opens (creating if needed) the archive for writing."""
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
        archive = cls(db, path)
        try:
            for key in COUNTERS:
                archive.meta_count(key)
        except ConfigError:
            archive.close()
            raise
        return archive

    @classmethod
    def open_read_only(cls, path: Path) -> RunArchive:
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
    def _transaction(self) -> Iterator[sqlite3.Connection]:
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

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            started = time.perf_counter()
            try:
                return self._db.execute(sql, params).fetchall()
            finally:
                self.seconds += time.perf_counter() - started

    # -- meta and events --------------------------------------------------------------------

    def meta(self, key: str, default: str | None = None) -> str | None:
        rows = self._query("SELECT value FROM meta WHERE key = ?", (key,))
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
        with self._transaction() as db:
            db.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                           [(k, str(v)) for k, v in values.items()])

    def delete_meta(self, key: str) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM meta WHERE key = ?", (key,))

    def event(self, kind: str, **detail: object) -> None:
        with self._transaction() as db:
            db.execute("INSERT INTO events (kind, detail, created) VALUES (?, ?, ?)",
                       (kind, scrub(json.dumps(detail)), time.time()))

    def last_event(self) -> str | None:
        """The kind of the newest event, None when there is none."""
        rows = self._query("SELECT kind FROM events ORDER BY id DESC LIMIT 1")
        return rows[0][0] if rows else None

    def events(self, kind: str | None = None) -> list[tuple[str, dict[str, Any], float]]:
        sql = "SELECT id, kind, detail, created FROM events" + (" WHERE kind = ?" if kind else "") + " ORDER BY id"
        return [self._event(*row) for row in self._query(sql, (kind,) if kind else ())]

    def _event(self, eid: int, kind: Any, detail: Any, created: Any) -> tuple[str, dict[str, Any], float]:
        try:
            decoded = json.loads(detail) if isinstance(detail, str) else None
        except ValueError:
            decoded = None
        when = as_float(created)
        if not isinstance(kind, str) or not isinstance(decoded, dict) or when is None:
            problem = (f"kind is {shown(kind)}, not text" if not isinstance(kind, str) else
                       f"detail is {shown(detail)}, not a JSON object" if not isinstance(decoded, dict) else
                       f"created is {shown(created)}, not a finite number")
            raise self._bad_row("events", eid, problem)
        return kind, decoded, when

    def _bad_row(self, table: str, row: object, problem: str) -> ConfigError:
        """A hand-edited row the run cannot use, named by its table and row."""
        return ConfigError(f"'{self.path}' table {table}, row {row}: {problem}; restore it, or move the run "
                           "directory away to start afresh")

    # -- candidates -------------------------------------------------------------------------

    def add(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        """Stores `candidates` in one transaction; returns them with their new ids, which
        are consecutive in the order given."""
        with self._transaction() as db:
            return self._add(db, candidates)

    def admit(self, candidates: Sequence[Candidate], spots: Sequence[Spot | None], placements: Sequence[Placement],
              step: int) -> list[Candidate]:
        """What one request of strategy step `step` made, in one transaction: `candidates`
        (ids consecutive, in order), each placed at its spot (None: not placed), and
        `placements` of candidates made before."""
        with self._transaction() as db:
            added = self._add(db, candidates)
            made = [Placement(c.id or 0, spot) for c, spot in zip(added, spots, strict=True) if spot is not None]
            self._place(db, [*made, *placements], step)
        return added

    def _add(self, db: sqlite3.Connection, candidates: Sequence[Candidate]) -> list[Candidate]:
        added = []
        for c in candidates:
            now = time.time()
            cursor = db.execute(
                "INSERT INTO candidates (deltas, genome, scratchpad, operator, strategy, generation, "
                "status, note, fitness, mean_tokens, correctness, created) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (json.dumps(dict(c.deltas)), genome_key(list(c.deltas.values())), c.scratchpad,
                 c.operator, c.strategy, c.generation, c.status, c.note, c.fitness, c.mean_tokens,
                 c.correctness, now))
            cid = int(cursor.lastrowid or 0)
            db.executemany("INSERT INTO lineage (child, parent, position) VALUES (?, ?, ?)",
                           [(cid, p, i) for i, p in enumerate(c.parents)])
            added.append(replace(c, id=cid, created=now))
        return added

    def assess(self, cid: int, fitness: float, mean_tokens: float, correctness: float) -> None:
        """Records a candidate's fitness on the whole pool, once it is known."""
        with self._transaction() as db:
            db.execute("UPDATE candidates SET fitness = ?, mean_tokens = ?, correctness = ? WHERE id = ?",
                       (fitness, mean_tokens, correctness, cid))

    def candidate(self, cid: int) -> Candidate | None:
        if not 0 < cid <= MAX_ID:
            return None  # SQLite cannot even be asked
        rows = self._query(f"SELECT {_COLUMNS} FROM candidates WHERE id = ?", (cid,))
        return self._candidates(rows)[0] if rows else None

    def candidates(self, where: str = "", params: Sequence[Any] = ()) -> list[Candidate]:
        """All candidates (optionally filtered by an SQL condition), in id order."""
        sql = f"SELECT {_COLUMNS} FROM candidates {'WHERE ' + where if where else ''} ORDER BY id"
        return self._candidates(self._query(sql, params))

    def assessed(self) -> list[Candidate]:
        """The kept candidates whose fitness on the pool is known, in id order."""
        return self.candidates("status = 'evaluated' AND fitness IS NOT NULL")

    def initial(self) -> list[Candidate]:
        """The candidates made from the initial deltas, in id order."""
        return self.candidates("operator = 'initial'")

    def among(self, ids: Sequence[int]) -> dict[int, Candidate]:
        """The candidates of `ids` the archive holds, by id."""
        wanted = sorted({int(i) for i in ids})
        found = self.candidates(f"id IN ({','.join('?' * len(wanted))})", wanted) if wanted else []
        return {c.id: c for c in found if c.id is not None}

    def genomes(self) -> set[str]:
        """The genome key of every candidate."""
        return {genome for (genome,) in self._query("SELECT genome FROM candidates")}

    def last_step(self) -> int | None:
        """The latest step (generation or iteration) a candidate was made in; None when empty."""
        return self._query("SELECT max(generation) FROM candidates")[0][0]

    def _candidates(self, rows: Sequence[tuple[Any, ...]]) -> list[Candidate]:
        parents: dict[int, list[int]] = {r[0]: [] for r in rows}
        links = (self._query("SELECT child, parent FROM lineage WHERE child = ? ORDER BY position", (rows[0][0],))
                 if len(rows) == 1 else
                 self._query("SELECT child, parent FROM lineage ORDER BY child, position"))
        self._check_lineage()
        for child, parent in links:
            if child in parents:
                parents[child].append(parent)
        return [self._candidate(row, tuple(parents[row[0]])) for row in rows]

    def _candidate(self, row: Sequence[Any], parents: tuple[int, ...]) -> Candidate:
        """A candidates row as a `Candidate`, every field checked: a hand edit would otherwise
        surface as a bare JSONDecodeError or TypeError far from the row. What the archive
        wrote passes one quick test (`show` reads 100,000 rows); only a row that fails it is
        examined field by field."""
        cid, deltas, scratchpad, operator, strategy, generation, status, note, fitness, mean_tokens, correctness, \
            created = row
        decoded = _deltas(deltas)
        as_written = (decoded is not None and type(generation) is int and generation >= SEED_GENERATION
                      and type(created) is float and -math.inf < created < math.inf
                      and type(scratchpad) is str and type(operator) is str and type(strategy) is str
                      and type(status) is str and type(note) is str
                      and (fitness is None or (type(fitness) is float and 0 <= fitness <= 1))
                      and (mean_tokens is None or (type(mean_tokens) is float and 0 <= mean_tokens < math.inf))
                      and (correctness is None or (type(correctness) is float and 0 <= correctness <= 1)))
        if not as_written and (problem := _candidate_problem(row, decoded)):
            raise self._bad_row("candidates", cid, problem)
        return Candidate(decoded or {}, scratchpad, operator, parents, strategy, generation, status, note,
                         None if fitness is None else float(fitness),
                         None if mean_tokens is None else float(mean_tokens),
                         None if correctness is None else float(correctness), cid, float(created))

    def _check_lineage(self) -> None:
        """Every parent link names a candidate the archive holds (checked once: this process's
        own writes keep it so, with foreign keys on)."""
        if self._lineage_checked:
            return
        orphan = self._query("SELECT l.child, l.position, l.parent FROM lineage l LEFT JOIN candidates c "
                             "ON c.id = l.parent WHERE c.id IS NULL OR typeof(l.parent) != 'integer' LIMIT 1")
        if orphan:
            child, position, parent = orphan[0]
            raise self._bad_row("lineage", f"(child {shown(child)}, position {shown(position)})",
                                f"parent {shown(parent)} is not a candidate of the archive")
        self._lineage_checked = True

    def edges(self) -> list[tuple[int, int]]:
        """(parent, child) for every lineage link."""
        self._check_lineage()
        return [(p, c) for c, p in self._query("SELECT child, parent FROM lineage ORDER BY child, position")]

    def lineage(self) -> Lineage:
        """Parents, ancestors, descendants and children counts of the candidates so far."""
        ids = [int(r[0]) for r in self._query("SELECT id FROM candidates")]
        return Lineage(ids, self.edges())

    def last_candidate_id(self) -> int:
        return int(self._query("SELECT coalesce(max(id), 0) FROM candidates")[0][0])

    def best(self) -> Candidate | None:
        """The fittest candidate assessed on the whole pool; the earliest on a tie."""
        rows = self._query(f"SELECT {_COLUMNS} FROM candidates WHERE fitness IS NOT NULL "
                           "ORDER BY fitness DESC, id ASC LIMIT 1")
        return self._candidates(rows)[0] if rows else None

    # -- placements (tree node ids) ---------------------------------------------------------

    def place(self, placements: Sequence[Placement], step: int) -> None:
        """Placements decided in strategy step `step`."""
        with self._transaction() as db:
            self._place(db, placements, step)

    @staticmethod
    def _place(db: sqlite3.Connection, placements: Sequence[Placement], step: int) -> None:
        db.executemany("INSERT OR REPLACE INTO placements (label, candidate, generation, stage, idx, step) "
                       "VALUES (?, ?, ?, ?, ?, ?)", [(p.label, p.candidate, p.spot.generation, p.spot.stage,
                                                      p.spot.index, step) for p in placements])

    def placements(self) -> list[tuple[str, int, int, str, int]]:
        return [tuple(r) for r in self._query(  # type: ignore[misc]
            "SELECT label, candidate, generation, stage, idx FROM placements ORDER BY generation, stage, idx")]

    def rollback(self, last_candidate: int, from_step: int) -> int:
        """Forgets what an interrupted step made: candidates after `last_candidate` and
        placements and selections decided in step `from_step` or later. Evaluations, reflector calls and
        events stay (they are the cache and the record of what was spent). Returns the
        number of candidates forgotten."""
        with self._transaction() as db:
            db.execute("DELETE FROM placements WHERE step >= ? OR candidate > ?", (from_step, last_candidate))
            db.execute("DELETE FROM selections WHERE generation >= ?", (from_step,))
            db.execute("DELETE FROM selection_rounds WHERE generation >= ?", (from_step,))
            db.execute("DELETE FROM feedback WHERE candidate > ?", (last_candidate,))
            db.execute("DELETE FROM merges WHERE candidate > ?", (last_candidate,))
            db.execute("DELETE FROM lineage WHERE child > ?", (last_candidate,))
            return db.execute("DELETE FROM candidates WHERE id > ?", (last_candidate,)).rowcount

    # -- selections (seed 002) --------------------------------------------------------------

    def record_selection(self, generation: int, selections: Sequence[tuple[int, str, str]], summary: str,
                         fallback: str | None) -> None:
        """(candidate, category, reasoning) rows of one generation's selection, in one transaction."""
        with self._transaction() as db:
            db.execute("DELETE FROM selections WHERE generation = ?", (generation,))
            db.executemany("INSERT INTO selections (generation, position, candidate, category, reasoning) "
                           "VALUES (?, ?, ?, ?, ?)", [(generation, i, *s) for i, s in enumerate(selections)])
            db.execute("INSERT OR REPLACE INTO selection_rounds (generation, summary, fallback) VALUES (?, ?, ?)",
                       (generation, summary, fallback))

    def selections(self) -> list[tuple[int, int, str, str]]:
        """(generation, candidate, category, reasoning), in order."""
        return [tuple(r) for r in self._query(  # type: ignore[misc]
            "SELECT generation, candidate, category, reasoning FROM selections ORDER BY generation, position")]

    # -- feedback memory (seed 003) ---------------------------------------------------------

    def record_feedback(self, entries: Sequence[tuple[int, int, int, str, str, str]]) -> None:
        """(candidate, parent, iteration, generator, change summary, outcome) rows."""
        with self._transaction() as db:
            db.executemany("INSERT OR REPLACE INTO feedback (candidate, parent, iteration, generator, change, outcome) "
                           "VALUES (?, ?, ?, ?, ?, ?)", entries)

    def feedback(self, parents: Sequence[int] | None = None) -> list[tuple[int, int, int, str, str, str]]:
        """Entries (all, or those whose parent is in `parents`), oldest first."""
        rows = self._query("SELECT candidate, parent, iteration, generator, change, outcome FROM feedback "
                           "ORDER BY candidate")
        wanted = None if parents is None else set(parents)
        return [tuple(r) for r in rows if wanted is None or r[1] in wanted]  # type: ignore[misc]

    # -- merges (seed 004) ------------------------------------------------------------------

    def record_merge(self, candidate: int, first: int, second: int, ancestor: int, sources: Sequence[int],
                     accepted: bool) -> None:
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO merges (candidate, first, second, ancestor, sources, accepted) "
                       "VALUES (?, ?, ?, ?, ?, ?)", (candidate, first, second, ancestor, json.dumps(list(sources)),
                                                     int(accepted)))

    def merges(self) -> list[tuple[int, int, int, int, tuple[int, ...], bool]]:
        """(candidate, first, second, ancestor, component sources, accepted), oldest first."""
        rows = self._query("SELECT candidate, first, second, ancestor, sources, accepted FROM merges "
                           "ORDER BY candidate")
        return [(c, f, s, a, self._ids("merges", c, "sources", src), bool(acc)) for c, f, s, a, src, acc in rows]

    def _ids(self, table: str, row: object, column: str, text: Any) -> tuple[int, ...]:
        """A stored JSON list of integers (candidate ids, positions), refused otherwise."""
        try:
            decoded = json.loads(text) if isinstance(text, str) else None
        except ValueError:
            decoded = None
        if not isinstance(decoded, list) or any(as_count(item, MAX_ID + 1) is None for item in decoded):
            raise self._bad_row(table, row, f"{column} is {shown(text)}, not a JSON list of integers >= 0")
        return tuple(decoded)

    # -- the evaluation cache ---------------------------------------------------------------

    def cached(self, genomes: Sequence[str], examples: Sequence[str], context: str,
               table: str = "evaluations") -> dict[tuple[str, str], Answer]:
        """The stored answers among `genomes` x `examples` under `context`, each checked."""
        found: dict[tuple[str, str], Answer] = {}
        wanted = set(examples)
        for genome in dict.fromkeys(genomes):
            for example, answer, tokens, correct, reasoning in self._query(
                    f"SELECT example, answer, tokens, is_correct, reasoning FROM {_table(table)} "
                    "WHERE genome = ? AND context = ?", (genome, context)):
                if example in wanted:
                    found[genome, example] = self._answer(table, genome, example, answer, tokens, correct, reasoning)
        return found

    def answers_for(self, genome: str, context: str, table: str = "evaluations") -> dict[str, Answer]:
        """Every stored answer of `genome` under `context`, by example key; for a sampling
        run (its contexts carry a sample suffix) the latest sample of each example."""
        if not self.has_table(table):
            return {}
        rows = self._query(f"SELECT example, answer, tokens, is_correct, reasoning FROM {_table(table)} "
                           "WHERE genome = ? AND (context = ? OR context LIKE ?) ORDER BY created",
                           (genome, context, f"{context}:sample:%"))
        return {e: self._answer(table, genome, e, a, t, c, r) for e, a, t, c, r in rows}

    def _answer(self, table: str, genome: str, example: str, answer: Any, tokens: Any, correct: Any, reasoning: Any) -> Answer:
        """A stored row as an `Answer`, refused when a hand edit left it unusable: a score
        computed from it would be wrong without a sign."""
        if type(tokens) is not int or tokens < 0:
            problem = f"tokens is {shown(tokens)}, not an integer >= 0"
        elif type(correct) is not int or correct not in (0, 1):
            problem = f"is_correct is {shown(correct)}, not 0 or 1"
        elif not isinstance(answer, str) or not isinstance(reasoning, str):
            problem = f"{'answer' if not isinstance(answer, str) else 'reasoning'} is not text"
        else:
            return Answer(answer, tokens, bool(correct), reasoning)
        owners = self._query("SELECT min(id) FROM candidates WHERE genome = ?", (genome,))[0][0]
        whose = f"the genome of candidate {owners}" if owners is not None else f"genome '{shown(genome)[1:-1]}'"
        raise ConfigError(f"'{self.path}' table {table}, row of example '{example}' under {whose}: {problem}; "
                          "delete that row to have the answer generated again")

    def check_answers(self) -> None:
        """Every stored answer, of the search and of the checks, as `_answer` would take it
        when used: a row a hand edit left unusable is refused now (at a resume's start,
        before anything is written) rather than in the middle of a step. One scan of each
        table, in SQLite, for the rows `_answer` refuses."""
        for table in ("evaluations", "check_answers"):
            if not self.has_table(table):
                continue
            bad = self._query(f"SELECT genome, example, answer, tokens, is_correct, reasoning FROM {_table(table)} "
                              "WHERE typeof(tokens) != 'integer' OR tokens < 0 OR typeof(is_correct) != 'integer' "
                              "OR is_correct NOT IN (0, 1) OR typeof(answer) != 'text' OR typeof(reasoning) != 'text' "
                              "LIMIT 1")
            if bad:
                genome, example, answer, tokens, correct, reasoning = bad[0]
                self._answer(table, genome, example, answer, tokens, correct, reasoning)

    def store(self, answers: Mapping[tuple[str, str], Answer], context: str, cache_hits: int,
              table: str = "evaluations") -> None:
        """One batch of fresh answers and the count of pairs the cache served, in one
        transaction."""
        now = time.time()
        hits_key = "cache_hits" if table == "evaluations" else "check_cache_hits"
        with self._transaction() as db:
            # Read through the check, never CAST: a hand-edited 'NaN' would silently become 0.
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                       (hits_key, str(int(self.meta_count(hits_key)) + cache_hits)))
            db.executemany(
                f"INSERT OR REPLACE INTO {_table(table)} (genome, example, context, answer, tokens, is_correct, "
                "reasoning, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(g, e, context, a.answer, a.tokens, int(a.is_correct), a.reasoning, now)
                 for (g, e), a in answers.items()])

    def cache_hits(self) -> int:
        return int(self.meta_count("cache_hits"))

    def answer_times(self) -> list[float]:
        """When each fresh answer was stored, in order: the metric calls spent by a time."""
        return [created for (created,) in self._query("SELECT created FROM evaluations ORDER BY created")]

    def metric_calls(self) -> int:
        """Fresh (genome, example) evaluations ever made in this run directory by the search
        (the checks' answers are counted apart: `check_calls`)."""
        return int(self._query("SELECT count(*) FROM evaluations")[0][0])

    # -- the checks (held-out set, unsteered baseline) ---------------------------------------

    def has_table(self, table: str) -> bool:
        """Whether the file has `table` (an archive written before the checks opened read
        only has none of theirs)."""
        return bool(self._query("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?",
                                (table,))[0][0])

    def check_calls(self) -> tuple[int, int]:
        """(fresh answers, answers served from a cache) of the checks."""
        if not self.has_table("check_answers"):
            return 0, 0
        return (int(self._query("SELECT count(*) FROM check_answers")[0][0]),
                int(self.meta_count("check_cache_hits")))

    def record_checks(self, split: str, results: Sequence[CheckResult]) -> None:
        """Replaces what the checks of `split` had measured (a held-out set changed between
        sessions leaves no stale rows)."""
        with self._transaction() as db:
            db.execute("DELETE FROM check_results WHERE split = ?", (split,))
            db.executemany("INSERT INTO check_results (split, genome, examples, mean_tokens, correctness, fitness, "
                           "created) VALUES (?, ?, ?, ?, ?, ?, ?)",
                           [(split, r.genome, r.examples, r.mean_tokens, r.correctness, r.fitness, time.time())
                            for r in results])

    def checks(self, split: str) -> dict[str, CheckResult]:
        """What the checks measured on `split`, by genome key."""
        if not self.has_table("check_results"):
            return {}
        rows = self._query("SELECT split, genome, examples, mean_tokens, correctness, fitness FROM check_results "
                           "WHERE split = ? ORDER BY created, genome", (split,))
        for _, genome, examples, mean_tokens, correctness, fitness in rows:
            valid = {"examples": as_count(examples, MAX_ID + 1) is not None,
                     "mean_tokens": mean_tokens is not None and _score(mean_tokens, math.inf),
                     "correctness": correctness is not None and _score(correctness, 1.0),
                     "fitness": fitness is not None and _score(fitness, 1.0)}
            if bad := next((name for name, ok in valid.items() if not ok), None):
                raise self._bad_row("check_results", f"of split '{split}', genome '{shown(genome)[1:-1]}'",
                                    f"{bad} is not a number in its range")
        return {r[1]: CheckResult(*r) for r in rows}

    # -- reflector calls --------------------------------------------------------------------

    def record_call(self, call: CallRecord) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO reflector_calls (kind, candidate, parents, generation, attempt, prompt_tokens, "
                "completion_tokens, latency, verdict, created) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (call.kind, call.candidate, json.dumps(list(call.parents)), call.generation, call.attempt,
                 call.prompt_tokens, call.completion_tokens, call.latency, scrub(call.verdict), time.time()))

    def reflector_tokens(self) -> tuple[int, int, int]:
        """(calls, prompt tokens, completion tokens) over the whole run; a count that is no
        integer in [0, 2^53) is refused (a negative one once took a run past its budget)."""
        bad = self._query(
            "SELECT id, prompt_tokens, completion_tokens FROM reflector_calls WHERE typeof(prompt_tokens) != 'integer' "
            "OR typeof(completion_tokens) != 'integer' OR min(prompt_tokens, completion_tokens) < 0 "
            "OR max(prompt_tokens, completion_tokens) >= ? LIMIT 1", (MAX_TOKENS,))
        if bad:
            cid, prompt, completion = bad[0]
            name, value = ("prompt_tokens", prompt) if as_count(prompt, MAX_TOKENS) is None else \
                ("completion_tokens", completion)
            raise self._bad_row("reflector_calls", cid, f"{name} is {shown(value)}, not an integer in [0, 2^53)")
        calls, prompt, completion = self._query(
            "SELECT count(*), coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0) "
            "FROM reflector_calls")[0]
        return int(calls), int(prompt), int(completion)

    def reflector_seconds(self) -> float:
        """The latency of every reflector attempt, summed: what the reflector cost in time."""
        return float(self._query("SELECT coalesce(sum(latency), 0) FROM reflector_calls")[0][0])

    def verdicts(self, after: int = 0) -> tuple[int, int, int, str]:
        """(the newest reflector call's id, the calls after id `after`, how many of them
        were accepted, why the last rejected one was rejected or "")."""
        newest, calls, accepted = self._query(
            "SELECT coalesce(max(id), ?), count(*), coalesce(sum(verdict = 'accepted'), 0) FROM reflector_calls "
            "WHERE id > ?", (after, after))[0]
        rejected = self._query("SELECT verdict FROM reflector_calls WHERE id > ? AND verdict != 'accepted' "
                               "ORDER BY id DESC LIMIT 1", (after,))
        return int(newest), int(calls), int(accepted), rejected[0][0].removeprefix("rejected: ") if rejected else ""

    def calls_about(self, cid: int) -> list[CallRecord]:
        rows = self._query("SELECT id, kind, candidate, parents, generation, attempt, prompt_tokens, "
                           "completion_tokens, latency, verdict FROM reflector_calls WHERE candidate = ? ORDER BY id",
                           (cid,))
        return [CallRecord(k, c, self._ids("reflector_calls", i, "parents", p), g, a, pt, ct, lat, v)
                for i, k, c, p, g, a, pt, ct, lat, v in rows]

    def integrity(self) -> str:
        return str(self._query("PRAGMA integrity_check")[0][0])


class CheckStore:
    """The checks' `AnswerStore`: an answer the search already made is served from the
    search's table, every fresh one goes to `check_answers`, so a check never adds to
    the search's metric calls nor changes what the search's cache serves."""

    def __init__(self, archive: RunArchive) -> None:
        self.archive = archive

    def cached(self, genomes: Sequence[str], examples: Sequence[str], context: str) -> dict[tuple[str, str], Answer]:
        found = self.archive.cached(genomes, examples, context, table="check_answers")
        found.update(self.archive.cached(genomes, examples, context))
        return found

    def store(self, answers: Mapping[tuple[str, str], Answer], context: str, cache_hits: int) -> None:
        self.archive.store(answers, context, cache_hits, table="check_answers")

    def answers_for(self, genome: str, context: str) -> dict[str, Answer]:
        """Every answer of `genome` under `context` the checks see, by example key."""
        return {**self.archive.answers_for(genome, context, table="check_answers"),
                **self.archive.answers_for(genome, context)}


def _candidate_problem(row: Sequence[Any], decoded: dict[str, float] | None) -> str | None:
    """What is wrong with a candidates row, in words; None when it only differs from what
    the archive writes in ways that are still right (an integer for a float)."""
    _, deltas, scratchpad, operator, strategy, generation, status, note, fitness, mean_tokens, correctness, \
        created = row
    texts = {"scratchpad": scratchpad, "operator": operator, "strategy": strategy, "status": status, "note": note}
    scores = {"fitness": (fitness, 1.0), "mean_tokens": (mean_tokens, math.inf), "correctness": (correctness, 1.0)}
    if decoded is None:
        return f"deltas is {shown(deltas)}, not a JSON object of cluster ids and finite numbers"
    if type(generation) is not int or generation < SEED_GENERATION:
        return f"generation is {shown(generation)}, not an integer >= {SEED_GENERATION}"
    if as_float(created) is None:
        return f"created is {shown(created)}, not a finite number"
    for name, text in texts.items():
        if not isinstance(text, str):
            return f"{name} is {shown(text)}, not text"
    for name, (value, high) in scores.items():
        if not _score(value, high):
            return f"{name} is {shown(value)}, not a number {'in [0, 1]' if high == 1 else '>= 0'}"
    return None


def _score(value: Any, high: float) -> bool:
    """A stored score is absent (not assessed yet) or a number in [0, high]."""
    number = as_float(value)
    return value is None or (number is not None and 0 <= number <= high)


def _deltas(text: Any) -> dict[str, float] | None:
    """A candidate's stored deltas, or None when they are not a JSON object of finite numbers
    (NaN and Infinity, which Python's parser takes, included)."""
    try:
        decoded = json.loads(text, parse_constant=_not_a_number) if isinstance(text, str) else None
    except ValueError:
        return None
    if not isinstance(decoded, dict):
        return None
    if set(map(type, decoded.values())) <= {float}:
        return decoded  # what the archive writes: finite floats (the parser refused the rest)
    values = {key: as_float(value) for key, value in decoded.items()}
    return None if None in values.values() else values  # type: ignore[return-value]


def _not_a_number(constant: str) -> float:
    raise ValueError(f"{constant} is not a finite number")


def _table(name: str) -> str:
    """Table names are never user input, but the f-strings above would take any."""
    if name not in ("evaluations", "check_answers"):
        raise ValueError(f"no answer table {name!r}")
    return name


_COLUMNS = ("id, deltas, scratchpad, operator, strategy, generation, status, note, fitness, mean_tokens, "
            "correctness, created")
