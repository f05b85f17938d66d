"""The prompt sent to the model: the question plus its evidence pages (FinanceBench "oracle")."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from compressor_2.common import ConfigError, check_readable_file

DEFAULT_TEMPLATE = "Evidence:\n{evidence}\n\nQuestion: {question}"
PLACEHOLDERS = ("{question}", "{evidence}")


def load_template(path: Path | None) -> str:
    """The template at `path` (placeholders {question} and {evidence}), or the built-in one."""
    if path is None:
        return DEFAULT_TEMPLATE
    check_readable_file(path, "prompt template")
    try:
        template = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"prompt template '{path}' cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"prompt template '{path}' is not UTF-8 text") from None
    for field in PLACEHOLDERS:
        if field not in template:
            raise ConfigError(f"prompt template '{path}' lacks the placeholder {field}")
    # Nothing else is filled in: a misspelt placeholder would reach the model as it stands.
    unknown = sorted(set(re.findall(r"\{\w+\}", template)) - set(PLACEHOLDERS))
    if unknown:
        raise ConfigError(f"prompt template '{path}' has the unknown placeholder(s) {', '.join(unknown)}: "
                          f"only {' and '.join(PLACEHOLDERS)} are filled in")
    return template


def build_prompt(question: str, evidence_pages: Sequence[str], template: str = DEFAULT_TEMPLATE,
                 max_evidence_chars: int = 0) -> str:
    """`max_evidence_chars` > 0 caps the joined evidence (long filings overflow small contexts)."""
    evidence = "\n\n".join(page.strip() for page in evidence_pages)
    if max_evidence_chars > 0:
        evidence = evidence[:max_evidence_chars]
    return template.replace("{evidence}", evidence).replace("{question}", question.strip())
