"""Answers as the model counts them: retokenised with the model's tokenizer and mapped
through the cluster map. What the local reflector reads an answer by, and what names the
cluster an archive issue points at (its padding's clusters)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from compressor_2.model import load_tokenizer

if TYPE_CHECKING:
    from compressor_2.clusters.clusterset import ClusterSet
    from compressor_2.config import Config


class AnswerTokens:
    """Token ids, lengths and per-cluster histograms of texts, each text tokenised once.
    Safe to share between threads (a fast tokenizer is not)."""

    def __init__(self, tokenizer: Any, token_clusters: np.ndarray, num_clusters: int,
                 load: Callable[[], Any] | None = None) -> None:
        self.tokenizer = tokenizer  # None until `load` gives it, at the first text
        self._load = load
        self.token_clusters = np.asarray(token_clusters, dtype=np.int64)
        self.num_clusters = num_clusters
        self._lock = threading.Lock()
        self._ids: dict[str, np.ndarray] = {}

    @classmethod
    def from_config(cls, config: Config, clusters: ClusterSet) -> AnswerTokens:
        """One a run, shared by the local reflector and the strategies; the model's tokenizer
        is loaded at the first text, so a run in which neither retokenises never loads it."""
        return cls(None, clusters.token_clusters, len(clusters.cluster_ids),
                   lambda: load_tokenizer(config.model_path))

    def ids(self, text: str) -> np.ndarray:
        with self._lock:
            if text not in self._ids:
                if self.tokenizer is None and self._load is not None:
                    self.tokenizer = self._load()
                self._ids[text] = np.asarray(self.tokenizer(text, add_special_tokens=False)["input_ids"],
                                             dtype=np.int64)
            return self._ids[text]

    def text(self, token_id: int) -> str:
        """One token's text, decoded alone."""
        with self._lock:
            if self.tokenizer is None and self._load is not None:
                self.tokenizer = self._load()
            return str(self.tokenizer.decode([int(token_id)]))

    def display(self, token_id: int) -> str:
        """One token's text as a summary shows it: decoded alone, quoted, escapes visible."""
        return repr(self.text(token_id))

    def prefixes(self, text: str) -> tuple[list[int], list[str]]:
        """`text`'s token ids, and the text they decode to 0, 1, ..., all of them long (what a
        token cap at each length leaves of it)."""
        ids = self.ids(text).tolist()
        with self._lock:
            return ids, [str(self.tokenizer.decode(ids[:n], skip_special_tokens=True)) for n in range(len(ids) + 1)]

    def length(self, text: str) -> int:
        """Tokens of `text`: what an answer's `tokens` counts, without its EOS."""
        return len(self.ids(text))

    def histogram(self, text: str) -> np.ndarray:
        """Tokens of `text` per cluster index; ids outside the cluster map, and unsteered
        tokens (in no cluster), are not counted."""
        return self._per_cluster(self.ids(text))

    def padding(self, answer: str, gold: str) -> np.ndarray:
        """Per cluster index, the answer's tokens the gold answer does not have (as a
        multiset: a token the gold has once is padding from its second use on)."""
        extra = Counter(self.ids(answer).tolist()) - Counter(self.ids(gold).tolist())
        return self._per_cluster(np.asarray(list(extra.elements()), dtype=np.int64))

    def _per_cluster(self, ids: np.ndarray) -> np.ndarray:
        clusters = self.token_clusters[ids[ids < len(self.token_clusters)]]
        return np.bincount(clusters[clusters >= 0], minlength=self.num_clusters)
