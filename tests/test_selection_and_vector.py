"""LLM-driven selection and full-vector mutation inside the GA: the
prompts and schemas, the validation and fallback, the local stand-ins, and runs against
the real stack (a fake OpenAI-compatible server, then the local reflector with resume)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from compressor_2.clusters.tokens import AnswerTokens
from compressor_2.commands.evolve import evolve
from compressor_2.fitness import Evaluation, Record
from compressor_2.reflector.base import PopulationMember, Reply, SelectionRequest, Usage, VectorRequest
from compressor_2.reflector.local import VECTOR_MOVES, LocalProposer
from compressor_2.reflector.prompts import (
    SELECTION_SCHEMA,
    SELECTION_SYSTEM,
    SELECTION_USER,
    VECTOR_SYSTEM,
    VECTOR_USER,
    selection_messages,
    vector_messages,
    vector_schema,
)
from compressor_2.reflector.validation import InvalidOutput, ValidatingReflector, parse_selection, parse_vector
from compressor_2.strategies.ga.individual import _apply_vector
from compressor_2.strategies.individual import new_individual
from compressor_2.strategies.operators import append_summary
from tests.conftest import REPO
from tests.fakes.openai_server import FakeOpenAIServer, chat_completion
from tests.test_evolution_support import config_for, read_json, whole_and_resumed

SEED_001 = REPO.parent / "shared" / "seeds" / "001_b8e77b1b197564a1.txt"
DESCRIPTIONS = {"0": {"description": "EOS"}, "1": {"description": "numbers"}, "2": {"description": "words"}}


def member(cid: int, fitness: float, deltas: tuple[float, float, float], parent_fitness: float | None = None,
           tokens: float = 10.0, correctness: float = 0.5) -> PopulationMember:
    return PopulationMember(cid, fitness, tokens, correctness, dict(zip("012", deltas)), "g1: note " * 60,
                            "mutation" if parent_fitness is not None else "initial",
                            (cid - 1,) if parent_fitness is not None else (), parent_fitness)


MEMBERS = (
    member(11, 0.70, (0.0, 0.0, 0.0)),
    member(12, 0.80, (1.0, 0.0, 0.0), parent_fitness=0.79),
    member(13, 0.75, (1.0, 3.0, -3.0)),
    member(14, 0.76, (1.2, 0.1, 0.0), parent_fitness=0.70),
    member(15, 0.60, (0.0, 9.0, 9.0), parent_fitness=0.50),
)


def reply(obj: object) -> Reply:
    return Reply(obj if isinstance(obj, str) else json.dumps(obj), Usage(1, 10, 2))


# -- prompts and schemas ------------------------------------------------------------------

def _seed_block(text: str, after: str) -> str:
    start = text.index("```", text.index(after)) + 3
    return text[start:text.index("```", start)].strip()


@pytest.mark.skipif(not SEED_001.is_file(), reason=f"seed 001 not found at {SEED_001} (only in the dev workspace)")
def test_the_vector_templates_are_seed_001_verbatim():
    text = SEED_001.read_text(encoding="utf-8")
    assert VECTOR_SYSTEM == _seed_block(text, "**System message:**")
    seed_user = re.sub(r"\{\{ (\w+) \}\}", r"{\1}", _seed_block(text, "**User message"))
    assert VECTOR_USER == seed_user


def test_vector_messages_and_schema():
    request = VectorRequest(2, 0, {"0": 1.0, "1": 0.0, "2": -1.0}, "", 0.5,
                            [Record("q0", "Q?", "The answer is 4.", "4", 5, True, "matches")])
    system, user = vector_messages(request, DESCRIPTIONS, 100)
    assert system["content"] == VECTOR_SYSTEM
    assert "## Evolving summary" in user["content"] and "\nFirst iteration; no prior learnings.\n" in user["content"]
    assert '"2": -1.0' in user["content"] and "### Example 1 of 1: id q0" in user["content"]
    schema = vector_schema(["0", "1", "2"])
    assert schema["properties"]["deltas"]["required"] == ["0", "1", "2"]
    assert schema["properties"]["deltas"]["additionalProperties"] is False
    assert schema["required"] == ["deltas", "summary"] and schema["additionalProperties"] is False


def test_the_selection_request_shows_every_member_sorted_by_fitness():
    system, user = selection_messages(SelectionRequest(4, MEMBERS))
    assert system["content"] == SELECTION_SYSTEM
    content = user["content"]
    assert content.startswith("Generation 4 is evaluated. 5 candidates.")
    order = [int(m) for m in re.findall(r"\*\*candidate (\d+)\*\*", content)]
    assert order == [12, 14, 13, 11, 15]
    assert "made by: mutation of candidate 13 (fittest parent: 0.7000)" in content
    assert content.count("[...]") == 5  # the first part of each scratchpad
    for words in ("**Performance**", "**Diversity**", "**Potential**", "Balance performance with diversity"):
        assert words in content
    assert content.endswith(SELECTION_USER.split("{results}")[1])
    assert SELECTION_SCHEMA["properties"]["selections"]["items"]["properties"]["category"]["enum"] == [
        "performance", "diversity", "potential"]


# -- validation ---------------------------------------------------------------------------

@pytest.mark.parametrize(("content", "message"), [
    ("not json", "not JSON"),
    ({"selections": [{"candidate_id": 11, "reasoning": "r", "category": "performance"}], "summary": ""},
     "1 selections, not 2 to 5"),
    ({"selections": [{"candidate_id": i, "reasoning": "r", "category": "diversity"} for i in range(11, 17)],
      "summary": ""}, "6 selections"),
    ({"selections": [{"candidate_id": 11, "reasoning": "r", "category": "performance"},
                     {"candidate_id": 99, "reasoning": "r", "category": "diversity"}], "summary": ""},
     "candidate_id 99 is not in this population"),
    ({"selections": [{"candidate_id": 11, "reasoning": "r", "category": "performance"},
                     {"candidate_id": 12, "reasoning": "r", "category": "luck"}], "summary": ""},
     "category 'luck'"),
    ({"selections": [{"candidate_id": 11, "reasoning": "r", "category": "performance"},
                     {"candidate_id": 11, "reasoning": "r", "category": "diversity"}], "summary": ""},
     "selected twice"),
])
def test_an_invalid_selection_says_why(content, message):
    with pytest.raises(InvalidOutput, match=message):
        parse_selection(reply(content), {m.candidate_id for m in MEMBERS})


@pytest.mark.parametrize(("content", "message"), [
    ({"deltas": {"0": 1.0, "1": 2.0}, "summary": "s"}, "wrong cluster ids .*missing: \\['2'\\]"),
    ({"deltas": {"0": 1.0, "1": 2.0, "2": 0.0, "3": 1.0}, "summary": "s"}, "unknown: \\['3'\\]"),
    ({"deltas": {"0": 1.0, "1": "NaN", "2": 0.0}, "summary": "s"}, "cluster 1 is 'NaN'"),
    ({"deltas": {"0": 1.0, "1": 0.0, "2": -1.0}, "summary": "s"}, "equal the current ones"),
    ({"deltas": {"0": 2.0, "1": 0.0, "2": -1.0}}, "summary is None"),
])
def test_an_invalid_vector_says_why(content, message):
    with pytest.raises(InvalidOutput, match=message):
        parse_vector(reply(content), {"0": 1.0, "1": 0.0, "2": -1.0})


class Scripted:
    name = "scripted"

    def __init__(self, replies: list[object]) -> None:
        self.replies = list(replies)

    def selection(self, request, messages, attempt):
        return reply(self.replies.pop(0))

    vector_mutation = selection

    def close(self) -> None:
        pass


def test_a_selection_is_retried_once_then_given_up():
    good = {"selections": [{"candidate_id": 12, "reasoning": "best", "category": "performance"},
                           {"candidate_id": 15, "reasoning": "far", "category": "diversity"}], "summary": "ok"}
    retried = ValidatingReflector(Scripted(["no", good]), DESCRIPTIONS, 100).select(SelectionRequest(0, MEMBERS))
    assert (retried.attempts, [s.candidate_id for s in retried.selections], retried.summary) == (2, [12, 15], "ok")
    failed = ValidatingReflector(Scripted(["no", "still no"]), DESCRIPTIONS, 100).select(SelectionRequest(0, MEMBERS))
    assert failed.selections == () and failed.attempts == 2 and len(failed.rejected) == 2


# -- the local stand-ins ------------------------------------------------------------------

def test_the_local_selector_picks_by_its_rules_with_numbers():
    proposer = LocalProposer(AnswerTokens(None, np.zeros(1, dtype=np.int64), 3), 1.0, seed=7)
    reflector = ValidatingReflector(proposer, DESCRIPTIONS, 100)
    result = reflector.select(SelectionRequest(3, MEMBERS))
    picks = [(s.candidate_id, s.category) for s in result.selections]
    # performance: 12 (0.80); better half: 12, 14, 13; farthest from 12's deltas: 13;
    # potential: the largest gain over a parent among the rest: 15 (+0.10) beats 14 (+0.06).
    assert picks == [(12, "performance"), (13, "diversity"), (15, "potential")]
    assert "fitness 0.8000" in result.selections[0].reasoning
    assert "distance 4.2426" in result.selections[1].reasoning
    assert "0.5000 -> 0.6000" in result.selections[2].reasoning
    assert reflector.select(SelectionRequest(3, MEMBERS)) == result  # deterministic


def test_local_vector_mutation_moves_several_clusters_and_the_summary_is_appended(tiny_model_dir: Path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    clusters = np.arange(len(tokenizer), dtype=np.int64) % 3
    reflector = ValidatingReflector(LocalProposer(AnswerTokens(tokenizer, clusters, 3), 1.0, seed=7), DESCRIPTIONS, 100)
    records = [Record(f"q{i}", "Q?", answer, "42", tokens, correct, "judge")
               for i, (answer, tokens, correct) in enumerate([("Revenue was 42 million in total.", 9, True),
                                                              ("No", 1, False), ("The answer is 41", 5, False)])]
    ind = new_individual([0.0, 0.0, 0.0], "earlier notes", candidate_id=7)
    ind.fitness.values = (0.5,)
    ind.evaluation = Evaluation(tuple(ind), tuple(records), 5.0, 1 / 3, 0.5, 0.5, (0.5,) * 3)
    request = VectorRequest(2, 0, {"0": 0.0, "1": 0.0, "2": 0.0}, ind.scratchpad, 0.5, records, 7)
    result = _apply_vector(ind, request, reflector)
    assert result.changed and sum(v != 0.0 for v in ind) == VECTOR_MOVES
    assert ind.scratchpad == append_summary("earlier notes", result.summary)
    assert result.summary.count("g2: moved cluster") == VECTOR_MOVES
    assert ind.candidate_id is None and not ind.fitness.valid  # a new genome
    assert reflector.mutate_vector(request) == result  # deterministic


# -- runs ---------------------------------------------------------------------------------


LLM_AND_VECTOR = {"SELECTION": '"llm"', "SELECTION_FALLBACK": '"tournament"', "MUTATION_SCOPE": '"vector"'}


def template_pattern(template: str) -> re.Pattern[str]:
    """The template with each {placeholder} free: what a substituted message must match."""
    parts = re.split(r"\{\w+\}", template)
    return re.compile("(?s)" + "(.*)".join(map(re.escape, parts)))


@pytest.mark.slow
def test_selection_and_vector_calls_against_the_fake_server(tmp_path, shared, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("C2_TEST_REFLECTOR_KEY", "sk-g")
    script = {0: ["valid"], 1: ["not json", "unknown id"], 2: ["bad category", "valid"]}
    problems: list[str] = []

    def answer(body: dict) -> tuple[int, object]:
        fmt = body["response_format"]["json_schema"]
        system, user = (m["content"] for m in body["messages"])
        if fmt["name"] == "reflector_selection":
            if fmt["schema"] != SELECTION_SCHEMA or system != SELECTION_SYSTEM or not fmt["strict"]:
                problems.append("selection request")
            g = int(re.match(r"Generation (\d+) is evaluated", user).group(1))
            ids = [int(i) for i in re.findall(r"\*\*candidate (\d+)\*\*", user)]
            kind = script[g].pop(0)
            picks = {"valid": [{"candidate_id": ids[0], "reasoning": "fittest", "category": "performance"},
                               {"candidate_id": ids[-1], "reasoning": "different", "category": "diversity"}],
                     "unknown id": [{"candidate_id": 10_000, "reasoning": "?", "category": "performance"},
                                    {"candidate_id": ids[0], "reasoning": "fittest", "category": "performance"}],
                     "bad category": [{"candidate_id": ids[0], "reasoning": "?", "category": "luck"},
                                      {"candidate_id": ids[1], "reasoning": "?", "category": "potential"}]}
            if kind == "not json":
                return 200, chat_completion("selections: 3, 5")
            return 200, chat_completion(json.dumps({"selections": picks[kind], "summary": f"gen {g}: {kind}"}))
        if fmt["name"] == "reflector_vector":
            ids = fmt["schema"]["properties"]["deltas"]["required"]
            if (fmt["schema"] != vector_schema(ids) or system != VECTOR_SYSTEM
                    or not template_pattern(VECTOR_USER).fullmatch(user)):
                problems.append("vector request")
            current = json.loads(user.split("(baseline to adjust from)\n")[1].split("\n\n## Evolving")[0])
            new = {cid: round(v + 0.5 * (i % 2 * 2 - 1), 4) for i, (cid, v) in enumerate(current.items())}
            return 200, chat_completion(json.dumps({"deltas": new, "summary": "moved every cluster"}))
        return 200, chat_completion('{"scratchpad": "merged"}')

    with FakeOpenAIServer(answer) as server:
        config = config_for(tmp_path, shared, tiny_model_dir, NGEN="3", REFLECTOR_OPENAI="y",
                            REFLECTOR_BASE_URL=f'"{server.base_url}"', REFLECTOR_API_KEY_ENV='"C2_TEST_REFLECTOR_KEY"',
                            REFLECTOR_MAX_RETRIES="0", MUTPB='"1"', **LLM_AND_VECTOR)
        evolve(config)
    assert problems == [] and all(not steps for steps in script.values())
    out = config.output_dir
    history = read_json(out / "history.json")
    first, fallen, retried = (history[g]["selection"] for g in range(3))
    assert first["fallback"] is None and first["summary"] == "gen 0: valid"
    assert [s["category"] for s in first["selections"]] == ["performance", "diversity"]
    assert "not JSON" in fallen["fallback"] and "candidate_id 10000 is not in this population" in fallen["fallback"]
    assert all(s["reasoning"].startswith("auto-selected: ") for s in fallen["selections"])
    assert retried["fallback"] is None and retried["summary"] == "gen 2: valid"
    prompts = out / "reflector_prompts"
    assert sorted(p.name for p in prompts.glob("gen_*_selection_*")) == [
        "gen_0_selection_attempt1.txt", "gen_1_selection_attempt1.txt", "gen_1_selection_attempt2.txt",
        "gen_2_selection_attempt1.txt", "gen_2_selection_attempt2.txt"]
    assert "verdict =====\nrejected: category 'luck'" in (prompts / "gen_2_selection_attempt1.txt").read_text()
    # Every mutation was a full vector; the summary went onto the scratchpad.
    assert sum(h["mutations"] for h in history) == len(list(prompts.glob("gen_*_vector_mutation_*attempt1.txt"))) > 0
    state = read_json(out / "evolution_state.json")
    assert any(m["scratchpad"].endswith("moved every cluster") for m in state["population"])
    # The selected nodes are marked in the tree, with their category.
    tree = read_json(out / "tree.json")
    marked = {(n["id"], n["selected"]) for n in tree["nodes"] if "selected" in n}
    assert {label for label, _ in marked} >= {f"g0_pop{i}" for i in (0,)} and len(marked) >= 6


@pytest.mark.slow
def test_local_selection_and_vector_mutation_resume_to_the_uninterrupted_run(tmp_path, shared, tiny_model_dir):
    whole, split = whole_and_resumed(tmp_path, shared, tiny_model_dir, LLM_AND_VECTOR, {"NGEN": "2"})
    for name in ("evolution_state.json", "history.json"):
        a, b = read_json(whole / name), read_json(split / name)
        if name == "history.json":
            for h in a + b:
                h.pop("seconds")
        assert a == b, name
    history = read_json(whole / "history.json")
    assert all(h["selection"]["fallback"] is None for h in history[:-1])
    assert {s["category"] for h in history[:-1] for s in h["selection"]["selections"]} >= {"performance",
                                                                                             "diversity"}
    assert read_json(whole / "tree.json")["nodes"] == read_json(split / "tree.json")["nodes"]
