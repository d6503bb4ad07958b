"""Tests for `bertkit.data.masking`: exact selection counts, the 80/10/10 mix, whole words, static vs dynamic."""

from __future__ import annotations

import numpy as np
import pytest

from bertkit.data.masking import IGNORE_INDEX, mask_tokens, masking_rng

VOCAB = 1000
CLS, SEP, PAD, MASK = 1, 2, 0, 3
FIRST_ID = 10  # ordinary ids are drawn from [FIRST_ID, VOCAB)


def make_batch(rng: np.random.Generator, b: int = 2000, t: int = 128):
    """(ids, special_mask, word_starts): `[CLS] ... [SEP] [PAD]...` rows of random length, random word splits."""
    ids = rng.integers(FIRST_ID, VOCAB, size=(b, t))
    lengths = rng.integers(3, t + 1, size=b)
    pos = np.arange(t)
    ids[pos >= lengths[:, None]] = PAD
    ids[:, 0] = CLS
    ids[np.arange(b), lengths - 1] = SEP
    special = np.isin(ids, [CLS, SEP, PAD])
    starts = rng.random((b, t)) < 0.6  # words of 1-5+ pieces
    return ids, special, starts


def expected_counts(special: np.ndarray, p: float = 0.15, cap: int | None = None) -> np.ndarray:
    n = (~special).sum(axis=1)
    k = np.array([min(max(1, round(int(c) * p)), int(c)) for c in n])  # Python's round, as Google
    return k if cap is None else np.minimum(k, cap)


@pytest.fixture(scope="module")
def batch():
    return make_batch(np.random.default_rng(0))


@pytest.fixture(scope="module")
def masked(batch):
    ids, special, _ = batch
    return mask_tokens(ids, special, np.random.default_rng(1), vocab_size=VOCAB, mask_id=MASK)


def test_exact_count_per_row_and_never_a_special(batch, masked):
    ids, special, _ = batch
    out, labels = masked
    selected = labels != IGNORE_INDEX
    np.testing.assert_array_equal(selected.sum(axis=1), expected_counts(special))
    assert not (selected & special).any()
    assert abs(selected.sum() / (~special).sum() - 0.15) < 0.005  # exact counts: only rounding moves it
    assert out.dtype == np.int64 and labels.dtype == np.int64


def test_labels_and_unselected_positions(batch, masked):
    ids, special, _ = batch
    out, labels = masked
    selected = labels != IGNORE_INDEX
    np.testing.assert_array_equal(labels[selected], ids[selected])
    assert (labels[~selected] == IGNORE_INDEX).all()
    np.testing.assert_array_equal(out[~selected], ids[~selected])  # specials and pads included


def test_80_10_10(batch, masked):
    ids, special, _ = batch
    out, labels = masked
    sel = labels != IGNORE_INDEX
    n = sel.sum()
    assert n > 15000  # sd of the 80% share ≈ 0.003, of a 10% share ≈ 0.0023
    to_mask = (out[sel] == MASK).mean()
    kept = (out[sel] == ids[sel]).mean()
    randomised = ((out[sel] != MASK) & (out[sel] != ids[sel])).mean()
    # A random draw hits the original id with p ≈ 1/996, which moves ≈ 0.0001 from "random" to "kept".
    assert abs(to_mask - 0.8) < 0.015
    assert abs(kept - 0.1) < 0.015
    assert abs(randomised - 0.1) < 0.015
    assert abs(to_mask + kept + randomised - 1) < 1e-12
    # Default random ids exclude [MASK] and every id seen at a special position.
    replaced = out[sel & (out != ids) & (out != MASK)]
    assert not np.isin(replaced, [CLS, SEP, PAD, MASK]).any()
    assert replaced.min() >= 4 and replaced.max() < VOCAB


def test_random_ids_argument_limits_replacements(batch):
    ids, special, _ = batch
    allowed = np.array([500, 501, 502])
    out, labels = mask_tokens(ids[:200], special[:200], np.random.default_rng(2), vocab_size=VOCAB, mask_id=MASK,
                              random_ids=allowed)
    sel = labels != IGNORE_INDEX
    replaced = out[sel & (out != MASK) & (out != ids[:200])]
    assert replaced.size > 100 and np.isin(replaced, allowed).all()


def test_max_predictions_caps_the_count(batch):
    ids, special, _ = batch
    _, labels = mask_tokens(ids, special, np.random.default_rng(3), vocab_size=VOCAB, mask_id=MASK, max_predictions=7)
    counts = (labels != IGNORE_INDEX).sum(axis=1)
    np.testing.assert_array_equal(counts, expected_counts(special, cap=7))
    assert counts.max() == 7


def test_count_rule_rounds_half_to_even_and_keeps_at_least_one():
    rng = np.random.default_rng(4)
    for n, expected in ((3, 1), (10, 2), (30, 4), (50, 8), (0, 0)):  # 0.45→1, 1.5→2, 4.5→4, 7.5→8, none
        ids = np.full(n + 2, 50)
        special = np.zeros(n + 2, bool)
        special[[0, -1]] = True
        _, labels = mask_tokens(ids, special, rng, vocab_size=VOCAB, mask_id=MASK)
        assert labels.shape == (n + 2,)
        assert (labels != IGNORE_INDEX).sum() == expected


def word_ids(special: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Reference word numbering, one row at a time: a word opens at a start piece or right after a special."""
    out = np.full(special.shape, -1)
    for r in range(special.shape[0]):
        w = -1
        for i in range(special.shape[1]):
            if special[r, i]:
                continue
            if starts[r, i] or i == 0 or special[r, i - 1]:
                w += 1
            out[r, i] = w
    return out


def test_whole_word_selects_words_entirely(batch):
    ids, special, starts = batch
    ids, special, starts = ids[:500], special[:500], starts[:500]
    # Some rows start right after [CLS] with a continuation piece (its word's head was truncated away).
    starts[::3, 1] = False
    out, labels = mask_tokens(ids, special, np.random.default_rng(5), vocab_size=VOCAB, mask_id=MASK,
                              whole_word=True, word_starts=starts)
    sel = labels != IGNORE_INDEX
    words = word_ids(special, starts)
    target = expected_counts(special)
    counts = sel.sum(axis=1)
    assert (counts <= target).all() and not (sel & special).any()
    assert (counts == target).mean() > 0.8  # greedy filling usually hits the count exactly
    for r in range(sel.shape[0]):
        chosen = set(words[r, sel[r]])
        whole = np.isin(words[r], list(chosen)) & ~special[r]
        np.testing.assert_array_equal(sel[r], whole)  # every piece of a chosen word, nothing else
    # 80/10/10 is drawn per piece: a chosen word can be part [MASK], part original.
    mixed = sum(len(set((out[r][sel[r] & (words[r] == w)] == MASK).tolist())) == 2
                for r in range(100) for w in set(words[r, sel[r]]))
    assert mixed > 0
    assert abs((out[sel] == MASK).mean() - 0.8) < 0.02


def test_whole_word_skips_a_word_that_would_overflow():
    # One row: 9 words of 3 pieces then 1 single-piece word; n = 28 → target round(4.2) = 4 → one 3-piece word
    # and the single-piece word, whatever the order.
    starts = np.array([True] + [True, False, False] * 9 + [True] + [True])
    ids = np.arange(100, 130)
    special = np.zeros(30, bool)
    special[[0, -1]] = True
    for seed in range(20):
        _, labels = mask_tokens(ids, special, np.random.default_rng(seed), vocab_size=VOCAB, mask_id=MASK,
                                whole_word=True, word_starts=starts)
        sel = np.flatnonzero(labels != IGNORE_INDEX)
        assert len(sel) == 4 and 28 in sel


def test_whole_word_with_single_piece_words_matches_plain_counts(batch):
    ids, special, _ = batch
    _, labels = mask_tokens(ids[:300], special[:300], np.random.default_rng(6), vocab_size=VOCAB, mask_id=MASK,
                            whole_word=True, word_starts=np.ones_like(special[:300]))
    np.testing.assert_array_equal((labels != IGNORE_INDEX).sum(axis=1), expected_counts(special[:300]))


def test_selection_is_uniform_over_positions():
    # 4,000 rows of 62 content tokens: 9 selected per row, so every position is chosen with p = 9/62 (sd ≈ 0.6%).
    ids = np.random.default_rng(7).integers(FIRST_ID, VOCAB, size=(4000, 64))
    special = np.zeros_like(ids, dtype=bool)
    special[:, [0, -1]] = True
    _, labels = mask_tokens(ids, special, np.random.default_rng(8), vocab_size=VOCAB, mask_id=MASK)
    rate = (labels != IGNORE_INDEX)[:, 1:-1].mean(axis=0)
    assert (np.abs(rate - 9 / 62) < 0.025).all()


def test_argument_checks():
    ids = np.arange(10, 20)
    special = np.zeros(10, bool)
    with pytest.raises(ValueError, match="word_starts"):
        mask_tokens(ids, special, np.random.default_rng(0), vocab_size=VOCAB, mask_id=MASK, whole_word=True)
    with pytest.raises(ValueError, match="shape"):
        mask_tokens(ids, special[:5], np.random.default_rng(0), vocab_size=VOCAB, mask_id=MASK)
    with pytest.raises(ValueError, match="mask_prob"):
        mask_tokens(ids, special, np.random.default_rng(0), vocab_size=VOCAB, mask_id=MASK, mask_prob=1.5)


# ------------------------------------------------------------------------------------ static vs dynamic


def mask_with(rng: np.random.Generator, batch) -> np.ndarray:
    ids, special, _ = batch
    return mask_tokens(ids[:8], special[:8], rng, vocab_size=VOCAB, mask_id=MASK)[1]


def test_same_generator_state_gives_same_masks(batch):
    a = mask_with(np.random.default_rng(9), batch)
    np.testing.assert_array_equal(a, mask_with(np.random.default_rng(9), batch))
    assert not np.array_equal(a, mask_with(np.random.default_rng(10), batch))


def test_static_masking_repeats_every_dupe_factor_epochs(batch):
    dupe = 4
    masks = [mask_with(masking_rng(seed=1, epoch=e, index=17, dupe_factor=dupe), batch) for e in range(3 * dupe)]
    for e in range(dupe, 3 * dupe):
        np.testing.assert_array_equal(masks[e], masks[e % dupe])
    distinct = {m.tobytes() for m in masks}
    assert len(distinct) == dupe  # dupe_factor different copies, no more, no fewer
    other = mask_with(masking_rng(seed=1, epoch=0, index=18, dupe_factor=dupe), batch)
    assert not np.array_equal(other, masks[0])  # each instance has its own masks


def test_dynamic_masking_is_fresh_every_epoch_and_reproducible(batch):
    masks = [mask_with(masking_rng(seed=1, epoch=e, index=17), batch) for e in range(12)]
    assert len({m.tobytes() for m in masks}) == 12
    np.testing.assert_array_equal(masks[5], mask_with(masking_rng(seed=1, epoch=5, index=17), batch))
    assert not np.array_equal(masks[0], mask_with(masking_rng(seed=2, epoch=0, index=17), batch))


def test_masking_rng_argument_checks():
    with pytest.raises(ValueError):
        masking_rng(seed=-1, epoch=0, index=0)
    with pytest.raises(ValueError):
        masking_rng(seed=0, epoch=0, index=0, dupe_factor=0)
