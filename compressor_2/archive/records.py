"""What one strategy records beside the candidates: the GA's LLM selections, the
archive strategy's feedback memory and GEPA's merges."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from compressor_2.archive import rows
from compressor_2.archive.rows import RowError
from compressor_2.archive.schema import Database

Feedback = tuple[int, int, int, str, str, str]  # candidate, parent, iteration, generator, change, outcome
Merge = tuple[int, int, int, int, tuple[int, ...], bool]  # candidate, first, second, ancestor, sources, accepted


class Records:
    def __init__(self, db: Database) -> None:
        self.db = db

    @staticmethod
    def forget(db: sqlite3.Connection, last_candidate: int, from_step: int) -> None:
        """Inside the transaction `db`: what steps from `from_step` on, or candidates after
        `last_candidate`, had recorded."""
        db.execute("DELETE FROM selections WHERE generation >= ?", (from_step,))
        db.execute("DELETE FROM selection_rounds WHERE generation >= ?", (from_step,))
        db.execute("DELETE FROM feedback WHERE candidate > ?", (last_candidate,))
        db.execute("DELETE FROM merges WHERE candidate > ?", (last_candidate,))

    # -- selections (the GA's LLM selection) ----------------------------------------------

    def record_selection(self, generation: int, selections: Sequence[tuple[int, str, str]], summary: str,
                         fallback: str | None) -> None:
        with self.db.transaction() as db:
            db.execute("DELETE FROM selections WHERE generation = ?", (generation,))
            db.executemany("INSERT INTO selections (generation, position, candidate, category, reasoning) "
                           "VALUES (?, ?, ?, ?, ?)", [(generation, i, *s) for i, s in enumerate(selections)])
            db.execute("INSERT OR REPLACE INTO selection_rounds (generation, summary, fallback) VALUES (?, ?, ?)",
                       (generation, summary, fallback))

    def selections(self) -> list[tuple[int, int, str, str]]:
        return [tuple(r) for r in self.db.query(  # type: ignore[misc]
            "SELECT generation, candidate, category, reasoning FROM selections ORDER BY generation, position")]

    # -- feedback memory (the archive strategy) --------------------------------------------

    def record_feedback(self, entries: Sequence[Feedback]) -> None:
        with self.db.transaction() as db:
            db.executemany("INSERT OR REPLACE INTO feedback (candidate, parent, iteration, generator, change, outcome) "
                           "VALUES (?, ?, ?, ?, ?, ?)", entries)

    def feedback(self, parents: Sequence[int] | None = None) -> list[Feedback]:
        found = self.db.query("SELECT candidate, parent, iteration, generator, change, outcome FROM feedback "
                              "ORDER BY candidate")
        wanted = None if parents is None else set(parents)
        return [tuple(r) for r in found if wanted is None or r[1] in wanted]  # type: ignore[misc]

    # -- merges (GEPA) ----------------------------------------------------------------------

    def record_merge(self, candidate: int, first: int, second: int, ancestor: int, sources: Sequence[int],
                     accepted: bool) -> None:
        with self.db.transaction() as db:
            db.execute("INSERT OR REPLACE INTO merges (candidate, first, second, ancestor, sources, accepted) "
                       "VALUES (?, ?, ?, ?, ?, ?)", (candidate, first, second, ancestor, json.dumps(list(sources)),
                                                     int(accepted)))

    def merges(self) -> list[Merge]:
        found = self.db.query("SELECT candidate, first, second, ancestor, sources, accepted FROM merges "
                              "ORDER BY candidate")
        merges = []
        for c, f, s, a, src, acc in found:
            try:
                merges.append((c, f, s, a, rows.ids("sources", src), bool(acc)))
            except RowError as exc:
                raise self.db.bad_row("merges", c, str(exc)) from None
        return merges
