"""Masked-language-model corruption: which positions to predict and what the model sees there.

The rules are BERT's (google-research/bert `create_masked_lm_predictions`), applied to a padded batch:

* selection: per row, exactly `min(max_predictions, max(1, round(n * mask_prob)))` positions among the n
  non-special ones — a fixed count rather than a Bernoulli draw per token, so every row of a given length
  predicts the same number of tokens (cramming's static-shape argument, and Google's own rule, though Google
  counts the specials in n);
* whole-word masking: a word (a word-start piece and the non-start pieces after it) is selected entirely or not
  at all; words are visited in random order and added while the selected pieces stay within the count, a word
  that would overflow it being skipped (Google's logic);
* corruption: each selected position independently becomes [MASK] with probability 0.8, a random token with
  probability 0.1, and stays unchanged with probability 0.1 (per piece, also under whole-word masking, as Google).

Static versus dynamic masking is only a question of which generator a row is masked with: `masking_rng`.
Everything is a pure function of its arguments and the generator state.
"""

from __future__ import annotations

import numpy as np

# Label of a position the loss ignores (torch.nn.CrossEntropyLoss's default ignore_index).
IGNORE_INDEX = -100
# BERT's corruption mix for a selected position.
MASK_FRACTION = 0.8  # → [MASK]
RANDOM_FRACTION = 0.1  # → a random token; the remaining 0.1 keep the original token


def _prediction_counts(n_candidates: np.ndarray, mask_prob: float, max_predictions: int | None) -> np.ndarray:
    """(B,) number of tokens to predict per row: round(n * p), at least 1 when there is a candidate, capped.

    np.rint rounds halves to even, like Python 3's round() in Google's script."""
    counts = np.maximum(1, np.rint(n_candidates * mask_prob).astype(np.int64))
    if max_predictions is not None:
        counts = np.minimum(counts, max_predictions)
    return np.minimum(counts, n_candidates)


def _word_index(candidates: np.ndarray, word_starts: np.ndarray) -> np.ndarray:
    """(B, T) int64: index of the word each candidate position belongs to, within its row (-1 on non-candidates).

    A word begins at a word-start piece, and also at any candidate whose predecessor is not a candidate: a
    continuation piece right after [CLS]/[SEP] (its head was truncated away) must not join the previous word
    across a special token."""
    prev_special = np.ones_like(candidates)
    prev_special[:, 1:] = ~candidates[:, :-1]
    begins = candidates & (word_starts | prev_special)
    index = np.cumsum(begins, axis=1) - 1
    return np.where(candidates, index, -1)


def _select(candidates: np.ndarray, word: np.ndarray, counts: np.ndarray, rng: np.random.Generator,
            one_piece: bool = False) -> np.ndarray:
    """(B, T) bool selection: words in random order, each taken if it keeps the row's total within its count.
    one_piece: every word is one piece (each candidate its own word), which spares counting the pieces."""
    b, t = candidates.shape
    n_words = word.max(axis=1) + 1  # (B,)
    w = max(int(n_words.max()), 1)
    rows = np.broadcast_to(np.arange(b)[:, None], (b, t))
    if one_piece:
        lengths = (np.arange(w) < n_words[:, None]).astype(np.int64)
    else:
        flat = (rows * w + word)[candidates]
        lengths = np.bincount(flat, minlength=b * w).reshape(b, w)  # (B, W) pieces per word; 0 past the last word
    keys = rng.random((b, w))
    keys[lengths == 0] = 2.0  # absent words sort last
    if one_piece or lengths.max(initial=0) <= 1:
        # Words of one piece (no whole-word masking): the loop below takes the first counts[i] words of the
        # visiting order (the present words come first, and counts <= the words present), that is the words whose
        # keys are the counts[i] smallest; found by a threshold (a sort of the keys, not an argsort) unless two
        # keys tie at it, where the stable order decides
        top = np.sort(keys, axis=1)[np.arange(b), np.maximum(counts - 1, 0)]
        taken = (keys <= top[:, None]) & (counts > 0)[:, None]
        if np.array_equal(taken.sum(axis=1), counts):
            return candidates & np.take_along_axis(taken, np.maximum(word, 0), axis=1)
    order = np.argsort(keys, axis=1, kind="stable")  # (B, W) a random visiting order of each row's words
    if lengths.max(initial=0) <= 1:
        taken_sorted = np.arange(w) < counts[:, None]
    else:
        sorted_lengths = np.take_along_axis(lengths, order, axis=1)
        taken_sorted = np.zeros((b, w), dtype=bool)
        total = np.zeros(b, dtype=np.int64)
        # Sequential over words, vectorised over rows. Google breaks once the count is reached; continuing is the
        # same, since every further word has ≥ 1 piece and would overflow.
        for k in range(w):
            fits = (sorted_lengths[:, k] > 0) & (total + sorted_lengths[:, k] <= counts)
            taken_sorted[:, k] = fits
            total += np.where(fits, sorted_lengths[:, k], 0)
            if (total >= counts).all():  # every row is full: no later word can fit (each has >= 1 piece)
                break
    taken = np.zeros((b, w), dtype=bool)
    np.put_along_axis(taken, order, taken_sorted, axis=1)
    return candidates & taken[rows, np.maximum(word, 0)]


def mask_tokens(input_ids: np.ndarray, special_mask: np.ndarray, rng: np.random.Generator, *, vocab_size: int,
                mask_id: int, mask_prob: float = 0.15, max_predictions: int | None = None, whole_word: bool = False,
                word_starts: np.ndarray | None = None,
                random_ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """BERT's MLM corruption of a batch.

    Args:
        input_ids: (B, T) or (T,) integer ids.
        special_mask: same shape, bool: True at [CLS]/[SEP]/[PAD] (never selected, not counted).
        rng: source of every random choice; draws are a fixed sequence of whole-batch arrays, so the result
            depends only on the arguments and the generator state.
        vocab_size: size of the vocabulary (for the default `random_ids`).
        mask_id: the [MASK] id.
        mask_prob: fraction of non-special positions to predict, in [0, 1].
        max_predictions: cap on predicted positions per row (Google's max_predictions_per_seq); None: no cap.
        whole_word: select whole words (needs `word_starts`).
        word_starts: same shape, bool: True on the first piece of each word (values at special positions unused).
        random_ids: 1-D ids the 10% random replacement draws from, uniformly. Default: range(vocab_size) without
            mask_id and without every id found at a special position of this batch ([CLS], [SEP], [PAD]), so a
            random replacement is never a special token. Pass the vocabulary's non-special ids to also rule out
            specials absent from the batch ([UNK], unused slots).

    Returns:
        (masked_ids, labels), both int64 and shaped like `input_ids`: masked_ids is input_ids with the selected
        positions corrupted (80% mask_id, 10% random id, 10% unchanged); labels holds the original id at selected
        positions and IGNORE_INDEX (-100) everywhere else.
    """
    ids = np.asarray(input_ids)
    special = np.asarray(special_mask, dtype=bool)
    if ids.shape != special.shape or ids.ndim not in (1, 2):
        raise ValueError(f"input_ids {ids.shape} and special_mask {special.shape} must share a (B, T) or (T,) shape")
    if not 0.0 <= mask_prob <= 1.0:
        raise ValueError(f"mask_prob must be in [0, 1], got {mask_prob}")
    if max_predictions is not None and max_predictions < 0:
        raise ValueError(f"max_predictions must be >= 0, got {max_predictions}")
    single = ids.ndim == 1
    ids2, special2 = np.atleast_2d(ids).astype(np.int64), np.atleast_2d(special)
    candidates = ~special2

    if whole_word:
        if word_starts is None:
            raise ValueError("whole_word=True needs word_starts")
        starts = np.atleast_2d(np.asarray(word_starts, dtype=bool))
        if starts.shape != ids2.shape:
            raise ValueError(f"word_starts {np.shape(word_starts)} must have the shape of input_ids {ids.shape}")
        word = _word_index(candidates, starts)
    else:  # every piece is its own word: the candidates numbered from 0 in each row
        word = np.where(candidates, np.cumsum(candidates, axis=1) - 1, -1)
    counts = _prediction_counts(candidates.sum(axis=1), mask_prob, max_predictions)
    selected = _select(candidates, word, counts, rng, one_piece=not whole_word)

    if random_ids is None:
        excluded = np.union1d(np.unique(ids2[special2]), [mask_id])
        random_ids = np.setdiff1d(np.arange(vocab_size, dtype=np.int64), excluded)
    random_ids = np.asarray(random_ids, dtype=np.int64).reshape(-1)
    if random_ids.shape[0] == 0:
        raise ValueError("no ids to draw random replacements from")

    # One uniform per position decides its fate; one random id per position is drawn whether used or not, so the
    # generator advances by the same amount for every batch shape (reproducible streams).
    fate = rng.random(ids2.shape)
    replacement = random_ids[rng.integers(0, random_ids.shape[0], size=ids2.shape)]
    masked = ids2.copy()
    to_mask = selected & (fate < MASK_FRACTION)
    to_random = selected & (fate >= MASK_FRACTION) & (fate < MASK_FRACTION + RANDOM_FRACTION)
    masked[to_mask] = mask_id
    masked[to_random] = replacement[to_random]
    labels = np.where(selected, ids2, IGNORE_INDEX).astype(np.int64)
    if single:
        return masked[0], labels[0]
    return masked, labels


def masking_rng(seed: int, epoch: int, index: int, dupe_factor: int | None = None) -> np.random.Generator:
    """The generator to mask instance `index` with in epoch `epoch`.

    Static masking (original BERT, `dupe_factor` = number of masked copies made once, offline): the stream
    depends on (seed, index, epoch % dupe_factor), so instance `index` cycles through the same `dupe_factor`
    masks, epoch after epoch. Dynamic masking (RoBERTa, `dupe_factor=None`): the stream depends on
    (seed, epoch, index), a fresh mask every time the instance is seen. Either way it depends on nothing else —
    not on rank, worker or batch composition — so a resumed or re-sharded run masks each instance identically.

    All arguments are non-negative integers; the leading 0/1 word keeps the two modes' streams apart.
    """
    if min(seed, epoch, index) < 0:
        raise ValueError(f"seed, epoch and index must be >= 0, got {(seed, epoch, index)}")
    if dupe_factor is None:
        return np.random.default_rng([seed, 1, epoch, index])
    if dupe_factor < 1:
        raise ValueError(f"dupe_factor must be >= 1, got {dupe_factor}")
    return np.random.default_rng([seed, 0, epoch % dupe_factor, index])


_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment: 2^64 / the golden ratio, odd


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's output function on uint64 arrays (Steele, Lea and Flood 2014): a bijection whose outputs for
    consecutive inputs pass BigCrush; numpy's uint64 array arithmetic wraps modulo 2^64, as it must here."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def row_uniforms(seed: int, step: int, micro: int, first_row: int, rows: int, width: int) -> np.ndarray:
    """(rows, width) float64 uniforms in [0, 1) for global rows first_row .. first_row + rows - 1 of micro-batch
    `micro` of optimizer step `step`: a counter-based draw, so each number depends on (seed, step, micro, global
    row, position) and on nothing else — not on the rank a row lands on, the world size, or any RNG state.

    Why: ELECTRA's generator samples its replacements on the device; drawn from a rank's own RNG stream they
    would differ between 1 and N processes that train on the same rows. Rank r of a run whose ranks take B rows
    each passes first_row = r x B (the loader's lanes are numbered so). Each (key, position) is one splitmix64
    output: 53 random bits, u = bits x 2^-53."""
    if min(seed, step, micro, first_row, rows, width) < 0:
        raise ValueError(f"seed, step, micro, first_row, rows and width must be >= 0, got "
                         f"{(seed, step, micro, first_row, rows, width)}")
    golden = np.uint64(_GOLDEN)
    key = np.zeros(1, dtype=np.uint64)
    for part in (seed % 2**64, step, micro):  # chain: each word mixed into the key so far
        key = _splitmix64(key ^ _splitmix64(np.array([part], dtype=np.uint64) + golden))
    row = _splitmix64(key ^ _splitmix64(np.arange(first_row, first_row + rows, dtype=np.uint64) + golden))
    counter = row[:, None] + golden * np.arange(1, width + 1, dtype=np.uint64)[None, :]  # splitmix64's own stream
    return (_splitmix64(counter) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
