"""The prompt sent to the model: the question plus its evidence pages (FinanceBench "oracle"),
and an instruction added after it (CONFIG_COMPARE_INSTRUCTION)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path

from compressor_2.common import ConfigError, check_readable_file
from compressor_2.data.example import Example

DEFAULT_TEMPLATE = "Evidence:\n{evidence}\n\nQuestion: {question}"
PLACEHOLDERS = ("{question}", "{evidence}")
INSTRUCTED = "+instruction"  # an instructed example's id: the example's and this


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


def instructed(examples: Sequence[Example], instruction: str) -> tuple[Example, ...]:
    """The examples with `instruction` after each prompt, in the same chat template: other
    prompts, so other answers to the cache (and another id to the engine's prompt check)."""
    return tuple(dataclasses.replace(ex, id=f"{ex.id}{INSTRUCTED}", prompt=f"{ex.prompt}{_suffix(instruction)}")
                 for ex in examples)


def uninstructed(examples: Sequence[Example], instruction: str) -> tuple[Example, ...]:
    """The examples `instructed` made, as they were before: the instruction taken off."""
    suffix = _suffix(instruction)
    if not all(ex.id.endswith(INSTRUCTED) and ex.prompt.endswith(suffix) for ex in examples):
        raise ValueError("uninstructed: an example does not carry the instruction")
    return tuple(dataclasses.replace(ex, id=ex.id.removesuffix(INSTRUCTED), prompt=ex.prompt.removesuffix(suffix))
                 for ex in examples)


def _suffix(instruction: str) -> str:
    return f"\n\n{instruction}"
