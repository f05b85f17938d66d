"""`RunArchive`: the run database (`run.sqlite`) as one object, a facade over its parts:
- the file, its schema, transactions and meta table (`schema.py`);
- typed rows and their checks (`rows.py`);
- candidates, their lineage and placements (`candidates.py`);
- the answer tables, the search's cache and the checks' answers, one class for both, and
  the checks' results (`answers.py`);
- what one strategy records beside the candidates: selections, feedback, merges
  (`records.py`);
- the events and the reflector calls (`log.py`).
Callers read it through named queries; no SQL is written outside this folder.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compressor_2.archive.answers import AnswerTable, CheckResults
from compressor_2.archive.candidates import Candidates
from compressor_2.archive.lineage import Lineage
from compressor_2.archive.log import RunLog
from compressor_2.archive.records import Feedback, Merge, Records
from compressor_2.archive.rows import Answer, CallRecord, Candidate, CheckResult, Placement, ReplyTally, Spot
from compressor_2.archive.schema import Database

BEST_FLOOR = "best_floor"  # meta: the correctness a best must reach (the baseline's on the pool), when recorded


class RunArchive:
    """The run database; safe to call from several threads (reflector calls record
    themselves from the pool)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._candidates = Candidates(db)
        self.evaluations = AnswerTable(db, "evaluations", "cache_hits", "fresh_answers",
                                       self._candidates.owner)  # the search's cache
        self.check_answers = AnswerTable(db, "check_answers", "check_cache_hits", "check_fresh_answers",
                                         self._candidates.owner)
        self._checks = CheckResults(db)
        self._records = Records(db)
        self._log = RunLog(db)

    @classmethod
    def open(cls, path: Path) -> RunArchive:
        """Opens (creating if needed) the archive for writing."""
        return cls(Database.open(path))

    @classmethod
    def open_read_only(cls, path: Path) -> RunArchive:
        return cls(Database.open_read_only(path))

    @property
    def path(self) -> Path:
        return self.db.path

    @property
    def seconds(self) -> float:
        """The time spent inside the archive, for the overhead benchmark."""
        return self.db.seconds

    def close(self) -> None:
        self.db.close()

    def integrity(self) -> str:
        return self.db.integrity()

    def has_table(self, table: str) -> bool:
        return self.db.has_table(table)

    # -- meta and events --------------------------------------------------------------------

    def meta(self, key: str, default: str | None = None) -> str | None:
        return self.db.meta(key, default)

    def meta_count(self, key: str) -> float:
        """A counter kept in meta (0 when absent), refused, naming the row, unless a finite
        number >= 0 (an integer for the counters of things)."""
        return self.db.meta_count(key)

    def set_meta(self, values: Mapping[str, object]) -> None:
        self.db.set_meta(values)

    def delete_meta(self, key: str) -> None:
        self.db.delete_meta(key)

    def event(self, kind: str, **detail: object) -> None:
        self._log.event(kind, **detail)

    def last_event(self) -> str | None:
        """The kind of the newest event, None when there is none."""
        return self._log.last_event()

    def events(self, kind: str | None = None) -> list[tuple[str, dict[str, Any], float]]:
        return self._log.events(kind)

    # -- candidates, lineage, placements ------------------------------------------------------

    def add(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        """Stores `candidates` in one transaction; returns them with their new ids, which
        are consecutive in the order given."""
        with self.db.transaction() as db:
            return self._candidates.add(db, candidates)

    def admit(self, candidates: Sequence[Candidate], spots: Sequence[Spot | None], placements: Sequence[Placement],
              step: int) -> list[Candidate]:
        """What one request of strategy step `step` made, in one transaction: `candidates`
        (ids consecutive, in order), each placed at its spot (None: not placed), and
        `placements` of candidates made before."""
        with self.db.transaction() as db:
            added = self._candidates.add(db, candidates)
            made = [Placement(c.id or 0, spot) for c, spot in zip(added, spots, strict=True) if spot is not None]
            self._candidates.place(db, [*made, *placements], step)
        return added

    def place(self, placements: Sequence[Placement], step: int) -> None:
        """Placements decided in strategy step `step`."""
        with self.db.transaction() as db:
            self._candidates.place(db, placements, step)

    def assess(self, cid: int, fitness: float, mean_tokens: float, correctness: float) -> None:
        """Records a candidate's fitness on the whole pool, once it is known."""
        self._candidates.assess(cid, fitness, mean_tokens, correctness)

    def rollback(self, last_candidate: int, from_step: int) -> int:
        """Forgets what an interrupted step made: candidates after `last_candidate`, and
        placements, selections, feedback and merges of step `from_step` or later (or of
        those candidates). Answers, reflector calls and events stay (they are the cache and
        the record of what was spent). Returns the number of candidates forgotten."""
        with self.db.transaction() as db:
            Records.forget(db, last_candidate, from_step)
            return Candidates.forget(db, last_candidate, from_step)

    def candidate(self, cid: int) -> Candidate | None:
        return self._candidates.one(cid)

    def candidates(self) -> list[Candidate]:
        """Every candidate, in id order."""
        return self._candidates.named("all")

    def assessed(self) -> list[Candidate]:
        """The kept candidates whose fitness on the pool is known, in id order."""
        return self._candidates.named("assessed")

    def initial(self) -> list[Candidate]:
        """The candidates made from the initial deltas, in id order."""
        return self._candidates.named("initial")

    def among(self, ids: Sequence[int]) -> dict[int, Candidate]:
        """The candidates of `ids` the archive holds, by id."""
        return self._candidates.among(ids)

    def best(self) -> Candidate | None:
        """The fittest candidate assessed on the whole pool, the earliest on a tie; when the
        run recorded a correctness floor (`BEST_FLOOR`, CONFIG_BEST_RULE="shortest"), the
        shortest of those at least that correct (then the fitter, then the earliest), and
        the fittest only while none is."""
        floor = self.meta(BEST_FLOOR)
        return self._candidates.best(None if floor is None else float(floor))

    def genomes(self) -> set[str]:
        """The genome key of every candidate."""
        return self._candidates.genomes()

    def last_step(self) -> int | None:
        """The latest step (generation or iteration) a candidate was made in; None when empty."""
        return self._candidates.last_step()

    def last_candidate_id(self) -> int:
        return self._candidates.last_id()

    def edges(self) -> list[tuple[int, int]]:
        """(parent, child) for every lineage link."""
        return self._candidates.edges()

    def lineage(self) -> Lineage:
        """Parents, ancestors, descendants and children counts of the candidates so far."""
        return self._candidates.lineage()

    def placements(self) -> list[tuple[str, int, int, str, int]]:
        return self._candidates.placements()

    # -- the search's answers ---------------------------------------------------------------

    def cached(self, genomes: Sequence[str], examples: Sequence[str], context: str) -> dict[tuple[str, str], Answer]:
        """The search's stored answers among `genomes` x `examples` under `context`."""
        return self.evaluations.cached(genomes, examples, context)

    def answers_for(self, genome: str, context: str) -> dict[str, Answer]:
        """Every answer of `genome` the search stored under `context`, by example key."""
        return self.evaluations.answers_for(genome, context)

    def store(self, answers: Mapping[tuple[str, str], Answer], context: str, cache_hits: int) -> None:
        """One batch of the search's fresh answers and its cache hits, in one transaction."""
        self.evaluations.store(answers, context, cache_hits)

    def check_stored_answers(self) -> None:
        """Every stored answer, of the search and of the checks, as it would be taken when
        used: a row a hand edit left unusable is refused now (at a resume's start, before
        anything is written) rather than in the middle of a step."""
        self.evaluations.check_rows()
        self.check_answers.check_rows()

    def cache_hits(self) -> int:
        return self.evaluations.hits()

    def answer_times(self) -> list[float]:
        """When each fresh answer was stored, in order: the metric calls spent by a time."""
        return self.evaluations.times()

    def metric_calls(self) -> int:
        """Fresh (genome, example) evaluations ever made in this run directory by the search
        (the checks' answers are counted apart: `check_calls`)."""
        return self.evaluations.fresh()

    # -- the checks (held-out set, unsteered baseline) ---------------------------------------

    def check_calls(self) -> tuple[int, int]:
        """(fresh answers, answers served from a cache) of the checks."""
        if not self.db.has_table("check_answers"):
            return 0, 0
        return self.check_answers.fresh(), self.check_answers.hits()

    def record_checks(self, split: str, results: Sequence[CheckResult]) -> None:
        """Replaces what the checks of `split` had measured."""
        self._checks.record(split, results)

    def checks(self, split: str) -> dict[str, CheckResult]:
        """What the checks measured on `split`, by genome key."""
        return self._checks.of(split)

    def checks_recorded(self, split: str) -> int:
        """How many genomes the checks of `split` last recorded (0 before they ran)."""
        return self._checks.recorded(split)

    # -- the strategies' own records ----------------------------------------------------------

    def record_selection(self, generation: int, selections: Sequence[tuple[int, str, str]], summary: str,
                         fallback: str | None) -> None:
        """(candidate, category, reasoning) rows of one generation's LLM selection."""
        self._records.record_selection(generation, selections, summary, fallback)

    def selections(self) -> list[tuple[int, int, str, str]]:
        """(generation, candidate, category, reasoning), in order."""
        return self._records.selections()

    def record_feedback(self, entries: Sequence[Feedback]) -> None:
        """The archive strategy's feedback memory: (candidate, parent, iteration, generator,
        change summary, outcome) rows."""
        self._records.record_feedback(entries)

    def feedback(self, parents: Sequence[int] | None = None) -> list[Feedback]:
        """Entries (all, or those whose parent is in `parents`), oldest first."""
        return self._records.feedback(parents)

    def record_merge(self, candidate: int, first: int, second: int, ancestor: int, sources: Sequence[int],
                     accepted: bool) -> None:
        self._records.record_merge(candidate, first, second, ancestor, sources, accepted)

    def merges(self) -> list[Merge]:
        """(candidate, first, second, ancestor, component sources, accepted), GEPA's, oldest first."""
        return self._records.merges()

    # -- reflector calls --------------------------------------------------------------------

    def record_call(self, call: CallRecord) -> None:
        self._log.record_call(call)

    def reflector_tokens(self) -> tuple[int, int, int]:
        """(calls, prompt tokens, completion tokens) over the whole run."""
        return self._log.reflector_tokens()

    def reflector_seconds(self) -> float:
        """The latency of every reflector attempt, summed: what the reflector cost in time."""
        return self._log.reflector_seconds()

    def reply_tally(self, after: int = 0) -> ReplyTally:
        """The reflector's replies after call id `after`: the newest call's id, how many,
        how many accepted, why the last rejected one was rejected."""
        return self._log.reply_tally(after)

    def calls_about(self, cid: int) -> list[CallRecord]:
        return self._log.calls_about(cid)


class CheckStore:
    """The checks' `AnswerStore`: an answer the search already made is served from the
    search's table, every fresh one goes to `check_answers`, so a check never adds to
    the search's metric calls nor changes what the search's cache serves."""

    def __init__(self, archive: RunArchive) -> None:
        self.checks, self.search = archive.check_answers, archive.evaluations

    def cached(self, genomes: Sequence[str], examples: Sequence[str], context: str) -> dict[tuple[str, str], Answer]:
        found = self.checks.cached(genomes, examples, context)
        found.update(self.search.cached(genomes, examples, context))
        return found

    def store(self, answers: Mapping[tuple[str, str], Answer], context: str, cache_hits: int) -> None:
        self.checks.store(answers, context, cache_hits)

    def answers_for(self, genome: str, context: str) -> dict[str, Answer]:
        """Every answer of `genome` under `context` the checks see, by example key."""
        return {**self.checks.answers_for(genome, context), **self.search.answers_for(genome, context)}
