"""Deterministic, resumable streams of word windows for a language model that reads text in order (ELMo's biLM).

As allenai/bilm-tf feeds its biLM: every epoch the documents are put in a seeded order and laid end to end, each
sentence framed as `<s> words </s>`; that one token stream is cut into G = micro_batch_size x world_size equal
lanes, and global batch j holds, for every lane, its words [j·T, j·T + T] (T + 1 words: window j + 1 starts at the
last word of window j, so every word is a forward target once and a backward target once). Rank r keeps lanes
[r·B, (r+1)·B), and reads only the documents that overlap them. Consecutive batches continue each lane, which is what lets the forward LSTM carry its state from
one batch to the next. What is left over at the end of a lane (fewer than T + 1 words) is not used that epoch.

The position is (epoch, window): a pure function of the corpus, the seed and the settings, so a restart seeks
there. A carried LSTM state travels with it: `batch["_state"]` is a dict the objective may write its state into
(`"carried"`), which the trainer checkpoints with the data position; after `load_state_dict` the first batch
hands it back under `"_carried"`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch


class WordWindowStream:
    """This rank's micro-batches of word windows: "input_ids" and "attention_mask" (B, T + 1) int64 (every word
    real), "_state" the position after the batch; see the module docstring."""

    def __init__(self, docs, bos_id: int, eos_id: int, window: int, micro_batch_size: int, seed: int = 0,
                 rank: int = 0, world_size: int = 1, max_epochs: int | None = None, shuffle: bool = True) -> None:
        if len(docs) == 0:
            raise ValueError("the corpus has no documents")
        if window < 1:
            raise ValueError(f"the window must hold at least one prediction, got {window}")
        self.docs, self.bos_id, self.eos_id = docs, bos_id, eos_id
        self.window, self.micro_batch_size = window, micro_batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.max_epochs, self.shuffle = max_epochs, shuffle
        self.position: dict[str, Any] = {"epoch": 0, "window": 0}
        self._carried_in = None
        self._cached: tuple[int, np.ndarray] | None = None

    # ---- the pure part: one epoch's lanes -----------------------------------------------------------------------
    def epoch_tokens(self, epoch: int) -> np.ndarray:
        """The epoch's token stream: documents in the epoch's order (storage order without shuffle), each sentence
        as <s> ids </s>."""
        order = (np.random.default_rng([self.seed, 7, epoch]).permutation(len(self.docs)) if self.shuffle
                 else np.arange(len(self.docs)))
        parts = []
        for d in order:
            for sentence in self.docs.document(int(d))[0]:
                parts.append(np.concatenate([[self.bos_id], np.asarray(sentence, dtype=np.int64), [self.eos_id]]))
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

    def _framed(self, d: int, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Words lo..hi-1 of document d framed, its sentences as `<s> ids </s>` end to end (the concatenation of
        `[bos, *sentence, eos]` over its sentences). Where the source has an index (`ShardedCorpus`), only the
        sentences that overlap [lo, hi) are read, and framed with one scatter: a rank whose lanes begin or end
        inside a long document pays for its own words of it, not for the whole document."""
        if not hasattr(self.docs, "sentence_offsets"):
            parts = [np.concatenate([[self.bos_id], np.asarray(sentence, dtype=np.int64), [self.eos_id]])
                     for sentence in self.docs.document(int(d))[0]]
            framed = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)
            return framed[lo:hi]
        bounds = self.docs.sentence_offsets(int(d))
        k = len(bounds) - 1  # sentences
        starts = bounds[:-1] + 2 * np.arange(k)  # where sentence j's <s> lands: j earlier pairs of marks before it
        hi = int(bounds[-1]) + 2 * k if hi is None else hi
        first = int(np.searchsorted(starts + np.diff(bounds) + 2, lo, side="right"))  # the sentence holding word lo
        last = int(np.searchsorted(starts, hi, side="left"))  # one past the sentence holding word hi - 1
        if first >= last:
            return np.zeros(0, dtype=np.int64)
        ids = self.docs.token_range(int(d), int(bounds[first]), int(bounds[last]), False)[0]
        sub = bounds[first:last + 1] - bounds[first]
        n = last - first
        out = np.empty(len(ids) + 2 * n, dtype=np.int64)
        marks = sub[:-1] + 2 * np.arange(n)
        out[marks] = self.bos_id
        out[sub[1:] + 2 * np.arange(n) + 1] = self.eos_id
        shift = np.repeat(2 * np.arange(n) + 1, np.diff(sub))  # a token of sentence j moves 2j + 1 on
        out[np.arange(len(ids)) + shift] = ids
        offset = int(starts[first])  # the framed document's word where this piece starts
        return out[lo - offset:hi - offset]

    def _lengths(self) -> np.ndarray:
        """(documents,) each document's words with sentence marks; from the index where the source has one
        (`ShardedCorpus.document_sizes`: no token read), else by reading every document once per stream."""
        if getattr(self, "_doc_lengths", None) is None:
            if hasattr(self.docs, "document_sizes"):  # tokens, and two marks per sentence
                tokens, sentences = self.docs.document_sizes()
                self._doc_lengths = np.asarray(tokens + 2 * sentences, dtype=np.int64)
            else:
                lengths = [sum(len(x) + 2 for x in self.docs.document(d)[0]) for d in range(len(self.docs))]
                self._doc_lengths = np.array(lengths, dtype=np.int64)
        return self._doc_lengths

    def lanes(self, epoch: int) -> np.ndarray:
        """(B, L) this rank's lanes of the epoch: lanes [r·B, (r+1)·B) of the epoch's stream cut into G lanes of L
        words. Only the documents that overlap them are read and framed (the lengths of the others place them),
        and of the first and the last only the words inside, so a rank's work per epoch is proportional to its
        own lanes."""
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        order = (np.random.default_rng([self.seed, 7, epoch]).permutation(len(self.docs)) if self.shuffle
                 else np.arange(len(self.docs)))
        lengths = self._lengths()[order]
        ends = np.cumsum(lengths)
        total = int(ends[-1]) if len(ends) else 0
        B = self.micro_batch_size
        G = B * self.world_size
        L = total // G
        if L < self.window + 1:
            raise ValueError(f"the corpus ({total} words with sentence marks) is too small for {G} lanes of "
                             f"windows of {self.window + 1} words; lower the batch size or the window")
        lo, hi = self.rank * B * L, (self.rank + 1) * B * L  # this rank's words in the epoch's stream
        first = int(np.searchsorted(ends, lo, side="right"))  # the document holding word lo
        last = int(np.searchsorted(ends, hi, side="left")) + 1  # one past the document holding word hi - 1
        pieces = []
        for i in range(first, last):
            start = int(ends[i] - lengths[i])
            pieces.append(self._framed(int(order[i]), max(lo - start, 0), min(hi, int(ends[i])) - start))
        tokens = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        lanes = tokens.reshape(B, L)
        self._cached = (epoch, lanes)
        return lanes

    def windows_per_epoch(self) -> int:
        return (self.lanes(0).shape[1] - 1) // self.window

    # ---- iteration ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return dict(self.position)

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is None:
            return
        self.position = {"epoch": int(state["epoch"]), "window": int(state["window"])}
        carried = state.get("carried")
        # Only one process's state is checkpointed: with several the others would get rank 0's, so all restart.
        self._carried_in = carried if (carried is not None and self.world_size == 1) else None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        epoch, j = self.position["epoch"], self.position["window"]
        T = self.window
        while self.max_epochs is None or epoch < self.max_epochs:
            lanes = self.lanes(epoch)
            count = (lanes.shape[1] - 1) // T
            if j >= count:
                epoch, j = epoch + 1, 0
                continue
            ids = torch.from_numpy(np.ascontiguousarray(lanes[:, j * T:j * T + T + 1]))
            j += 1
            self.position = {"epoch": epoch, "window": j}
            batch: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                     "_state": dict(self.position)}
            if self._carried_in is not None:
                batch["_carried"], self._carried_in = self._carried_in, None
            yield batch


def fixed_windows(stream: WordWindowStream, max_windows: int) -> list[dict[str, Any]]:
    """The first `max_windows` batches of epoch 0 in order: a fixed evaluation set (each a micro-batch)."""
    out = []
    for batch in stream:
        if batch["_state"]["epoch"] > 0 or len(out) >= max_windows:
            break
        out.append({k: v for k, v in batch.items() if k != "_state"})
    return out
