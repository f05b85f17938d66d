"""The documentation's links hold: every relative link in README.md and docs/**/*.md names
a file that exists, and a `#anchor` into a Markdown file names one of its headings.

Links are `[text](target)` and images `![alt](target)`; http(s)://, mailto: and pure
`#anchor` links are not checked, and neither is anything inside code (fenced blocks and
inline code spans), which is example text, not a link. Anchors follow GitHub's slugs:
lowercase, punctuation removed except hyphens, underscores and spaces, spaces -> hyphens,
and a repeated heading gets -1, -2, ...
"""

from __future__ import annotations

import re
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 350

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+).*?\1")
# [text](target) or ![alt](target), with an optional "title" after the target.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.IGNORECASE)


def doc_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of every line outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # keeps letters, digits, underscores, hyphens, spaces
    return text.replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(path):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(path: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in prose_lines(path):
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            found.append((number, match.group(1)))
    return found


def broken_links(path: Path) -> list[str]:
    """One message per relative link of `path` that does not resolve."""
    problems = []
    for number, target in links(path):
        if EXTERNAL.match(target) or target.startswith("#"):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve()
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not resolved.exists():
            problems.append(f"{where}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{where}: no heading with anchor #{anchor} in {resolved.name}")
    return problems


def test_docs_exist():
    assert README.is_file()
    assert len(doc_files()) > 1, "docs/*.md is missing"


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path):
    assert links(path) or path != README, "README.md links to nothing"
    problems = broken_links(path)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move the detail to docs/"
    )


def test_readme_shows_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert "make run" in text and "make test" in text


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Outputs (in `CONFIG_OUTPUT_DIR`)", "outputs-in-config_output_dir"),
        ("GEPA (a strategy): `CONFIG_STRATEGY_GEPA=y`", "gepa-a-strategy-config_strategy_gepay"),
        ("Ctrl+C and resume", "ctrlc-and-resume"),
        ("Why 127.0.0.1 by default", "why-127001-by-default"),
        ("The real setup (GPU, SGLang, FinanceBench, an OpenAI-compatible reflector)",
         "the-real-setup-gpu-sglang-financebench-an-openai-compatible-reflector"),
    ],
)
def test_slug_follows_github(heading: str, anchor: str):
    assert slug(heading) == anchor


def test_a_broken_link_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## A section\n", encoding="utf-8")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/page.md) [ok](docs/page.md#a-section) [web](https://example.com) [top](#x)\n"
        "`[code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n"
        "[gone](docs/missing.md) ![img](docs/missing.png) [bad anchor](docs/page.md#nope)\n",
        encoding="utf-8",
    )
    problems = broken_links(page)
    assert len(problems) == 3, problems
    assert "docs/missing.md" in problems[0] and "docs/missing.png" in problems[1]
    assert "#nope" in problems[2]
