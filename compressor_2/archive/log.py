"""What a run did and spent, as it happened: its events (starts, interruptions, stops) and
every reflector attempt (kind, tokens, latency, outcome)."""

from __future__ import annotations

import json
import time
from typing import Any

from compressor_2.archive import rows
from compressor_2.archive.rows import CallRecord, ReplyTally, RowError
from compressor_2.archive.schema import Database
from compressor_2.common import MAX_TOKENS, as_count, scrub, shown


class RunLog:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- events -----------------------------------------------------------------------------

    def event(self, kind: str, **detail: object) -> None:
        with self.db.transaction() as db:
            db.execute("INSERT INTO events (kind, detail, created) VALUES (?, ?, ?)",
                       (kind, scrub(json.dumps(detail)), time.time()))

    def last_event(self) -> str | None:
        found = self.db.query("SELECT kind FROM events ORDER BY id DESC LIMIT 1")
        return found[0][0] if found else None

    def events(self, kind: str | None = None) -> list[tuple[str, dict[str, Any], float]]:
        sql = "SELECT id, kind, detail, created FROM events" + (" WHERE kind = ?" if kind else "") + " ORDER BY id"
        events = []
        for eid, *row in self.db.query(sql, (kind,) if kind else ()):
            try:
                events.append(rows.event(*row))
            except RowError as exc:
                raise self.db.bad_row("events", eid, str(exc)) from None
        return events

    # -- reflector calls --------------------------------------------------------------------

    def record_call(self, call: CallRecord) -> None:
        with self.db.transaction() as db:
            db.execute(
                "INSERT INTO reflector_calls (kind, candidate, parents, generation, attempt, prompt_tokens, "
                "completion_tokens, latency, verdict, created) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (call.kind, call.candidate, json.dumps(list(call.parents)), call.generation, call.attempt,
                 call.prompt_tokens, call.completion_tokens, call.latency, scrub(call.outcome), time.time()))

    def reflector_tokens(self) -> tuple[int, int, int]:
        """(calls, prompt tokens, completion tokens) over the whole run; a count that is no
        integer in [0, 2^53) is refused (a negative one once took a run past its budget)."""
        bad = self.db.query(
            "SELECT id, prompt_tokens, completion_tokens FROM reflector_calls WHERE typeof(prompt_tokens) != 'integer' "
            "OR typeof(completion_tokens) != 'integer' OR min(prompt_tokens, completion_tokens) < 0 "
            "OR max(prompt_tokens, completion_tokens) >= ? LIMIT 1", (MAX_TOKENS,))
        if bad:
            cid, prompt, completion = bad[0]
            name, value = ("prompt_tokens", prompt) if as_count(prompt, MAX_TOKENS) is None else \
                ("completion_tokens", completion)
            raise self.db.bad_row("reflector_calls", cid, f"{name} is {shown(value)}, not an integer in [0, 2^53)")
        calls, prompt, completion = self.db.query(
            "SELECT count(*), coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0) "
            "FROM reflector_calls")[0]
        return int(calls), int(prompt), int(completion)

    def reflector_seconds(self) -> float:
        return float(self.db.query("SELECT coalesce(sum(latency), 0) FROM reflector_calls")[0][0])

    def reply_tally(self, after: int = 0) -> ReplyTally:
        newest, calls, accepted = self.db.query(
            "SELECT coalesce(max(id), ?), count(*), coalesce(sum(verdict = 'accepted'), 0) FROM reflector_calls "
            "WHERE id > ?", (after, after))[0]
        rejected = self.db.query("SELECT verdict FROM reflector_calls WHERE id > ? AND verdict != 'accepted' "
                                 "ORDER BY id DESC LIMIT 1", (after,))
        return ReplyTally(int(newest), int(calls), int(accepted),
                          rejected[0][0].removeprefix("rejected: ") if rejected else "")

    def calls_about(self, cid: int) -> list[CallRecord]:
        found = self.db.query("SELECT id, kind, candidate, parents, generation, attempt, prompt_tokens, "
                              "completion_tokens, latency, verdict FROM reflector_calls WHERE candidate = ? "
                              "ORDER BY id", (cid,))
        calls = []
        for i, k, c, p, g, a, pt, ct, lat, v in found:
            try:
                calls.append(CallRecord(k, c, rows.ids("parents", p), g, a, pt, ct, lat, v))
            except RowError as exc:
                raise self.db.bad_row("reflector_calls", i, str(exc)) from None
        return calls
