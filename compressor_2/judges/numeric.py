"""The offline, deterministic judge: compare the figures (or the yes/no) of answer and gold.

Rules, in order (docs/judges.md has them in full, with calibration figures):
1. A refusal ("I cannot determine...", "please provide the figures") is incorrect.
2. A gold that starts with yes/no: the answer's leading or plainly stated yes/no,
   else the polarity of a first sentence that restates the question.
3. A gold with figures: every gold figure must appear among the answer's figures
   (for a bare-figure gold, those of the answer's conclusion), at the gold's
   precision or within the relative tolerance. Figures are read with `$`, thousands
   separators, parenthesised negatives, thousand/million/billion/trillion scales,
   and percentages, which also match the same value as a fraction (1.9% == 0.019).
   Signs are ignored because answers often carry them in words ("a decrease of 0.2%").
4. A prose gold (no figure, no yes/no): at least half of its key terms must appear in
   the answer. This is a weak proxy; the llm or hybrid judge is the right tool there.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from compressor_2.judges.base import JudgeItem, Verdict

GoldKind = Literal["figure", "yes_no", "figures_in_prose", "prose"]

_SCALES = {
    "thousand": 1e3, "k": 1e3,
    "million": 1e6, "millions": 1e6, "mn": 1e6, "mm": 1e6, "m": 1e6,
    "billion": 1e9, "billions": 1e9, "bn": 1e9, "b": 1e9,
    "trillion": 1e12, "tn": 1e12,
}
# A number with its optional sign, parenthesis, currency, percent and scale. The
# lookarounds keep ids and dates out: FY2022, Q2, 10-K, 3M's.
_FIGURE = re.compile(
    r"""
    (?<![\w.,])
    (?P<open>\()?
    (?P<minus>[-−–])?
    (?P<cur>[$€£])?\s?(?P<open2>\()?
    (?P<minus2>[-−–])?
    (?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)
    (?![\d]|[.,]\d|-[A-Za-z])
    (?P<close1>\))?
    (?:
        \s?(?P<pct>%|percent(?:age\spoints?)?\b|per\s?cent\b|pp\b|p\.p\.)
      | \s?(?P<word>thousand|millions?|billions?|trillion)\b
      | \s?(?P<abbr>mn|mm|bn|tn)\b
      | \s?(?P<letter>[kmb])\b
    )?
    (?P<close>\))?
    """,
    re.VERBOSE | re.IGNORECASE,
)
_YEAR = re.compile(r"(19|20)\d\d")
_MONTH_BEFORE = re.compile(
    r"\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?\s+\(?$", re.IGNORECASE
)
# "No information was given" opens a refusal, not a "no".
_YES_NO = re.compile(
    r"\W*(yes|no)\b(?!\s+(?:information|data|evidence|mention|details?|indication|specific|explicit|direct)\b)",
    re.IGNORECASE,
)
_STATED_YES_NO = re.compile(
    r"(?:answer(?: to (?:the|your|this) question)? is|^|[.:\n]\s*|in (?:summary|conclusion),?\s*"
    r"|so,?\s*|therefore,?\s*)\s*[\"'*]*(yes|no)\b[\"'*]*(?:[,.;:!]|\s*-|$)",
    re.IGNORECASE | re.MULTILINE,
)
MIN_RESTATED_TERMS = 2
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n")
_NEGATION = re.compile(
    r"\b(?:not|no|never|neither|nor|none|cannot|without|lack|lacks)\b|n't\b", re.IGNORECASE
)
# Declining to answer: anywhere in the answer ...
_REFUSAL = re.compile(
    r"""
      ^\W*(?:I'm\ssorry|I\sam\ssorry|I\sapologi[sz]e|Sorry)\b
    | \bI\s(?:cannot|can\s?not|can't|am\sunable\sto|'m\sunable\sto|was\sunable\sto)\s
          (?:determine|calculate|compute|provide|answer|find|locate|give|confirm|access|browse)
    | \bI\s(?:do\snot|don't)\s(?:have\s(?:access|real-time|direct|the\s(?:specific|necessary|required|exact|actual|data|financial))
                            |know\b|see\s(?:any|enough))
    | \bas\san\sAI\b
    | \b(?:is|are)\snot\s(?:possible|enough\sinformation)\sto\s(?:directly\s)?(?:determine|calculate|answer|compute)
    | \b(?:insufficient|not\senough)\s(?:information|data|details)\sto\b
    | \bplease\sprovide\s(?:the|me|more|additional|relevant|that)
    | \bif\syou\s(?:can\s|could\s)?provide\s(?:me\swith\s)?the
    | \byou\s(?:haven't|have\snot)\sprovided
    """,
    re.VERBOSE | re.IGNORECASE,
)
# ... or, for hedges that correct answers also use about a detail, in the first sentence.
_REFUSAL_OPENING = re.compile(
    r"""
      \b(?:information|context|filing|evidence|data|document|text|excerpts?)(?:\sprovided|\sgiven)?\s
          (?:does|do)\snot\s(?:explicitly\s|specifically\s)?(?:contain|provide|include|mention|state|specify|have)\b
    | \bthere\sis\sno\s(?:explicit|specific|direct)\s(?:information|mention|evidence|data)
    | ^\W*no\s(?:information|data|evidence|mention|details?|indication)\b
    | \bcannot\sbe\s(?:directly\s)?(?:determined|calculated|computed|answered)\b
    """,
    re.VERBOSE | re.IGNORECASE,
)
_CONCLUSION = re.compile(
    r"\b(?:therefore|thus|hence|in summary|in conclusion|to summarize|to conclude|"
    r"(?:the|final|my) answer is|final answer)\b",
    re.IGNORECASE,
)
_WORD = re.compile(r"[a-z][a-z&'-]+")
_STOPWORDS = frozenset("""
    the a an and or of in on at to for from by with as is are was were be been being it its
    this that these those there their they them which who whom what when where why how than
    then so such not no yes but if into over under about after before between during per
    has have had do does did will would can could should may might also any all each more
    most other some only same very company's company fy year years fiscal total
""".split())


@dataclass(frozen=True)
class Figure:
    value: float  # as written, sign applied, scale not applied
    decimals: int  # digits after the decimal point as written
    percent: bool
    currency: bool
    scale: float  # 1e6 for "million", 1 when none
    text: str


def extract_figures(text: str) -> list[Figure]:
    """Every figure in `text`, skipping what only looks like one: bare years (2019),
    days of dates (January 28), list markers ("(1)", "2)") and "3M"."""
    return [figure for _, figure in _placed_figures(text)]


def figure_spans(text: str) -> list[tuple[int, int]]:
    """Where in `text` each of `extract_figures`' figures stands: (start, end) character offsets."""
    return [span for span, _ in _placed_figures(text)]


def _placed_figures(text: str) -> list[tuple[tuple[int, int], Figure]]:
    figures = []
    for m in _FIGURE.finditer(text):
        digits = m["num"].replace(",", "")
        if m["letter"] and not m["cur"]:
            continue  # "3M" is a company, "$3M" is three million
        scale_word = (m["word"] or m["abbr"] or m["letter"] or "").lower()
        plain = not (m["cur"] or m["pct"] or scale_word or m["minus"] or m["minus2"])
        # Years are never written with a thousands separator: "2,070" is a count.
        if plain and ((_YEAR.fullmatch(m["num"])) or _MONTH_BEFORE.search(text, 0, m.start())):
            continue
        if plain and (m["close1"] or m["close"]) and digits.isdigit() and len(digits) == 1:
            continue
        bracketed = bool((m["open"] or m["open2"]) and (m["close"] or m["close1"]))
        negative = bool(m["minus"] or m["minus2"] or bracketed)
        value = float(digits) * (-1 if negative else 1)
        decimals = len(digits.partition(".")[2])
        text = m.group(0).strip() if bracketed else m.group(0).strip("() ")
        figures.append((m.span(), Figure(value, decimals, bool(m["pct"]), bool(m["cur"]),
                                         _SCALES.get(scale_word, 1.0), text)))
    return figures


def _amount_readings(figure: Figure) -> list[tuple[float, int]]:
    """An amount as written and, when its size is known (a scale word, or a bare
    "$381,603,000"), in thousands, millions and billions: golds such as "$1577.00"
    are in the unit the question asked for, which the answer may spell differently."""
    value = abs(figure.value)
    out = [(value, figure.decimals)]
    if figure.scale != 1.0 or value >= 1e6:
        for unit in (1.0, 1e3, 1e6, 1e9):
            shift = round(math.log10(figure.scale / unit))
            if shift:
                out.append((value * figure.scale / unit, figure.decimals - shift))
    return out


def _pairs(answer: Figure, gold: Figure) -> Iterable[tuple[float, float, int]]:
    """(answer value, gold value, gold decimals) readings that may be compared.
    Percentages meet percentages or fractions (1.9% == 0.019), never money amounts,
    so "$396 million" cannot pass for 39.7%. Signs are dropped (see the module doc)."""
    a, g = abs(answer.value), abs(gold.value)
    if gold.percent:
        if answer.percent:
            yield a, g, gold.decimals
        elif answer.scale == 1.0:
            yield a, g / 100, gold.decimals + 2
    elif answer.percent:
        if gold.scale == 1.0 and not gold.currency:
            yield a / 100, g, gold.decimals
    else:
        for av, _ in _amount_readings(answer):
            for gv, decimals in _amount_readings(gold):
                yield av, gv, decimals


def figure_matches(answer: Figure, gold: Figure, tolerance: float) -> bool:
    """Same value at the gold's precision, or within `tolerance` (relative)."""
    for a, g, decimals in _pairs(answer, gold):
        if math.isclose(round(a, decimals), g, rel_tol=1e-9, abs_tol=1e-12):
            return True
        if abs(a - g) <= tolerance * g + 1e-12:
            return True
    return False


def conclusion_figures(answer: str) -> tuple[list[Figure], str]:
    """The figures after the answer's last conclusion marker ("Therefore", "In summary",
    "the answer is") when that part has any, else all of the answer's figures: an
    intermediate step that happens to equal the gold is not the answer. Also says
    which part was read."""
    markers = list(_CONCLUSION.finditer(answer))
    if markers:
        tail = extract_figures(answer[markers[-1].start():])
        if tail:
            return tail, f"the answer's conclusion ('{markers[-1].group(0)}...')"
    return extract_figures(answer), "the answer"


def is_refusal(answer: str) -> bool:
    first = _SENTENCE_END.split(answer.strip(), maxsplit=1)[0]
    return _REFUSAL.search(answer) is not None or _REFUSAL_OPENING.search(first) is not None


def leading_yes_no(text: str) -> str | None:
    m = _YES_NO.match(text)
    return m.group(1).lower() if m else None


def stated_yes_no(answer: str) -> str | None:
    """The answer's yes/no: its first word, else the first plainly stated one."""
    lead = leading_yes_no(answer)
    if lead:
        return lead
    m = _STATED_YES_NO.search(answer)
    return m.group(1).lower() if m else None


def implied_yes_no(answer: str, question: str) -> str | None:
    """For answers that restate the question instead of saying yes or no ("PepsiCo
    has not reported any material legal battles"): a negation in the first sentence
    reads as no, its absence as yes. None when that sentence does not restate the
    question (shares fewer than two key terms with it)."""
    first = _SENTENCE_END.split(answer.strip(), maxsplit=1)[0]
    shared = set(key_terms(first)) & set(key_terms(question))
    if len(shared) < MIN_RESTATED_TERMS:
        return None
    return "no" if _NEGATION.search(first) else "yes"


def gold_kind(gold: str) -> GoldKind:
    """figure: the gold is a bare figure ("$1577.00", "1.9%", "$400,000,000 increase.");
    yes_no: it starts with yes/no; figures_in_prose: a sentence carrying figures; prose."""
    if leading_yes_no(gold):
        return "yes_no"
    figures = extract_figures(gold)
    if not figures:
        return "prose"
    rest = gold
    for figure in figures:
        rest = rest.replace(figure.text, " ")
    return "figure" if len(key_terms(rest)) <= 1 else "figures_in_prose"


def key_terms(text: str) -> list[str]:
    words = (w.strip("'-") for w in _WORD.findall(text.lower()))
    return list(dict.fromkeys(w for w in words if len(w) > 2 and w not in _STOPWORDS))


def _term_found(term: str, answer_words: set[str]) -> bool:
    # Prefix match on a stem-like head so "decline" finds "declined" or "declining".
    head = term[: max(4, len(term) - 3)]
    return any(word.startswith(head) for word in answer_words)


@dataclass(frozen=True)
class NumericJudge:
    tolerance: float = 0.01
    min_term_overlap: float = 0.5

    def judge(self, items: Sequence[JudgeItem]) -> list[Verdict]:
        return [self.judge_one(item) for item in items]

    def judge_one(self, item: JudgeItem) -> Verdict:
        answer, gold = item.answer.strip(), item.gold.strip()
        if not answer:
            return Verdict(False, "empty answer")
        if is_refusal(answer):
            return Verdict(False, "the answer declines to answer (refusal)")
        kind = gold_kind(gold)
        if kind == "yes_no":
            return self._yes_no(answer, gold, item.question)
        if kind == "prose":
            return self._prose(answer, gold)
        return self._figures(answer, gold, kind)

    def _yes_no(self, answer: str, gold: str, question: str) -> Verdict:
        expected = leading_yes_no(gold)
        said = stated_yes_no(answer)
        if said is not None:
            return Verdict(said == expected, f"gold is '{expected}', the answer says '{said}'")
        implied = implied_yes_no(answer, question)
        if implied is None:
            return Verdict(False, f"gold is '{expected}' but the answer states no yes/no "
                                  "and its first sentence does not restate the question")
        return Verdict(implied == expected, f"gold is '{expected}'; the answer states no yes/no, "
                                            f"its first sentence implies '{implied}'")

    def missing_figures(self, answer: str, gold: str) -> list[Figure]:
        """The gold's figures that `answer` lacks, read as the judge reads them (none for a
        yes/no or prose gold)."""
        kind = gold_kind(gold.strip())
        if kind not in ("figure", "figures_in_prose"):
            return []
        return self._missing(extract_figures(gold.strip()), self._found(answer.strip(), kind)[0])

    def _found(self, answer: str, kind: GoldKind) -> tuple[list[Figure], str]:
        # A bare-figure gold asks for one result, which worked answers state last; a
        # sentence with several figures may be answered anywhere in the text.
        if kind == "figure":
            return conclusion_figures(answer)
        return extract_figures(answer), "the answer"

    def _missing(self, wanted: list[Figure], found: list[Figure]) -> list[Figure]:
        return [g for g in wanted if not any(figure_matches(a, g, self.tolerance) for a in found)]

    def _figures(self, answer: str, gold: str, kind: GoldKind) -> Verdict:
        wanted = extract_figures(gold)
        found, where = self._found(answer, kind)
        if not found:
            return Verdict(False, f"gold {_show(wanted)}; the answer has no figure")
        rule = f"at the gold's precision or within {self.tolerance:.1%}"
        missing = self._missing(wanted, found)
        if missing:
            more = " ..." if len(found) > 8 else ""
            return Verdict(False, f"gold {_show(wanted)}: {_show(missing)} not among the figures of "
                                  f"{where} ({_show(found[:8])}{more}), {rule}")
        return Verdict(True, f"gold {_show(wanted)} found in {where}, {rule}")

    def _prose(self, answer: str, gold: str) -> Verdict:
        terms = key_terms(gold)
        if not terms:
            return Verdict(False, "gold has no figure, yes/no or key term to compare")
        answer_words = set(_WORD.findall(answer.lower()))
        hits = [t for t in terms if _term_found(t, answer_words)]
        share = len(hits) / len(terms)
        verdict = share >= self.min_term_overlap
        return Verdict(
            verdict,
            f"prose gold: {len(hits)}/{len(terms)} key terms found ({share:.0%}, "
            f"needs {self.min_term_overlap:.0%}); missing: {', '.join(_missing(terms, hits)) or 'none'}",
        )


def _missing(terms: Iterable[str], hits: Iterable[str]) -> list[str]:
    found = set(hits)
    return [t for t in terms if t not in found][:6]


def _show(figures: Iterable[Figure]) -> str:
    return ", ".join(f.text for f in figures) or "(none)"
