"""XLNet's permutation LM data (bertkit.data.permutation): the exact count of predicted tokens, what every position
may see in the factorisation order, no target seeing its own content (in the masks and through the model's query
stream), the segment layout, the 50/50 next-segment rule and consecutive segments for the memory."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bertkit.config import IGNORE_INDEX, XLNetConfig
from bertkit.data.loader import xlnet_rows
from bertkit.data.permutation import (factorisation_masks, plm_example, row_segments, segment_layout, span_mask,
                                      split_a_b)
from bertkit.models import XLNetLMHeadModel

SEP, CLS = 4, 3


@settings(max_examples=60, deadline=None)
@given(length=st.integers(1, 80), goal=st.integers(0, 90), seed=st.integers(0, 2**16), k=st.integers(2, 8),
       word_every=st.integers(1, 4))
def test_span_mask_predicts_exactly_the_goal(length, goal, seed, k, word_every):
    starts = np.arange(length) % word_every == 0
    mask = span_mask(starts, goal, np.random.default_rng(seed), partial_k=k)
    assert mask.dtype == bool and mask.shape == (length,)
    assert mask.sum() == min(goal, length)
    again = span_mask(starts, goal, np.random.default_rng(seed), partial_k=k)
    assert np.array_equal(mask, again)  # a pure function of its generator


def test_span_mask_spans_start_at_words_and_keep_about_one_in_k():
    """With room for every span, no top-up is needed: each span starts at a word and the predicted share of a long
    sequence is about 1/K (each span of n tokens has (K - 1) n context tokens around it)."""
    rng = np.random.default_rng(0)
    length, k = 7000, 7
    starts = np.ones(length, dtype=bool)
    starts[1::3] = False  # words of 3 pieces... mostly
    starts[2::3] = False
    mask = span_mask(starts, None, rng, partial_k=k)  # no goal: spans until the end
    begins = np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))
    assert starts[begins].all()
    assert 1 / (k + 1) < mask.mean() < 1 / (k - 1)


@settings(max_examples=60, deadline=None)
@given(length=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_factorisation_rules(length, seed):
    rng = np.random.default_rng(seed)
    predicted = rng.random(length) < 0.3
    functional = rng.random(length) < 0.1
    perm, target, order = factorisation_masks(predicted, functional, rng)
    plain = ~predicted & ~functional
    assert np.array_equal(target, predicted & ~functional)
    assert (order[plain] == -1).all() and sorted(order[~plain]) == sorted(set(order[~plain]))
    sees = ~perm
    for i in range(length):
        for j in range(length):
            if plain[i]:
                want = plain[j]  # plain tokens see exactly the plain tokens
            elif target[i]:
                want = plain[j] or order[j] < order[i]  # strictly earlier in the order: never itself
            else:
                want = plain[j] or order[j] <= order[i]
            assert sees[i, j] == want, (i, j)
    assert not sees[target, target].any()  # no target sees its own content


def example(seed=0, reuse=12, a_len=9, b_len=7, num_predict=8):
    rng = np.random.default_rng(seed)
    reuse_ids, a, b = (rng.integers(10, 99, n) for n in (reuse, a_len, b_len))
    starts = np.ones(reuse + a_len + b_len + 3, dtype=bool)
    return plm_example(reuse_ids, a, b, True, starts, SEP, CLS, num_predict, rng)


def test_segment_layout_and_types():
    ids, types = segment_layout(np.array([11, 12]), np.array([21]), np.array([31, 32]), SEP, CLS)
    assert ids.tolist() == [11, 12, 21, SEP, 31, 32, SEP, CLS]
    assert types.tolist() == [0, 0, 0, 0, 1, 1, 1, 2]


@pytest.mark.parametrize("seed", range(5))
def test_plm_example_parts_targets_and_mapping(seed):
    R, P = 12, 8
    ex = example(seed, reuse=R, num_predict=P)
    S = len(ex.input_ids)
    targets = ex.target_mapping.sum(0) > 0
    n = int(targets.sum())
    # every predicted token is a target unless it fell on <sep>/<cls>, which are never targets
    assert n <= P and not targets[(ex.input_ids == SEP) | (ex.input_ids == CLS)].any()
    assert (ex.target_mapping.sum(1) <= 1).all() and ex.target_mapping[:n].sum() == n
    assert (ex.labels[:n] == ex.input_ids[np.argmax(ex.target_mapping[:n], 1)]).all()
    assert (ex.labels[n:] == IGNORE_INDEX).all()
    assert ex.perm_mask[:R, R:].all()  # the reuse part sees nothing of the rest
    assert not ex.perm_mask[R:, :R].any()  # the rest sees the whole reuse part
    assert ex.perm_mask[targets, targets].all()  # no target sees itself
    assert S == R + 9 + 7 + 3


def test_predicted_count_is_exact_without_functional_tokens():
    """num_predict - num_predict // 2 tokens in the reuse part, num_predict // 2 in the rest: with no room for
    <sep>/<cls> to be picked (predictions only where they can go), the count of targets is num_predict."""
    counts = [int(example(s, reuse=40, a_len=30, b_len=30, num_predict=9).target_mapping.sum()) for s in range(20)]
    # the rest has 63 tokens of which 3 functional: a pick may land there, so the count is 9 or a little less
    assert max(counts) == 9 and min(counts) >= 6


def test_query_stream_never_sees_its_own_content_nor_later_tokens():
    """Through the model: changing a target's token, and every token later in its order, leaves its prediction's
    logits unchanged; changing an earlier token changes them."""
    torch.manual_seed(0)
    model = XLNetLMHeadModel(XLNetConfig(vocab_size=99, d_model=32, n_layer=2, n_head=4, d_inner=37,
                                         dropout=0.0)).eval()
    rng = np.random.default_rng(3)
    predicted = np.zeros(16, dtype=bool)
    predicted[[2, 5, 6, 11]] = True
    perm, target, order = factorisation_masks(predicted, np.zeros(16, dtype=bool), rng)
    positions = np.flatnonzero(target)
    mapping = torch.zeros(1, len(positions), 16)
    mapping[0, torch.arange(len(positions)), torch.from_numpy(positions)] = 1
    ids = torch.from_numpy(rng.integers(10, 99, (1, 16)))
    perm_mask = torch.from_numpy(perm)[None].float()

    def logits(x):
        with torch.no_grad():
            return model(x, perm_mask=perm_mask, target_mapping=mapping).logits[0]

    base = logits(ids)
    for p, i in enumerate(positions):
        later = [j for j in positions if order[j] >= order[i]]
        changed = ids.clone()
        changed[0, later] = (changed[0, later] + 7) % 89 + 10
        torch.testing.assert_close(logits(changed)[p], base[p], atol=1e-6, rtol=0)
        earlier = [j for j in range(16) if not target[j]]
        changed = ids.clone()
        changed[0, earlier] = (changed[0, earlier] + 7) % 89 + 10
        assert not torch.allclose(logits(changed)[p], base[p])


def test_next_segment_rule_is_fifty_fifty_and_b_continues_a():
    stream = np.arange(1000)
    nexts = 0
    for seed in range(2000):
        a, b, is_next = split_a_b(stream, 400, 50, np.random.default_rng(seed))
        assert len(a) + len(b) == 50 and a[0] == 400 and len(a) >= 1 and len(b) >= 1
        if is_next:
            assert b[0] == a[-1] + 1 and (np.diff(b) == 1).all()
            nexts += 1
        else:  # from elsewhere: wholly before A or wholly after the segment
            assert b[-1] < 400 or b[0] >= 450
    assert abs(nexts / 2000 - 0.5) < 0.04  # 4.5 standard deviations


def test_consecutive_segments_of_a_row_continue_each_other():
    assert row_segments(np.arange(100), seq_len=20, reuse_len=5) == list(range(0, 100 - 17 + 1, 5))
    docs = [([np.arange(i * 1000, i * 1000 + 300)], [np.ones(300, dtype=bool)]) for i in range(2)]
    segments = xlnet_rows(docs, seq_len=20, reuse_len=5, rows=3)
    assert len(segments) % 3 == 0
    for r in range(3):
        row = segments[r::3]
        assert row[0].first and not any(s.first for s in row[1:])
        for before, after in zip(row, row[1:]):  # the next reuse part starts where this one ends
            assert after.start == before.start + 5
            assert after.tokens[after.start] == before.tokens[before.start + 5]
