"""XLNet's permutation language modelling as data: which tokens are predicted, in which factorisation order, and
what each position may see. Pure functions of arrays and an explicit `numpy.random.Generator`, after the paper's
reference pipeline (zihangdai/xlnet `data_utils.py`: `_sample_mask`, `_local_perm`, `create_data`).

One segment of S tokens is laid out as

    [reuse: R tokens] [A] <sep> [B] <sep> <cls>          segments 0 ... 0 0 | 1 ... 1 1 | 2

The first R tokens continue the previous segment of the same stream (their hidden states become the next segment's
memory); A follows them in the text, and B follows A half of the time (`is_next` 1) and is a span from elsewhere
otherwise (`is_next` 0), A and B together filling S - R - 3 tokens.

Partial prediction: spans of 1 .. 5 words (probability proportional to 1/n) are chosen to be predicted, each with
about (K - 1)·n context tokens around it (`partial_k` K = 7 in the paper: mask_alpha 6, mask_beta 1), until
exactly `num_predict` tokens are chosen (half in the reuse part, half in the rest; single random tokens top up).
The factorisation order puts every unpredicted token first (it sees all unpredicted tokens and no predicted one)
and the predicted tokens after it in a random order, so only the last ~1/K of the order is predicted. <sep> and
<cls> are never predicted but take part in the order like predicted tokens (the reference's "functional" tokens).
The reuse part and the rest are permuted separately; the rest sees all of the reuse part, the reuse part none of the
rest (so the memory a segment leaves does not depend on what follows it).

Departures from the reference, each deliberate: a span counts whole words (the reference's loop tests the span's
first piece again and again, so it counts pieces); A is cut at a random point rather than a sentence boundary; a
permutation is drawn per part (the reference's `perm_size` windows with the paper's sizes are the parts).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
import functools

import numpy as np

from bertkit.config import IGNORE_INDEX

MAX_GRAM = 5  # the longest predicted span, in words


@functools.lru_cache(maxsize=None)
def _gram_cdf(max_gram: int) -> list[float]:
    """The cdf numpy's `Generator.choice(grams, p=p)` searches, for span lengths n ~ 1/n on 1..max_gram: p's
    cumulative sum divided by its last value (the same float64 operations, so the same draws)."""
    p = 1.0 / np.arange(1, max_gram + 1)
    p /= p.sum()
    cdf = p.cumsum()
    cdf /= cdf[-1]
    return cdf.tolist()


def span_mask(word_starts: np.ndarray, goal: int | None, rng: np.random.Generator, partial_k: int = 7,
              max_gram: int = MAX_GRAM) -> np.ndarray:
    """(L,) bool: which of L tokens to predict, exactly min(goal, L) of them (goal None: the spans alone, about
    L / K tokens).

    word_starts: (L,) bool, True where a token starts a word (spans never begin inside a word). Spans of n words,
    n ~ 1/n on 1..max_gram (capped at what the goal still needs), left to right, each after a random share (up to
    (K - 1)·n tokens) of its context and followed by the rest of (K - 1) x its length in tokens, so that about
    1/K of the tokens are predicted; single random tokens then top the count up to the goal.
    """
    L = len(word_starts)
    limit = L if goal is None else min(goal, L)
    mask = np.zeros(L, dtype=bool)
    cdf = _gram_cdf(max_gram)
    word_starts = np.asarray(word_starts, dtype=bool).tolist()  # read one by one below: a list is faster
    chosen, cur = 0, 0
    while cur < L and chosen < limit:
        # n ~ 1/n on 1..max_gram: `rng.choice(grams, p=p)` as numpy draws it (one uniform, searched in the cdf)
        n = min(bisect.bisect_right(cdf, rng.random()) + 1, limit - chosen)
        context = n * (partial_k - 1)
        left = int(rng.integers(context)) if context > 0 else 0
        begin = cur + left
        while begin < L and not word_starts[begin]:  # start at a whole word
            begin += 1
        if begin >= L:
            break
        end, words = begin + 1, 1
        while end < L:  # n whole words: stop at the start of word n + 1
            if word_starts[end]:
                words += 1
                if words > n:
                    break
            end += 1
        end = min(end, begin + limit - chosen)  # never past the goal (a long word is cut)
        mask[begin:end] = True
        chosen += end - begin
        cur = end + max(0, (partial_k - 1) * (end - begin) - left)  # (K - 1) x the span's tokens around it
    while goal is not None and chosen < limit:  # top up with single tokens
        i = int(rng.integers(L))
        if not mask[i]:
            mask[i] = True
            chosen += 1
    return mask


def factorisation_masks(predicted: np.ndarray, functional: np.ndarray, rng: np.random.Generator,
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One part's order and masks: (perm_mask (L, L) bool, target (L,) bool, order (L,) int).

    predicted: (L,) tokens chosen by `span_mask`; functional: (L,) <sep>/<cls> (never targets). order[i] is token
    i's place in the factorisation order: -1 for every plain (unpredicted, non-functional) token, a random rank
    0 .. L-1 for the others. perm_mask[i, j] True = i may not see j:

        a plain token sees exactly the plain tokens (itself included);
        a target sees the plain tokens and the predicted/functional tokens strictly earlier in the order;
        a functional token sees the plain tokens and the predicted/functional tokens up to itself.
    """
    L = len(predicted)
    plain = ~predicted & ~functional
    target = predicted & ~functional
    order = np.where(plain, -1, rng.permutation(L))
    own = np.where(target, order, order + 1)  # a target may not see itself; the others may
    perm_mask = (own[:, None] <= order[None, :]) & ~plain[None, :]
    return perm_mask, target, order


@dataclass(frozen=True)
class PLMExample:
    """One segment ready for the model: input_ids, token_type_ids (S,); perm_mask (S, S) bool; target_mapping
    (P, S) float one-hot rows (zero rows past the targets); labels (P,) the targets' ids, IGNORE_INDEX past them;
    is_next: whether B follows A."""

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    perm_mask: np.ndarray
    target_mapping: np.ndarray
    labels: np.ndarray
    is_next: bool


def segment_layout(reuse: np.ndarray, a: np.ndarray, b: np.ndarray, sep: int, cls: int,
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, token_type_ids) of `reuse A <sep> B <sep> <cls>`: types 0 for reuse, A and its <sep>, 1 for B
    and its <sep>, 2 for <cls>."""
    ids = np.concatenate([reuse, a, [sep], b, [sep, cls]]).astype(np.int64)
    types = np.concatenate([np.zeros(len(reuse) + len(a) + 1), np.ones(len(b) + 1), [2]]).astype(np.int64)
    return ids, types


def plm_example(reuse: np.ndarray, a: np.ndarray, b: np.ndarray, is_next: bool, word_starts: np.ndarray,
                sep: int, cls: int, num_predict: int, rng: np.random.Generator, partial_k: int = 7) -> PLMExample:
    """The masks of one segment (see the module docstring): `num_predict` tokens chosen (num_predict - num_predict
    // 2 in the reuse part, num_predict // 2 in the rest), each part ordered on its own, the rest seeing the whole
    reuse part and the reuse part nothing of the rest. word_starts: (S,) for the laid-out segment."""
    ids, types = segment_layout(reuse, a, b, sep, cls)
    S, R = len(ids), len(reuse)
    functional = (ids == sep) | (ids == cls)
    rest_goal = num_predict // 2
    predicted = np.concatenate([span_mask(word_starts[:R], num_predict - rest_goal, rng, partial_k),
                                span_mask(word_starts[R:], rest_goal, rng, partial_k)])
    perm_mask = np.ones((S, S), dtype=bool)  # the reuse part sees nothing of the rest
    target = np.zeros(S, dtype=bool)
    for lo, hi in ((0, R), (R, S)):
        part, target[lo:hi], _ = factorisation_masks(predicted[lo:hi], functional[lo:hi], rng)
        perm_mask[lo:hi, lo:hi] = part
    perm_mask[R:, :R] = False  # the rest sees the whole reuse part
    positions = np.flatnonzero(target)[:num_predict]
    mapping = np.zeros((num_predict, S), dtype=np.float32)
    mapping[np.arange(len(positions)), positions] = 1.0
    labels = np.full(num_predict, IGNORE_INDEX, dtype=np.int64)
    labels[:len(positions)] = ids[positions]
    return PLMExample(ids, types, perm_mask, mapping, labels, is_next)


def split_a_b(stream: np.ndarray, start: int, length: int, rng: np.random.Generator,
              ) -> tuple[np.ndarray, np.ndarray, bool]:
    """A and B, `length` tokens together, for a segment whose A starts at `stream[start]`: A is the next 1 ..
    length - 1 tokens; with probability 1/2 B is what follows A (is_next True), otherwise a span of B's length
    from a random place of the stream that does not overlap A's (is_next False)."""
    cut = int(rng.integers(1, length))
    a = stream[start:start + cut]
    n_b = length - cut
    if rng.random() < 0.5:
        return a, stream[start + cut:start + length], True
    # a random span elsewhere: wholly before A, or wholly after the segment
    before, after = max(0, start - n_b + 1), max(0, len(stream) - n_b + 1 - (start + length))
    if before + after == 0:  # the stream holds no other span: B continues A after all
        return a, stream[start + cut:start + length], True
    k = int(rng.integers(before + after))
    place = k if k < before else start + length + (k - before)
    return a, stream[place:place + n_b], False


def row_segments(stream: np.ndarray, seq_len: int, reuse_len: int) -> list[int]:
    """The start offsets in a token stream of consecutive segments of `seq_len` laid-out tokens whose reuse parts
    follow each other (each segment starts reuse_len tokens after the previous one)."""
    body = seq_len - 3  # reuse + A + B
    step = reuse_len if reuse_len > 0 else body - reuse_len
    return list(range(0, len(stream) - body + 1, step))
