"""The synthetic FinanceBench-shaped task the embedded demo model is trained and evolved on.

Each question comes with one evidence page: a fictional company's selected financial
data for one fiscal year, several line items with values and one disclosure
answered Yes or No. The gold answer is copied from that page in FinanceBench's formats
(`$1,577 million`, `1.9%`, `1.33`, `Yes`). Four kinds, so brevity has a price on each:
one figure; two figures and three figures (stopping after the first is wrong); a yes/no
about a disclosure, whose verdict the page states. Yes/no verdicts alternate, so every
split holds as many Yes as No and a constant verdict earns exactly half.

    python -m compressor_2.demo.task --out compressor_2/demo/data
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from compressor_2.common import atomic_write_text

SINGLE, TWO, THREE, YES_NO = "single-figure", "two-figures", "three-figures", "yes-no"
KINDS = (SINGLE, TWO, THREE, YES_NO)
FIGURES_ASKED = {SINGLE: 1, TWO: 2, THREE: 3}
DATA_DIR = Path(__file__).resolve().parent / "data"
TRAIN_SEED, HELDOUT_SEED = 1, 2
# Multiples of 8: every kind equally often, and as many Yes as No among the yes/no.
TRAIN_SIZE, HELDOUT_SIZE = 64, 200


def _money(value: float) -> str:
    return f"${value:,.0f} million"


def _percent(value: float) -> str:
    return f"{value:.1f}%"


def _ratio(value: float) -> str:
    return f"{value:.2f}"


def _per_share(value: float) -> str:
    return f"${value:.2f}"


def _count(value: float) -> str:
    return f"{value:,.0f}"


@dataclass(frozen=True)
class LineItem:
    name: str
    fmt: Callable[[float], str]
    low: float
    high: float
    step: float  # values are multiples of this
    log_scale: bool  # magnitudes spread over decades

    def sample(self, rng: random.Random) -> float:
        if self.log_scale:
            raw = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        else:
            raw = rng.uniform(self.low, self.high)
        return max(self.step, round(raw / self.step) * self.step)


LINE_ITEMS: tuple[LineItem, ...] = (
    LineItem("Revenue", _money, 800, 90_000, 1, True),
    LineItem("Cost of Sales", _money, 400, 60_000, 1, True),
    LineItem("Gross Profit", _money, 200, 40_000, 1, True),
    LineItem("Operating Income", _money, 50, 20_000, 1, True),
    LineItem("Net Income", _money, 20, 15_000, 1, True),
    LineItem("Capital Expenditure", _money, 20, 9_000, 1, True),
    LineItem("Total Assets", _money, 1_000, 150_000, 1, True),
    LineItem("Total Liabilities", _money, 500, 120_000, 1, True),
    LineItem("Cash and Cash Equivalents", _money, 50, 30_000, 1, True),
    LineItem("Research and Development Expense", _money, 10, 12_000, 1, True),
    LineItem("Depreciation and Amortization", _money, 20, 8_000, 1, True),
    LineItem("Dividends Paid", _money, 10, 6_000, 1, True),
    LineItem("Long-Term Debt", _money, 100, 50_000, 1, True),
    LineItem("Inventories", _money, 50, 20_000, 1, True),
    LineItem("Free Cash Flow", _money, 20, 15_000, 1, True),
    LineItem("Gross Margin", _percent, 12.0, 75.0, 0.1, False),
    LineItem("Operating Margin", _percent, 1.0, 40.0, 0.1, False),
    LineItem("Effective Tax Rate", _percent, 5.0, 35.0, 0.1, False),
    LineItem("Revenue Growth", _percent, 0.5, 30.0, 0.1, False),
    LineItem("Return on Equity", _percent, 2.0, 45.0, 0.1, False),
    LineItem("Current Ratio", _ratio, 0.40, 3.50, 0.01, False),
    LineItem("Debt-to-Equity Ratio", _ratio, 0.10, 4.00, 0.01, False),
    LineItem("Diluted Earnings per Share", _per_share, 0.20, 15.00, 0.01, True),
    LineItem("Number of Employees", _count, 500, 250_000, 10, True),
)

# Disclosures a page states as Yes or No; a yes/no question asks about one of them.
DISCLOSURES: tuple[str, ...] = (
    "Share Repurchases", "Goodwill Impairment", "Material Weakness", "Dividend Increase",
    "Debt Covenant Breach", "Stock Split", "Auditor Change", "Major Acquisition",
    "Restructuring Program", "Going Concern Warning",
)
LABELS: tuple[str, ...] = tuple(item.name for item in LINE_ITEMS) + DISCLOSURES

_PREFIXES = (
    "Northwind", "Bluestone", "Cedarline", "Halcyon", "Ironbridge", "Larkspur", "Meridian",
    "Oakhurst", "Pinecrest", "Quantera", "Redfield", "Silverlake", "Tidewater", "Umbra",
    "Vantage", "Westbrook", "Zephyr", "Amberly", "Brightwater", "Coralis", "Dunmore",
    "Evergreen", "Foxglove", "Granite", "Harbor", "Juniper", "Kestrel", "Lumen", "Maple",
    "Nimbus", "Orion", "Palisade", "Quarry", "Riverton", "Summit", "Trident", "Vireo",
)
_SUFFIXES = (
    "Industries", "Holdings", "Corp", "Group", "Systems", "Foods", "Energy", "Retail",
    "Logistics", "Pharmaceuticals", "Technologies", "Materials",
)
ITEMS_PER_PAGE = (4, 6)
# One disclosure a page: with two to four, the 15-minute model confused their lines and
# answered 72% of held-out yes/no questions right (82% with one to three).
DISCLOSURES_PER_PAGE = (1, 1)


@dataclass(frozen=True)
class Fact:
    item: str  # the line item's name, as printed on the page
    value: str  # the figure exactly as printed


@dataclass(frozen=True)
class DemoQuestion:
    """One question with everything needed to write it out or to phrase an answer."""

    id: str
    kind: str
    company: str
    year: int
    doc_name: str
    page_num: int
    page: str  # the whole evidence page
    asked: tuple[Fact, ...]  # the one to three facts the question is about
    question: str
    answer: str  # the gold, copied from the page ("Yes"/"No" for yes/no)

    def evidence_lines(self) -> str:
        return "\n".join(_line(fact) for fact in self.asked)

    def to_record(self) -> dict[str, object]:
        """The FinanceBench JSONL shape (fields as in financebench_open_source.jsonl)."""
        return {
            "financebench_id": self.id,
            "company": self.company,
            "doc_name": self.doc_name,
            "question_type": self.kind,
            "question_reasoning": "Information extraction",
            "question": self.question,
            "answer": self.answer,
            "justification": f"Copied from the selected financial data: {self.evidence_lines()}",
            "evidence": [{
                "evidence_text": self.evidence_lines(),
                "doc_name": self.doc_name,
                "evidence_page_num": self.page_num,
                "evidence_text_full_page": self.page,
            }],
        }


def _line(fact: Fact) -> str:
    # Indented, so an item's first word is the same token here as in the question
    # (" Net" rather than "Net"): the model finds the line by matching the question.
    return f"  {fact.item}: {fact.value}"


def _company(rng: random.Random) -> str:
    return f"{rng.choice(_PREFIXES)} {rng.choice(_SUFFIXES)}"


def _page(company: str, year: int, facts: list[Fact]) -> str:
    header = (
        f"{company}\nForm 10-K, fiscal year {year}\nSelected financial data (USD in millions)"
    )
    return header + "\n\n" + "\n".join(_line(fact) for fact in facts)


def possessive(name: str) -> str:
    return name + ("'" if name.endswith("s") else "'s")


_SINGLE_QUESTIONS = (
    "What was {company_s} {item} in FY{year}?",
    "What is the FY{year} {item} for {company}?",
    "According to {doc}, what was the {item} of {company}?",
    "What {item} did {company} report for fiscal year {year}?",
    "How much was {company_s} {item} in fiscal year {year}?",
)
_TWO_QUESTIONS = (
    "What were {company_s} {item} and {item2} in FY{year}?",
    "What did {company} report as {item} and as {item2} for FY{year}?",
    "In FY{year}, what were the {item} and the {item2} of {company}?",
    "According to {doc}, what were {company_s} {item} and {item2}?",
)
_THREE_QUESTIONS = (
    "What were {company_s} {item}, {item2} and {item3} in FY{year}?",
    "What did {company} report as {item}, {item2} and {item3} for FY{year}?",
    "In FY{year}, what were the {item}, the {item2} and the {item3} of {company}?",
    "According to {doc}, what were {company_s} {item}, {item2} and {item3}?",
)
_YES_NO_QUESTIONS = (
    "Did {company} report any {item} in FY{year}?",
    "According to {doc}, was there any {item} at {company}?",
    "Does {doc} disclose any {item} for {company}?",
    "Did {company_s} filing for fiscal year {year} disclose any {item}?",
)
_QUESTIONS = {SINGLE: _SINGLE_QUESTIONS, TWO: _TWO_QUESTIONS, THREE: _THREE_QUESTIONS,
              YES_NO: _YES_NO_QUESTIONS}
_SUFFIX = " Answer using the selected financial data."


def make_question(rng: random.Random, kind: str, qid: str, verdict: bool = True,
                  items_per_page: tuple[int, int] = ITEMS_PER_PAGE) -> DemoQuestion:
    """One question of `kind`; a yes/no one is about a disclosure the page answers
    `verdict` (Yes when true), the page's other disclosures are drawn at random."""
    if kind not in KINDS:
        raise ValueError(f"unknown question kind {kind!r}; expected one of {KINDS}")
    company = _company(rng)
    year = rng.randint(2015, 2023)
    doc_name = f"{company.split()[0].upper()}_{year}_10K"
    items = rng.sample(LINE_ITEMS, rng.randint(*items_per_page))
    figures = [Fact(item.name, item.fmt(item.sample(rng))) for item in items]
    disclosures = [Fact(name, rng.choice(("Yes", "No")))
                   for name in rng.sample(DISCLOSURES, rng.randint(*DISCLOSURES_PER_PAGE))]
    if kind == YES_NO:
        disclosures[0] = Fact(disclosures[0].item, "Yes" if verdict else "No")
        asked: tuple[Fact, ...] = (disclosures[0],)
        answer = disclosures[0].value
    else:
        asked = tuple(rng.sample(figures, FIGURES_ASKED[kind]))
        values = [fact.value for fact in asked]
        answer = values[0] if len(values) == 1 else ", ".join(values[:-1]) + " and " + values[-1]
    facts = figures + disclosures
    rng.shuffle(facts)
    fields = {
        "company": company, "company_s": possessive(company), "year": year, "doc": doc_name,
        "item": asked[0].item, "item2": asked[min(1, len(asked) - 1)].item, "item3": asked[-1].item,
    }
    question = rng.choice(_QUESTIONS[kind]).format(**fields) + (_SUFFIX if rng.random() < 0.25 else "")
    return DemoQuestion(
        id=qid, kind=kind, company=company, year=year, doc_name=doc_name,
        page_num=rng.randint(20, 95), page=_page(company, year, facts), asked=asked,
        question=question, answer=answer,
    )


def iter_questions(seed: int, prefix: str = "demo") -> Iterator[DemoQuestion]:
    """An endless, seeded stream cycling through the kinds (a balanced mix), the yes/no
    verdicts alternating Yes, No, Yes, ..."""
    rng = random.Random(seed)
    index = 0
    while True:
        kind = KINDS[index % len(KINDS)]
        verdict = (index // len(KINDS)) % 2 == 0
        yield make_question(rng, kind, f"{prefix}_{index:05d}", verdict)
        index += 1


def generate(count: int, seed: int, prefix: str = "demo") -> list[DemoQuestion]:
    stream = iter_questions(seed, prefix)
    return [next(stream) for _ in range(count)]


def to_jsonl(questions: list[DemoQuestion]) -> str:
    return "".join(json.dumps(q.to_record(), ensure_ascii=False) + "\n" for q in questions)


def write_splits(out_dir: Path, train_size: int = TRAIN_SIZE, heldout_size: int = HELDOUT_SIZE,
                 train_seed: int = TRAIN_SEED, heldout_seed: int = HELDOUT_SEED) -> tuple[Path, Path]:
    """train.jsonl (the evolution's training pool) and heldout.jsonl; distinct seeds and ids."""
    out_dir.mkdir(parents=True, exist_ok=True)
    train_path, heldout_path = out_dir / "train.jsonl", out_dir / "heldout.jsonl"
    atomic_write_text(train_path, to_jsonl(generate(train_size, train_seed, "demo_train")))
    atomic_write_text(heldout_path, to_jsonl(generate(heldout_size, heldout_seed, "demo_heldout")))
    return train_path, heldout_path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DATA_DIR, help="directory for the two splits")
    parser.add_argument("--train-size", type=int, default=TRAIN_SIZE)
    parser.add_argument("--heldout-size", type=int, default=HELDOUT_SIZE)
    args = parser.parse_args(argv)
    for path in write_splits(args.out, args.train_size, args.heldout_size):
        print(path)


if __name__ == "__main__":
    main()
