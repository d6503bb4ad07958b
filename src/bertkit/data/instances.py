"""Pretraining instances: the papers' rules for turning documents into model rows, as pure functions.

Five ways to cut a corpus into rows, each a function of (documents, lengths, `numpy.random.Generator`):

* `create_nsp_instances` — BERT's next-sentence prediction, a line-for-line port of google-research/bert
  `create_instances_from_document` (segment pairs, 50% random B, put-back of unused sentences, random-side
  longest-first truncation); RoBERTa's SEGMENT-PAIR+NSP is this format (Liu et al., 2019, section 4.2);
* `create_sentence_pair_instances` — RoBERTa's SENTENCE-PAIR+NSP: A one natural sentence, B the next one or a
  sentence of another document;
* `create_sop_instances` — ALBERT's sentence-order prediction: two consecutive segments of one document,
  swapped half of the time;
* `pack_full_sentences` / `pack_doc_sentences` — RoBERTa's FULL-SENTENCES and DOC-SENTENCES packing (no pair
  task), rows filled with whole sentences, crossing document boundaries or not.

Documents come from anything implementing `DocumentSource` (`ListDocuments` in memory here; memory-mapped
shards elsewhere): document `i` is a list of sentences, each a 1-D int array of WordPiece ids without special
tokens, plus a parallel list of bool arrays flagging the pieces that start a word (used by whole-word masking).

Label conventions (transformers'): NSP 0 = B is the real continuation (IsNext), 1 = B is random (NotNext);
SOP 0 = segments in document order, 1 = swapped; -1 = no pair task (packed rows).

Same arguments and a generator in the same state give the same instances: every random choice is drawn from
the `rng` argument, in an order fixed by the code, so a seeded pipeline is reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass
import itertools
from collections import OrderedDict
from typing import Iterator, Protocol, Sequence, runtime_checkable

import numpy as np

# Label of a row with no sentence-pair task (RoBERTa packing); `pad_instances` drops such labels.
NO_PAIR_LABEL = -1
# How often Google redraws the random document before giving up on a fair draw (see `_random_other_document`).
_RANDOM_DOC_TRIES = 10


@dataclass(frozen=True)
class SpecialIds:
    """Ids of the special tokens an instance is built with; read them from the vocabulary, never hard-code."""

    cls: int  # [CLS], first token of every row
    sep: int  # [SEP], closes each segment (and separates documents in FULL-SENTENCES rows)
    pad: int  # [PAD], fills rows up to the batch length in `pad_instances`
    mask: int  # [MASK], used by masking; carried here so one object describes the vocabulary's specials


@dataclass(frozen=True, eq=False)  # eq=False: fields are arrays, whose == is elementwise and has no truth value
class Instance:
    """One model row before masking and padding. All arrays have the same length T ≤ max_seq_length.

    input_ids:      int64 (T,)  `[CLS] A [SEP] B [SEP]` for pairs, `[CLS] ... [SEP]` for packed rows.
    token_type_ids: int64 (T,)  0 on `[CLS] A [SEP]`, 1 on `B [SEP]`; all 0 for packed rows.
    word_starts:    bool (T,)   True on special tokens and on the first piece of every word (also on the first
                                piece of a segment whose word was cut by truncation or splitting).
    special_mask:   bool (T,)   True at [CLS] / [SEP] positions (padding adds [PAD] positions later).
    label:          int         NSP: 0 IsNext, 1 NotNext; SOP: 0 in order, 1 swapped; -1 no pair task.
    segment_ids:    int64 (T,) or None  packed rows only: index of the source document within the row, from 0
                                (an inter-document [SEP] belongs to the document it closes), so a packed-attention
                                path can keep documents apart; None for NSP/SOP pairs.
    """

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    word_starts: np.ndarray
    special_mask: np.ndarray
    label: int
    segment_ids: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


@runtime_checkable
class DocumentSource(Protocol):
    """Random-access collection of tokenised documents.

    `document(i)` returns `(ids, word_starts)`: two lists of equal length, one entry per sentence, `ids[k]` a
    1-D integer array of WordPiece ids (no special tokens) and `word_starts[k]` a bool array of the same length.
    """

    def __len__(self) -> int: ...

    def document(self, i: int) -> tuple[list[np.ndarray], list[np.ndarray]]: ...


class ListDocuments:
    """In-memory `DocumentSource`: `docs_ids[i][k]` is sentence k of document i (any 1-D int sequence).

    `docs_word_starts`, if given, has the same nesting with bool flags; by default every piece starts a word
    (right for whole-word vocabularies, and harmless when whole-word masking is off).
    """

    def __init__(self, docs_ids: Sequence[Sequence[Sequence[int]]],
                 docs_word_starts: Sequence[Sequence[Sequence[bool]]] | None = None) -> None:
        self._ids = [[np.asarray(s, dtype=np.int64).reshape(-1) for s in doc] for doc in docs_ids]
        if docs_word_starts is None:
            self._starts = [[np.ones(s.shape[0], dtype=bool) for s in doc] for doc in self._ids]
        else:
            if len(docs_word_starts) != len(self._ids):
                raise ValueError(f"docs_word_starts has {len(docs_word_starts)} documents, docs_ids {len(self._ids)}")
            self._starts = [[np.asarray(w, dtype=bool).reshape(-1) for w in doc] for doc in docs_word_starts]
            for i, (doc, flags) in enumerate(zip(self._ids, self._starts)):
                if [s.shape[0] for s in doc] != [w.shape[0] for w in flags]:
                    raise ValueError(f"document {i}: word-start flags do not match the sentence lengths")

    def __len__(self) -> int:
        return len(self._ids)

    def document(self, i: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        return self._ids[i], self._starts[i]


class CachedDocuments:
    """A `DocumentSource` that keeps the last `size` documents it read, empty sentences dropped and arrays in
    their final dtypes: NSP's random next segments read a random document each, and a document read costs its
    whole length (the segment needs a few sentences of it)."""

    loads_clean = True

    def __init__(self, docs: DocumentSource, size: int = 256) -> None:
        self.docs, self.size = docs, size
        # An OrderedDict: a plain dict's first key, after many pops from the front, is found by scanning the
        # deleted slots before it (measured: most of a cache miss)
        self._cache: OrderedDict[int, tuple[list[np.ndarray], list[np.ndarray]]] = OrderedDict()
        self._flats: OrderedDict[int, _Flat] = OrderedDict()

    def __len__(self) -> int:
        return len(self.docs)

    def __getstate__(self) -> dict:  # a worker process starts with an empty cache
        return {"docs": self.docs, "size": self.size, "_cache": OrderedDict(), "_flats": OrderedDict()}

    def document(self, i: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        i = int(i)
        hit = self._cache.get(i)
        if hit is not None:
            self._cache.move_to_end(i)
            return hit
        if hit is None:
            ids, starts = self.docs.document(i)
            if len(ids) != len(starts):
                raise ValueError(f"document {i}: {len(ids)} sentences but {len(starts)} word-start arrays")
            keep = [k for k, x in enumerate(ids) if len(x) > 0]
            hit = ([np.asarray(ids[k], dtype=np.int64) for k in keep], [np.asarray(starts[k], dtype=bool) for k in keep])
            if len(self._cache) >= self.size:
                self._cache.popitem(last=False)  # the least recently used
        self._cache[i] = hit
        return hit

    def flat(self, i: int) -> "_Flat":
        """Document i's sentences as one (2, L) stack and their offsets (`_Flat`), kept beside the document: pair
        instances cut their segments from it as views, packed rows copy whole runs of it."""
        i = int(i)
        hit = self._flats.get(i)
        if hit is None:
            hit = _Flat(*self.document(i))
            if len(self._flats) >= self.size:
                self._flats.popitem(last=False)
            self._flats[i] = hit
        else:
            self._flats.move_to_end(i)
        return hit


# ----------------------------------------------------------------------------------------------- helpers


def _load(docs: DocumentSource, i: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Document i with empty sentences dropped: every rule below assumes a sentence has at least one token."""
    if getattr(docs, "loads_clean", False):  # a source that already drops them (`CachedDocuments`)
        return docs.document(i)
    ids, starts = docs.document(i)
    if len(ids) != len(starts):
        raise ValueError(f"document {i}: {len(ids)} sentences but {len(starts)} word-start arrays")
    keep = [k for k, s in enumerate(ids) if len(s) > 0]
    return ([np.asarray(ids[k], dtype=np.int64) for k in keep],
            [np.asarray(starts[k], dtype=bool) for k in keep])


def _concat(arrays: Sequence[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype=dtype)


def _lead_start(word_starts: np.ndarray) -> np.ndarray:
    """Mark the first piece of a segment as a word start: if truncation or splitting cut off its word's head,
    the remaining fragment is still a unit for whole-word masking, not a tail of whatever precedes it."""
    out = word_starts.copy()
    if out.shape[0]:
        out[0] = True
    return out


def _check_lengths(max_seq_length: int, short_seq_prob: float) -> int:
    if max_seq_length < 5:
        # [CLS] A [SEP] B [SEP] with |A|, |B| ≥ 1 needs 5 positions, and the short target is drawn from [2, max-3].
        raise ValueError(f"max_seq_length must be >= 5 for a sentence pair, got {max_seq_length}")
    if not 0.0 <= short_seq_prob <= 1.0:
        raise ValueError(f"short_seq_prob must be in [0, 1], got {short_seq_prob}")
    return max_seq_length - 3


def _target_length(max_num_tokens: int, short_seq_prob: float, rng: np.random.Generator) -> int:
    """Google draws one target per document: usually the full length, sometimes a short one so that the model
    also sees the short sequences of fine-tuning (the pretraining/fine-tuning length mismatch)."""
    if rng.random() < short_seq_prob:
        return int(rng.integers(2, max_num_tokens + 1))  # Google's randint(2, max_num_tokens), both ends inclusive
    return max_num_tokens


def _chunks(lengths: list[int], target: int):
    """Google's chunk loop as a coroutine over the sentences' lengths: yields (start, stop) sentence ranges that
    reach `target` tokens or end the document; the caller may `send(k)` to put the last k sentences of the chunk
    back (NSP's rewind)."""
    i, start, length, n = 0, 0, 0, len(lengths)
    while i < n:
        length += lengths[i]
        if i == n - 1 or length >= target:
            put_back = yield start, i + 1
            if put_back:
                i -= put_back
            start, length = i + 1, 0
        i += 1


def _pair_instance(a: np.ndarray, b: np.ndarray, label: int, special: SpecialIds) -> Instance:
    """Build `[CLS] A [SEP] B [SEP]` from (2, L) stacks of (ids, word starts)."""
    la, lb = a.shape[1], b.shape[1]
    n = la + lb + 3
    # Written into place (not concatenated): this runs once per instance, where numpy's per-call cost dominates
    ids = np.empty(n, dtype=np.int64)
    ids[0], ids[la + 1], ids[n - 1] = special.cls, special.sep, special.sep
    ids[1:la + 1], ids[la + 2:n - 1] = a[0], b[0]
    types = np.zeros(n, dtype=np.int64)
    types[la + 2:] = 1
    starts = np.empty(n, dtype=bool)
    starts[1:la + 1], starts[la + 2:n - 1] = a[1], b[1]
    special_mask = np.zeros(n, dtype=bool)
    special_mask[[0, la + 1, n - 1]] = True
    starts[[0, la + 1, n - 1]] = True
    if la:  # the first piece of each segment starts a word (`_lead_start`)
        starts[1] = True
    if lb:
        starts[la + 2] = True
    return Instance(ids, types, starts, special_mask, int(label))


def _stack(ids: Sequence[np.ndarray], starts: Sequence[np.ndarray]) -> np.ndarray:
    """(2, L) int64: row 0 the ids, row 1 the word-start flags, so one cut along the last axis cuts both."""
    out = np.empty((2, sum(len(x) for x in ids)), dtype=np.int64)
    if out.shape[1]:
        np.concatenate(ids, out=out[0])
        np.concatenate(starts, out=out[1], casting="unsafe")
    return out


class _Flat:
    """A document's sentences as one (2, L) stack (`_stack`) and their offsets: `span(lo, hi)` is the stack of
    sentences lo..hi-1 as a view, made once per document instead of once per segment."""

    def __init__(self, ids: Sequence[np.ndarray], starts: Sequence[np.ndarray]) -> None:
        self.stack = _stack(ids, starts)
        self.lengths = [len(x) for x in ids]
        self.offsets = [0, *itertools.accumulate(self.lengths)]

    def span(self, lo: int, hi: int) -> np.ndarray:
        return self.stack[:, self.offsets[lo]:self.offsets[hi]]


def _flat(docs: DocumentSource, i: int) -> _Flat:
    """Document i as a `_Flat` (kept by a source that has them, `CachedDocuments`)."""
    flat = getattr(docs, "flat", None)
    return flat(i) if flat is not None else _Flat(*_load(docs, i))


def _span(docs: DocumentSource, i: int, doc: tuple[list[np.ndarray], list[np.ndarray]], lo: int,
          hi: int) -> np.ndarray:
    """The (2, L) stack of sentences lo..hi-1 of document i (`doc`, as `_load` read it)."""
    if getattr(docs, "flat", None) is not None:
        return docs.flat(i).span(lo, hi)
    return _stack(doc[0][lo:hi], doc[1][lo:hi])


def truncate_pair(a: np.ndarray, b: np.ndarray, max_num_tokens: int,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Google's `truncate_seq_pair`: shorten the pair until len(a) + len(b) ≤ max_num_tokens.

    Each step removes one token from the longer sequence (from b on a tie), from its front or its back with
    probability 1/2 each — random sides avoid always discarding the ends of documents (Google's comment: "to add
    more randomness and avoid biases").

    Args:
        a, b: (La,) / (Lb,) arrays, or (C, La) / (C, Lb) stacks of C parallel rows (ids, word-start flags, ...);
            the cut is along the last axis, so parallel rows are cut identically.
        max_num_tokens: the budget for both together (≥ 0).
        rng: one `rng.random()` draw per removed token, in removal order.

    Returns:
        (a', b'): contiguous slices along the last axis (views; copy before mutating).
    """
    if max_num_tokens < 0:
        raise ValueError(f"max_num_tokens must be >= 0, got {max_num_tokens}")
    la, lb = a.shape[-1], b.shape[-1]
    excess = la + lb - max_num_tokens
    if excess <= 0:
        return a, b
    front = (rng.random(excess) < 0.5).tolist()  # step k removes from the front when front[k]
    # Which sequence each step shortens depends on the lengths only: the longer one for the first `lead` steps,
    # until both are equal, then b, a, b, a, ... (a tie shortens b). So each side's steps are known slices of the
    # draws, which say how many of its removals come off its front.
    lead = min(abs(la - lb), excess)
    lead_front = sum(front[:lead])
    a_front = sum(front[lead + 1::2]) + (lead_front if la > lb else 0)
    b_front = sum(front[lead::2]) + (0 if la > lb else lead_front)
    a_cut = (excess - lead) // 2 + (lead if la > lb else 0)
    b_cut = excess - a_cut
    return a[..., a_front:la - (a_cut - a_front)], b[..., b_front:lb - (b_cut - b_front)]


def _random_other_document(docs: DocumentSource, doc_index: int,
                           rng: np.random.Generator) -> tuple[int, tuple[list[np.ndarray], list[np.ndarray]]]:
    """A random non-empty document other than `doc_index`: (its index, the document).

    Google redraws up to 10 times and then silently uses whatever it drew (possibly the same document, whose
    "random" B is then a real continuation labelled NotNext). We keep the 10 fair redraws and, should they all
    fail, fall back to walking the other documents from a random one, so B is never from the same document.
    """
    n = len(docs)
    for _ in range(_RANDOM_DOC_TRIES):
        j = int(rng.integers(0, n))
        if j != doc_index:
            doc = _load(docs, j)
            if doc[0]:
                return j, doc
    first = int(rng.integers(0, n - 1))
    for step in range(n - 1):
        j = (first + step) % (n - 1)
        j += j >= doc_index  # skip doc_index: map [0, n-1) onto the other documents
        doc = _load(docs, j)
        if doc[0]:
            return j, doc
    raise ValueError("NSP needs at least 2 non-empty documents to draw a random next segment from")


# -------------------------------------------------------------------------------------------- pair tasks


def create_nsp_instances(docs: DocumentSource, doc_index: int, max_seq_length: int, short_seq_prob: float,
                         rng: np.random.Generator, special: SpecialIds) -> list[Instance]:
    """BERT's segment-pair instances with next-sentence labels for document `doc_index`.

    Port of google-research/bert `create_instances_from_document` (masking is separate, see `masking.py`):
    a target length (max_seq_length - 3, or with probability `short_seq_prob` uniform in [2, max_seq_length - 3],
    once per document); sentences accumulate into a chunk until it reaches the target or the document ends;
    A = the chunk's first `a_end` sentences, a_end uniform in [1, len(chunk) - 1] (1 for a one-sentence chunk).
    With probability 1/2 — always for a one-sentence chunk — B is taken from a random other document, starting
    at a random sentence and running until it reaches target - len(A) tokens (label 1, NotNext), and the chunk's
    unused sentences are put back to start the next chunk; otherwise B is the rest of the chunk (label 0,
    IsNext). The pair is then cut by `truncate_pair` to max_seq_length - 3 tokens.

    Args:
        docs: the corpus; needs ≥ 2 documents (B of a NotNext pair comes from another one).
        doc_index: the document to cut into instances.
        max_seq_length: length of the longest row, specials included (≥ 5).
        short_seq_prob: probability of a short target length for this document.
        rng: source of every random choice.
        special: the vocabulary's special ids.

    Returns:
        Instances of length ≤ max_seq_length, in document order; [] for an empty document.
    """
    return [_pair_instance(a, b, label, special)
            for a, b, label in nsp_pairs(docs, doc_index, max_seq_length, short_seq_prob, rng)]


def nsp_pairs(docs: DocumentSource, doc_index: int, max_seq_length: int, short_seq_prob: float,
              rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """`create_nsp_instances` before the layout: (A, B, label) per instance, A and B (2, L) stacks (`_stack`) of
    ids and word starts, truncated (`pair_rows` lays out many at once)."""
    if len(docs) < 2:
        raise ValueError(f"NSP needs a corpus of at least 2 documents to draw random next segments, got {len(docs)}")
    max_num_tokens = _check_lengths(max_seq_length, short_seq_prob)
    flat = _flat(docs, doc_index)
    target = _target_length(max_num_tokens, short_seq_prob, rng)
    instances: list[tuple[np.ndarray, np.ndarray, int]] = []
    chunks = _chunks(flat.lengths, target)
    put_back = None
    while True:
        try:
            lo, hi = chunks.send(put_back)
        except StopIteration:
            break
        put_back = None
        n = hi - lo
        a_end = int(rng.integers(1, n)) if n >= 2 else 1
        a = flat.span(lo, lo + a_end)
        if n == 1 or rng.random() < 0.5:
            label = 1
            target_b = target - a.shape[1]
            r, other = _random_other_document(docs, doc_index, rng)
            r_ids = other[0]
            r_lo = int(rng.integers(0, len(r_ids)))
            r_hi, length = r_lo, 0
            while r_hi < len(r_ids):  # at least one sentence, then stop once B reaches its target
                length += len(r_ids[r_hi])
                r_hi += 1
                if length >= target_b:
                    break
            b = _span(docs, r, other, r_lo, r_hi)
            # The chunk's sentences after A were not used: rewind so they start the next chunk.
            put_back = n - a_end
        else:
            label = 0
            b = flat.span(lo + a_end, hi)
        a, b = truncate_pair(a, b, max_num_tokens, rng)
        instances.append((a, b, label))
    return instances


def _split_sentence(ids: np.ndarray, starts: np.ndarray, rng: np.random.Generator) -> int:
    """Random split point k in [1, len - 1] for a sentence that must make two segments by itself; a word
    boundary when the sentence has one there, so neither segment starts inside a word."""
    boundaries = np.flatnonzero(starts[1:]) + 1
    if boundaries.shape[0] == 0:
        boundaries = np.arange(1, ids.shape[0])
    return int(boundaries[rng.integers(0, boundaries.shape[0])])


def create_sop_instances(docs: DocumentSource, doc_index: int, max_seq_length: int, short_seq_prob: float,
                         rng: np.random.Generator, special: SpecialIds) -> list[Instance]:
    """ALBERT's sentence-order-prediction instances for document `doc_index`.

    Same target length, chunking and A/B split as `create_nsp_instances`, but B is always the true continuation
    within the chunk (no random document, so nothing is put back), and the two segments are swapped with
    probability 1/2 (label 1 when swapped, 0 in order), then truncated. A chunk of a single sentence (a
    one-sentence document, a last sentence, or one sentence reaching the target alone) is split at a random
    point — a random word boundary when there is one — into A and B; a single one-token sentence makes no
    instance. ALBERT itself falls back to a random-document NotNext pair there, which would mix the NSP signal
    into SOP; splitting keeps every SOP label about order alone.

    Args and returns: as `create_nsp_instances`; a single-document corpus is fine.
    """
    return [_pair_instance(a, b, label, special)
            for a, b, label in sop_pairs(docs, doc_index, max_seq_length, short_seq_prob, rng)]


def sop_pairs(docs: DocumentSource, doc_index: int, max_seq_length: int, short_seq_prob: float,
              rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """`create_sop_instances` before the layout: (A, B, label) per instance, as `nsp_pairs`."""
    max_num_tokens = _check_lengths(max_seq_length, short_seq_prob)
    flat = _flat(docs, doc_index)
    lengths = flat.lengths
    target = _target_length(max_num_tokens, short_seq_prob, rng)
    instances: list[tuple[np.ndarray, np.ndarray, int]] = []
    for lo, hi in _chunks(lengths, target):
        n = hi - lo
        if n >= 2:
            a_end = int(rng.integers(1, n))
            a = flat.span(lo, lo + a_end)
            b = flat.span(lo + a_end, hi)
        elif lengths[lo] >= 2:
            whole = flat.span(lo, hi)
            k = _split_sentence(whole[0], whole[1], rng)
            a, b = whole[:, :k], whole[:, k:]
        else:
            continue
        swapped = rng.random() < 0.5
        if swapped:
            a, b = b, a
        a, b = truncate_pair(a, b, max_num_tokens, rng)
        instances.append((a, b, int(swapped)))
    return instances


def create_sentence_pair_instances(docs: DocumentSource, doc_index: int, max_seq_length: int,
                                   rng: np.random.Generator, special: SpecialIds) -> list[Instance]:
    """RoBERTa's SENTENCE-PAIR+NSP instances for document `doc_index` (Liu et al., 2019, section 4.2): each row is
    a pair of natural sentences, "sampled from a contiguous portion of one document or from separate documents".

    The document's sentences are walked in order from k = 0: A = sentence k. With probability 1/2 — always for
    the document's last sentence, which has no successor — B is one sentence drawn uniformly from a random other
    document (label 1, NotNext) and the walk goes on at k + 1 (the put-back of BERT's NSP: sentence k + 1 was not
    used); otherwise B = sentence k + 1 (label 0, IsNext) and the walk goes on at k + 2, so a sentence is in at
    most one IsNext pair. A pair longer than max_seq_length - 3 tokens is cut by `truncate_pair`. Rows are as
    long as their two sentences (RoBERTa raises the batch size to keep the tokens per step comparable).

    Args and returns: as `create_nsp_instances`, without a short-sequence probability (a sentence pair is as
    long as it is); the corpus needs ≥ 2 documents.
    """
    return [_pair_instance(a, b, label, special)
            for a, b, label in sentence_pairs(docs, doc_index, max_seq_length, rng)]


def sentence_pairs(docs: DocumentSource, doc_index: int, max_seq_length: int,
                   rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """`create_sentence_pair_instances` before the layout: (A, B, label) per instance, as `nsp_pairs`."""
    if len(docs) < 2:
        raise ValueError(f"NSP needs a corpus of at least 2 documents to draw random next sentences, got {len(docs)}")
    max_num_tokens = _check_lengths(max_seq_length, 0.0)
    flat = _flat(docs, doc_index)
    n = len(flat.lengths)
    instances: list[tuple[np.ndarray, np.ndarray, int]] = []
    k = 0
    while k < n:
        a = flat.span(k, k + 1)
        if k == n - 1 or rng.random() < 0.5:
            r, other = _random_other_document(docs, doc_index, rng)
            j = int(rng.integers(0, len(other[0])))
            b, label, k = _span(docs, r, other, j, j + 1), 1, k + 1
        else:
            b, label, k = flat.span(k + 1, k + 2), 0, k + 2
        a, b = truncate_pair(a, b, max_num_tokens, rng)
        instances.append((a, b, label))
    return instances


# --------------------------------------------------------------------------------------------- packing


def _pack(docs: DocumentSource, max_seq_length: int, rng: np.random.Generator | None, special: SpecialIds,
          cross_documents: bool) -> Iterator[Instance]:
    """Shared FULL-/DOC-SENTENCES packer: greedy fill of `max_seq_length - 2` content positions per row."""
    capacity = max_seq_length - 2
    if capacity < 1:
        raise ValueError(f"max_seq_length must be >= 3 to hold [CLS] x [SEP], got {max_seq_length}")
    order = range(len(docs)) if rng is None else rng.permutation(len(docs))
    # The open row, as lists of pieces: ids, word starts, document index within the row, is-special flags.
    row_ids: list[np.ndarray] = []
    row_starts: list[np.ndarray] = []
    row_segs: list[np.ndarray] = []
    row_specials: list[np.ndarray] = []  # inter-document [SEP]s inside the row are special positions too
    row_len, seg, row_doc = 0, 0, -1

    def add(ids: np.ndarray, starts: np.ndarray, is_special: bool) -> None:
        nonlocal row_len
        row_ids.append(ids)
        row_starts.append(starts)
        row_segs.append(np.full(ids.shape[0], seg, dtype=np.int64))
        row_specials.append(np.full(ids.shape[0], is_special, dtype=bool))
        row_len += ids.shape[0]

    def flush() -> Instance:
        """Close the open row as `[CLS] content [SEP]` and empty it."""
        nonlocal row_len, seg
        ids = np.concatenate([[special.cls], _concat(row_ids, np.int64), [special.sep]]).astype(np.int64)
        starts = np.concatenate([[True], _lead_start(_concat(row_starts, bool)), [True]])
        content_segs = _concat(row_segs, np.int64)
        segs = np.concatenate([[0], content_segs, content_segs[-1:]]).astype(np.int64)
        special_mask = np.concatenate([[True], _concat(row_specials, bool), [True]])
        for part in (row_ids, row_starts, row_segs, row_specials):
            part.clear()
        row_len, seg = 0, 0
        return Instance(ids, np.zeros_like(ids), starts, special_mask, NO_PAIR_LABEL, segs)

    for d in order:
        d = int(d)
        for s_ids, s_starts in zip(*_load(docs, d)):
            # RoBERTa: "an extra separator token between documents" — only inside a row, never at its start.
            new_doc = row_len > 0 and row_doc != d
            need = s_ids.shape[0] + (1 if new_doc else 0)
            if row_len > 0 and row_len + need > capacity:
                yield flush()
                new_doc = False
            if new_doc:
                add(np.array([special.sep], np.int64), np.ones(1, bool), True)
                seg += 1
            # A sentence longer than a whole row is split into full rows; its tail stays open for more sentences.
            while row_len + s_ids.shape[0] > capacity:
                room = capacity - row_len
                add(s_ids[:room], s_starts[:room], False)
                s_ids, s_starts = s_ids[room:], s_starts[room:]
                yield flush()
            if s_ids.shape[0]:
                add(s_ids, s_starts, False)
            row_doc = d
        if not cross_documents and row_len > 0:
            yield flush()
    if row_len > 0:
        yield flush()


def pack_full_sentences(docs: DocumentSource, max_seq_length: int, rng: np.random.Generator | None = None, *,
                        special: SpecialIds) -> Iterator[Instance]:
    """RoBERTa FULL-SENTENCES rows: `[CLS] s1 s2 ... [SEP]`, whole sentences sampled contiguously.

    Sentences are taken in corpus order and rows may cross document boundaries; when they do, an extra [SEP]
    separates the documents (it is a special position and carries the segment id of the document it closes).
    A sentence that does not fit in the current row starts the next one; a sentence longer than a row is split.
    No pair task: label -1, token types all 0, `segment_ids` number the documents within the row from 0.

    Args:
        docs: the corpus.
        max_seq_length: row length including [CLS] and [SEP] (≥ 3).
        rng: if given, documents are visited in the order `rng.permutation(len(docs))` (a fresh document order per
            epoch); if None, in index order.
        special: the vocabulary's special ids.

    Yields:
        Instances of length ≤ max_seq_length whose content, specials removed, is the corpus in visiting order.
    """
    return _pack(docs, max_seq_length, rng, special, cross_documents=True)


def pack_doc_sentences(docs: DocumentSource, max_seq_length: int, rng: np.random.Generator | None = None, *,
                       special: SpecialIds) -> Iterator[Instance]:
    """RoBERTa DOC-SENTENCES rows: as `pack_full_sentences`, but a row never crosses a document boundary, so the
    last row of a document may be short and `segment_ids` are all 0."""
    return _pack(docs, max_seq_length, rng, special, cross_documents=False)


# -------------------------------------------------------------------------------------------- collation


def pad_instances(instances: Sequence[Instance], max_len: int | None, pad_id: int) -> dict[str, np.ndarray]:
    """Collate instances into right-padded (B, T) arrays.

    Args:
        instances: B ≥ 1 instances.
        max_len: T, the padded length (static shapes); None pads to the longest instance. An instance longer than
            `max_len` is an error, never silently cut.
        pad_id: the [PAD] id.

    Returns:
        input_ids (B, T) int64 (pad_id after the end); token_type_ids (B, T) int64 (0 on pads);
        attention_mask (B, T) int64 (1 on tokens, 0 on pads); special_mask (B, T) bool (True on specials and pads,
        so masking never selects a pad); word_starts (B, T) bool (True on pads);
        next_sentence_label (B,) int64, present only when every instance has a pair label (≥ 0), absent when none
        has one (mixing the two is an error); segment_ids (B, T) int64, present only when every instance has them,
        -1 on pads.
    """
    if not instances:
        raise ValueError("pad_instances needs at least one instance")
    lengths = np.array([len(x) for x in instances])
    t = int(lengths.max()) if max_len is None else int(max_len)
    if lengths.max() > t:
        raise ValueError(f"an instance has {int(lengths.max())} tokens, more than max_len={t}")
    b = len(instances)
    out = {
        "input_ids": np.full((b, t), pad_id, dtype=np.int64),
        "token_type_ids": np.zeros((b, t), dtype=np.int64),
        "attention_mask": np.zeros((b, t), dtype=np.int64),
        "special_mask": np.ones((b, t), dtype=bool),
        "word_starts": np.ones((b, t), dtype=bool),
    }
    with_segments = all(x.segment_ids is not None for x in instances)
    if with_segments:
        out["segment_ids"] = np.full((b, t), -1, dtype=np.int64)
    for row, (x, n) in enumerate(zip(instances, lengths)):
        out["input_ids"][row, :n] = x.input_ids
        out["token_type_ids"][row, :n] = x.token_type_ids
        out["attention_mask"][row, :n] = 1
        out["special_mask"][row, :n] = x.special_mask
        out["word_starts"][row, :n] = x.word_starts
        if with_segments:
            out["segment_ids"][row, :n] = x.segment_ids
    labels = np.array([x.label for x in instances], dtype=np.int64)
    has_label = labels >= 0
    if has_label.all():
        out["next_sentence_label"] = labels
    elif has_label.any():
        raise ValueError("cannot collate instances with and without a sentence-pair label into one batch")
    return out


# ------------------------------------------------------------------------------ layout of many rows at once
# What the loader runs: the rules above decide what goes where (as (A, B) stacks, or as the packer's runs of
# sentences); these lay a whole lane chunk's rows out with a few array operations instead of one `Instance` and a
# row copy per row. tests/data/test_instances.py pins them to `pad_instances` of the plain functions' instances.


def _scatter(sizes: np.ndarray, dest_starts: np.ndarray, src_starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(destination, source) flat indices of runs: run k copies sizes[k] items from src_starts[k] on to
    dest_starts[k] on. Equals concatenating `np.arange(start, start + size)` per run, without the loop."""
    before = np.cumsum(sizes) - sizes  # the items of the runs before run k
    within = np.arange(int(sizes.sum())) - np.repeat(before, sizes)
    return np.repeat(dest_starts, sizes) + within, np.repeat(src_starts, sizes) + within


def pair_rows(pairs: Sequence[tuple[np.ndarray, np.ndarray, int]], max_len: int,
              special: SpecialIds) -> dict[str, np.ndarray]:
    """`pad_instances([_pair_instance(a, b, label, special) for a, b, label in pairs], max_len, special.pad)`:
    the rows `[CLS] A [SEP] B [SEP]` of (A, B, label) triples (`nsp_pairs`, ...), padded to max_len, laid out at
    once. Returns input_ids, token_type_ids, attention_mask (n, T) int64, special_mask, word_starts (n, T) bool
    and next_sentence_label (n,) int64."""
    n, t = len(pairs), int(max_len)
    if n == 0:
        raise ValueError("pair_rows needs at least one pair")
    pieces = [x for a, b, _ in pairs for x in (a, b)]
    sizes = np.fromiter((x.shape[1] for x in pieces), dtype=np.int64, count=2 * n)
    la, lb = sizes[0::2], sizes[1::2]
    lengths = la + lb + 3
    if int(lengths.max()) > t:
        raise ValueError(f"an instance has {int(lengths.max())} tokens, more than max_len={t}")
    row = np.arange(n, dtype=np.int64) * t
    dest = np.empty(2 * n, dtype=np.int64)
    dest[0::2], dest[1::2] = row + 1, row + la + 2  # A after [CLS], B after A's [SEP]
    content = np.concatenate(pieces, axis=1)  # (2, total): ids, word starts
    to, src = _scatter(sizes, dest, np.cumsum(sizes) - sizes)
    ids = np.full((n, t), special.pad, dtype=np.int64)
    ids.reshape(-1)[to] = content[0, src]
    ids[:, 0] = special.cls
    ids.reshape(-1)[row + la + 1] = special.sep
    ids.reshape(-1)[row + lengths - 1] = special.sep
    special_mask = np.ones((n, t), dtype=bool)  # specials and padding
    special_mask.reshape(-1)[to] = False
    word_starts = np.ones((n, t), dtype=bool)
    word_starts.reshape(-1)[to] = content[1, src] != 0
    # the first piece of each segment starts a word (`_lead_start`)
    word_starts.reshape(-1)[(row + 1)[la > 0]] = True
    word_starts.reshape(-1)[(row + la + 2)[lb > 0]] = True
    col = np.arange(t)
    attention = (col < lengths[:, None]).astype(np.int64)
    types = ((col >= (la + 2)[:, None]) & (col < lengths[:, None])).astype(np.int64)
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": attention, "special_mask": special_mask,
            "word_starts": word_starts,
            "next_sentence_label": np.fromiter((label for _, _, label in pairs), dtype=np.int64, count=n)}


class _PackPlan:
    """`_pack`'s greedy fill of rows of `capacity` content tokens, planned over the sentences' lengths (Python
    integers): runs of content (source offset in the documents end to end, size, row, column, segment),
    inter-document [SEP]s (row, column, segment), and per row its content length and the segment of its last
    token. A document starts a new row unless `cross_documents`."""

    def __init__(self, flats: Sequence[_Flat], capacity: int, cross_documents: bool) -> None:
        self.run_src: list[int] = []
        self.run_size: list[int] = []
        self.run_row: list[int] = []
        self.run_col: list[int] = []
        self.run_seg: list[int] = []
        self.seps: list[tuple[int, int, int]] = []
        self.row_len_of: list[int] = []
        self.row_seg_of: list[int] = []
        self.row, self.row_len, self.seg = 0, 0, 0
        row_doc, base = -1, 0
        for d, flat in enumerate(flats):
            offsets = flat.offsets
            for k, size in enumerate(flat.lengths):
                src = base + offsets[k]
                new_doc = self.row_len > 0 and row_doc != d
                if self.row_len > 0 and self.row_len + size + new_doc > capacity:
                    self._close_row()
                    new_doc = False
                if new_doc:
                    self.seps.append((self.row, self.row_len, self.seg))
                    self.row_len, self.seg = self.row_len + 1, self.seg + 1
                while self.row_len + size > capacity:  # a sentence longer than a row: full rows, its tail stays open
                    room = capacity - self.row_len
                    self._run(src, room)
                    self.row_len += room
                    self._close_row()
                    src, size = src + room, size - room
                if size:
                    self._run(src, size)
                    self.row_len += size
                row_doc = d
            base += flat.stack.shape[1]
            if not cross_documents and self.row_len > 0:
                self._close_row()
        if self.row_len > 0:
            self.row_len_of.append(self.row_len), self.row_seg_of.append(self.seg)

    def _run(self, src: int, size: int) -> None:
        self.run_src.append(src)
        self.run_size.append(size)
        self.run_row.append(self.row)
        self.run_col.append(self.row_len)
        self.run_seg.append(self.seg)

    def _close_row(self) -> None:
        self.row_len_of.append(self.row_len), self.row_seg_of.append(self.seg)
        self.row, self.row_len, self.seg = self.row + 1, 0, 0


def packed_rows(flats: Sequence[_Flat], max_seq_length: int, special: SpecialIds,
                cross_documents: bool) -> dict[str, np.ndarray] | None:
    """`pad_instances(list(pack_full_sentences(docs, max_seq_length, special=special)), max_seq_length,
    special.pad)` (or `pack_doc_sentences` when not `cross_documents`) for documents given as `_Flat`s, in
    order: `_pack`'s greedy fill planned over the sentences' lengths (`_PackPlan`), then every row's content
    copied at once. Returns input_ids, token_type_ids, attention_mask, segment_ids (n, T) int64, special_mask,
    word_starts (n, T) bool; None when the documents hold no token."""
    t = int(max_seq_length)
    capacity = t - 2
    if capacity < 1:
        raise ValueError(f"max_seq_length must be >= 3 to hold [CLS] x [SEP], got {max_seq_length}")
    plan = _PackPlan(flats, capacity, cross_documents)
    n = len(plan.row_len_of)
    if n == 0:
        return None
    stream = np.concatenate([f.stack for f in flats], axis=1)  # (2, N): ids, word starts, documents end to end
    sizes = np.array(plan.run_size, dtype=np.int64)
    rows = np.arange(n, dtype=np.int64) * t
    to, src = _scatter(sizes, np.array(plan.run_row, dtype=np.int64) * t + 1 + np.array(plan.run_col, dtype=np.int64),
                       np.array(plan.run_src, dtype=np.int64))
    lengths = np.array(plan.row_len_of, dtype=np.int64) + 2
    last_seg = np.array(plan.row_seg_of, dtype=np.int64)
    ids = np.full((n, t), special.pad, dtype=np.int64)
    special_mask = np.ones((n, t), dtype=bool)
    word_starts = np.ones((n, t), dtype=bool)
    segments = np.full((n, t), -1, dtype=np.int64)
    ids.reshape(-1)[to] = stream[0, src]
    word_starts.reshape(-1)[to] = stream[1, src] != 0
    word_starts[:, 1] = True  # every row's first piece starts a word (`_lead_start`)
    special_mask.reshape(-1)[to] = False
    segments.reshape(-1)[to] = np.repeat(np.array(plan.run_seg, dtype=np.int64), sizes)
    if plan.seps:
        sep = np.array(plan.seps, dtype=np.int64)
        at = sep[:, 0] * t + 1 + sep[:, 1]
        ids.reshape(-1)[at] = special.sep
        segments.reshape(-1)[at] = sep[:, 2]
    ids[:, 0], segments[:, 0] = special.cls, 0
    ids.reshape(-1)[rows + lengths - 1] = special.sep
    segments.reshape(-1)[rows + lengths - 1] = last_seg
    attention = (np.arange(t) < lengths[:, None]).astype(np.int64)
    return {"input_ids": ids, "token_type_ids": np.zeros((n, t), dtype=np.int64), "attention_mask": attention,
            "special_mask": special_mask, "word_starts": word_starts, "segment_ids": segments}
