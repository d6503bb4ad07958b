"""Shared by the stream tests: an in-memory document source with the prepared corpus's index reads."""

from __future__ import annotations

import numpy as np
import pytest

from bertkit.data.instances import ListDocuments


class IndexedDocuments(ListDocuments):
    """`ListDocuments` with `ShardedCorpus`'s reads by index (`document_sizes`, `token_range`, `sentence_offsets`),
    counting the tokens `token_range` hands out (`tokens_read`) and the documents read whole (`whole_reads`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tokens_read = self.whole_reads = 0

    def document(self, i: int):
        self.whole_reads += 1
        return super().document(i)

    def _flat(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        ids, starts = self._ids[i], self._starts[i]
        return (np.concatenate(ids) if ids else np.zeros(0, np.int64),
                np.concatenate(starts) if starts else np.zeros(0, bool))

    def document_sizes(self) -> tuple[np.ndarray, np.ndarray]:
        return (np.array([sum(len(s) for s in doc) for doc in self._ids], dtype=np.int64),
                np.array([len(doc) for doc in self._ids], dtype=np.int64))

    def sentence_offsets(self, i: int) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([len(s) for s in self._ids[i]])]).astype(np.int64)

    def token_range(self, i: int, lo: int, hi: int, word_starts: bool = True):
        ids, starts = self._flat(i)
        assert 0 <= lo <= hi <= len(ids)
        self.tokens_read += hi - lo
        return ids[lo:hi], (starts[lo:hi] if word_starts else None)


@pytest.fixture
def indexed_documents():
    """The class `IndexedDocuments` (an indexed, counting copy of a `ListDocuments`' documents)."""
    return IndexedDocuments
