"""The answer tables: one answer per (genome, example, context), with the count of pairs
their cache served. The search's (`evaluations`: its fresh answers are the run's metric
calls) and the checks' (`check_answers`, counted apart) are two tables of one kind; and
what the checks measured of a genome, by split (`check_results`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from compressor_2.archive import rows
from compressor_2.archive.rows import Answer, CheckResult, RowError
from compressor_2.archive.schema import Database
from compressor_2.common import ConfigError, shown


class AnswerTable:
    """The answers of one table (`table`), its cache hits (the meta counter `hits_key`) and the
    answers ever generated into it (`fresh_key`: rows deleted since were still spent).
    `owner` names the candidate of a genome, for the refusal of a broken row."""

    def __init__(self, db: Database, table: str, hits_key: str, fresh_key: str,
                 owner: Callable[[str], int | None]) -> None:
        self.db, self.table, self.hits_key, self.fresh_key, self.owner = db, table, hits_key, fresh_key, owner

    def cached(self, genomes: Sequence[str], examples: Sequence[str], context: str) -> dict[tuple[str, str], Answer]:
        """The stored answers among `genomes` x `examples` under `context`, each checked."""
        found: dict[tuple[str, str], Answer] = {}
        wanted = set(examples)
        for genome in dict.fromkeys(genomes):
            for example, answer, tokens, correct, reasoning in self.db.query(
                    f"SELECT example, answer, tokens, is_correct, reasoning FROM {self.table} "
                    "WHERE genome = ? AND context = ?", (genome, context)):
                if example in wanted:
                    found[genome, example] = self._answer(genome, example, answer, tokens, correct, reasoning)
        return found

    def answers_for(self, genome: str, context: str) -> dict[str, Answer]:
        """Every stored answer of `genome` under `context`, by example key; for a sampling
        run (its contexts carry a sample suffix) the latest sample of each example."""
        if not self.db.has_table(self.table):
            return {}
        found = self.db.query(f"SELECT example, answer, tokens, is_correct, reasoning FROM {self.table} "
                              "WHERE genome = ? AND (context = ? OR context LIKE ?) ORDER BY created",
                              (genome, context, f"{context}:sample:%"))
        return {e: self._answer(genome, e, a, t, c, r) for e, a, t, c, r in found}

    def check_rows(self) -> None:
        """Refuses, as `_answer` would when it is used, the first stored row a hand edit left
        unusable: one scan of the table, in SQLite, for the rows `_answer` refuses."""
        if not self.db.has_table(self.table):
            return
        bad = self.db.query(f"SELECT genome, example, answer, tokens, is_correct, reasoning FROM {self.table} "
                            "WHERE typeof(tokens) != 'integer' OR tokens < 0 OR typeof(is_correct) != 'integer' "
                            "OR is_correct NOT IN (0, 1) OR typeof(answer) != 'text' OR typeof(reasoning) != 'text' "
                            "LIMIT 1")
        if bad:
            genome, example, *row = bad[0]
            self._answer(genome, example, *row)

    def _answer(self, genome: str, example: str, *row: object) -> Answer:
        """A stored row as an `Answer`, refused when a hand edit left it unusable."""
        try:
            return rows.answer(*row)
        except RowError as exc:
            owner = self.owner(genome)
            whose = f"the genome of candidate {owner}" if owner is not None else f"genome '{shown(genome)[1:-1]}'"
            raise ConfigError(f"'{self.db.path}' table {self.table}, row of example '{example}' under {whose}: "
                              f"{exc}; delete that row to have the answer generated again") from None

    def store(self, answers: Mapping[tuple[str, str], Answer], context: str, cache_hits: int) -> None:
        """One batch of fresh answers and the count of pairs the cache served, in one
        transaction."""
        now = time.time()
        with self.db.transaction() as db:
            # Read through the check, never CAST: a hand-edited 'NaN' would silently become 0.
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                       (self.hits_key, str(int(self.db.meta_count(self.hits_key)) + cache_hits)))
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                       (self.fresh_key, str(self.fresh() + len(answers))))
            db.executemany(
                f"INSERT OR REPLACE INTO {self.table} (genome, example, context, answer, tokens, is_correct, "
                "reasoning, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(g, e, context, a.answer, a.tokens, int(a.is_correct), a.reasoning, now)
                 for (g, e), a in answers.items()])

    def fresh(self) -> int:
        """The answers generated into this table, as counted when they were stored (the spending
        stays when rows are deleted); the rows themselves in an archive written before the
        count was kept."""
        rows = self.db.query(f"SELECT count(*) FROM {self.table}")[0][0] if self.db.has_table(self.table) else 0
        return max(int(self.db.meta_count(self.fresh_key)), int(rows))

    def hits(self) -> int:
        return int(self.db.meta_count(self.hits_key))

    def times(self) -> list[float]:
        """When each fresh answer was stored, in order."""
        return [created for (created,) in self.db.query(f"SELECT created FROM {self.table} ORDER BY created")]


class CheckResults:
    """What the checks measured of each genome, by split ("training", "heldout")."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def record(self, split: str, results: Sequence[CheckResult]) -> None:
        """Replaces what the checks of `split` had measured (a held-out set changed between
        sessions leaves no stale rows), and how many genomes that is (`recorded`)."""
        with self.db.transaction() as db:
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                       (recorded_key(split), str(len(results))))
            db.execute("DELETE FROM check_results WHERE split = ?", (split,))
            db.executemany("INSERT INTO check_results (split, genome, examples, mean_tokens, correctness, fitness, "
                           "created) VALUES (?, ?, ?, ?, ?, ?, ?)",
                           [(split, r.genome, r.examples, r.mean_tokens, r.correctness, r.fitness, time.time())
                            for r in results])

    def recorded(self, split: str) -> int:
        """How many genomes the checks of `split` last recorded (0 before they ever ran, and in
        an archive from before the count was kept): rows of `of` deleted since are missing."""
        return int(self.db.meta_count(recorded_key(split)))

    def of(self, split: str) -> dict[str, CheckResult]:
        """What the checks measured on `split`, by genome key."""
        if not self.db.has_table("check_results"):
            return {}
        found = self.db.query("SELECT split, genome, examples, mean_tokens, correctness, fitness FROM check_results "
                              "WHERE split = ? ORDER BY created, genome", (split,))
        results = {}
        for row in found:
            try:
                results[row[1]] = rows.check_result(row)
            except RowError as exc:
                raise self.db.bad_row("check_results", f"of split '{split}', genome '{shown(row[1])[1:-1]}'",
                                      str(exc)) from None
        return results


def recorded_key(split: str) -> str:
    """The meta counter of the genomes the checks of `split` last recorded."""
    return f"{split}_checked"
