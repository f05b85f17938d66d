"""Candidates, their lineage and their placements in a strategy's structure: what a run
made, read back through named queries (no caller writes SQL)."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from compressor_2.archive import rows
from compressor_2.archive.lineage import Lineage
from compressor_2.archive.rows import MAX_ID, Candidate, Placement, RowError, genome_key
from compressor_2.archive.schema import Database
from compressor_2.common import shown

CANDIDATE_COLUMNS = ("id", "deltas", "scratchpad", "operator", "strategy", "generation", "status", "note", "fitness",
                     "mean_tokens", "correctness", "created")
_SELECTED = ", ".join(CANDIDATE_COLUMNS)
CORRECTNESS_EPSILON = 1e-9  # correctness is a fraction of the pool: equal ones may differ in the last bit
Rank = tuple[float, ...]  # compared as tuples: the higher the better


def rank(fitness: float, tokens: float | None, correctness: float | None, floor: float | None) -> Rank:
    """Which candidate is the best, the one order the archive's `best` and the run's
    best-ever share: the fitness; with a correctness floor, first whether a candidate is at
    least that correct, then (if so) the fewer tokens, then the fitness."""
    if floor is None:
        return (fitness,)
    if tokens is None or correctness is None or correctness < floor - CORRECTNESS_EPSILON:
        return (0.0, fitness)
    return (1.0, -tokens, fitness)
# The candidates a named query selects.
_WHERE = {
    "all": "",
    "assessed": "WHERE status = 'evaluated' AND fitness IS NOT NULL",
    "initial": "WHERE operator = 'initial'",
}


class Candidates:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._lineage_checked = False

    # -- writing ----------------------------------------------------------------------------

    def add(self, db: sqlite3.Connection, candidates: Sequence[Candidate]) -> list[Candidate]:
        """`candidates` stored inside the transaction `db`, with their new ids, which are
        consecutive in the order given."""
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

    @staticmethod
    def place(db: sqlite3.Connection, placements: Sequence[Placement], step: int) -> None:
        """Placements decided in strategy step `step`, inside the transaction `db`."""
        db.executemany("INSERT OR REPLACE INTO placements (label, candidate, generation, stage, idx, step) "
                       "VALUES (?, ?, ?, ?, ?, ?)", [(p.label, p.candidate, p.spot.generation, p.spot.stage,
                                                      p.spot.index, step) for p in placements])

    def assess(self, cid: int, fitness: float, mean_tokens: float, correctness: float) -> None:
        with self.db.transaction() as db:
            db.execute("UPDATE candidates SET fitness = ?, mean_tokens = ?, correctness = ? WHERE id = ?",
                       (fitness, mean_tokens, correctness, cid))

    @staticmethod
    def forget(db: sqlite3.Connection, last_candidate: int, from_step: int) -> int:
        """Inside the transaction `db`: candidates after `last_candidate`, their lineage, and
        placements decided in step `from_step` or later (or of those candidates); returns
        the number of candidates forgotten."""
        db.execute("DELETE FROM placements WHERE step >= ? OR candidate > ?", (from_step, last_candidate))
        db.execute("DELETE FROM lineage WHERE child > ?", (last_candidate,))
        return db.execute("DELETE FROM candidates WHERE id > ?", (last_candidate,)).rowcount

    # -- reading ----------------------------------------------------------------------------

    def one(self, cid: int) -> Candidate | None:
        if not 0 < cid <= MAX_ID:
            return None  # SQLite cannot even be asked
        found = self.db.query(f"SELECT {_SELECTED} FROM candidates WHERE id = ?", (cid,))
        return self._candidates(found)[0] if found else None

    def named(self, query: str) -> list[Candidate]:
        """The candidates a named query selects (`_WHERE`), in id order."""
        return self._candidates(self.db.query(f"SELECT {_SELECTED} FROM candidates {_WHERE[query]} "
                                              "ORDER BY id"))

    def among(self, ids: Sequence[int]) -> dict[int, Candidate]:
        wanted = sorted({int(i) for i in ids})
        found = self._candidates(self.db.query(
            f"SELECT {_SELECTED} FROM candidates WHERE id IN ({','.join('?' * len(wanted))}) ORDER BY id",
            wanted)) if wanted else []
        return {c.id: c for c in found if c.id is not None}

    def best(self, floor: float | None = None) -> Candidate | None:
        """The highest ranked candidate with a fitness (`rank`), the earliest on a tie."""
        if floor is None:
            found = self.db.query(f"SELECT {_SELECTED} FROM candidates WHERE fitness IS NOT NULL "
                                  "ORDER BY fitness DESC, id ASC LIMIT 1")
            return self._candidates(found)[0] if found else None
        ranked = self._candidates(self.db.query(f"SELECT {_SELECTED} FROM candidates WHERE fitness IS NOT NULL"))
        return max(ranked, key=lambda c: (rank(c.fitness or 0.0, c.mean_tokens, c.correctness, floor), -(c.id or 0)),
                   default=None)

    def genomes(self) -> set[str]:
        return {genome for (genome,) in self.db.query("SELECT genome FROM candidates")}

    def last_step(self) -> int | None:
        return self.db.query("SELECT max(generation) FROM candidates")[0][0]

    def last_id(self) -> int:
        return int(self.db.query("SELECT coalesce(max(id), 0) FROM candidates")[0][0])

    def owner(self, genome: str) -> int | None:
        """The earliest candidate of `genome`, None when no candidate has it."""
        return self.db.query("SELECT min(id) FROM candidates WHERE genome = ?", (genome,))[0][0]

    def _candidates(self, found: Sequence[tuple[Any, ...]]) -> list[Candidate]:
        parents: dict[int, list[int]] = {r[0]: [] for r in found}
        links = (self.db.query("SELECT child, parent FROM lineage WHERE child = ? ORDER BY position", (found[0][0],))
                 if len(found) == 1 else
                 self.db.query("SELECT child, parent FROM lineage ORDER BY child, position"))
        self._check_lineage()
        for child, parent in links:
            if child in parents:
                parents[child].append(parent)
        made = []
        for row in found:
            try:
                made.append(rows.candidate(row, tuple(parents[row[0]])))
            except RowError as exc:
                raise self.db.bad_row("candidates", row[0], str(exc)) from None
        return made

    # -- lineage and placements -------------------------------------------------------------

    def _check_lineage(self) -> None:
        """Every parent link names a candidate the archive holds (checked once: this process's
        own writes keep it so, with foreign keys on)."""
        if self._lineage_checked:
            return
        orphan = self.db.query("SELECT l.child, l.position, l.parent FROM lineage l LEFT JOIN candidates c "
                               "ON c.id = l.parent WHERE c.id IS NULL OR typeof(l.parent) != 'integer' LIMIT 1")
        if orphan:
            child, position, parent = orphan[0]
            raise self.db.bad_row("lineage", f"(child {shown(child)}, position {shown(position)})",
                                  f"parent {shown(parent)} is not a candidate of the archive")
        self._lineage_checked = True

    def edges(self) -> list[tuple[int, int]]:
        self._check_lineage()
        return [(p, c) for c, p in self.db.query("SELECT child, parent FROM lineage ORDER BY child, position")]

    def lineage(self) -> Lineage:
        ids = [int(r[0]) for r in self.db.query("SELECT id FROM candidates")]
        return Lineage(ids, self.edges())

    def placements(self) -> list[tuple[str, int, int, str, int]]:
        return [tuple(r) for r in self.db.query(  # type: ignore[misc]
            "SELECT label, candidate, generation, stage, idx FROM placements ORDER BY generation, stage, idx")]

