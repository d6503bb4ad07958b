"""SQuAD's sliding windows and Google's span post-processing (bertkit.tasks.squad_windows), by hand."""

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertkit.tasks.squad_windows import char_span_to_token_span, make_windows, postprocess

CLS, SEP, PAD = 1, 2, 0
CONTEXT = "alpha beta gamma delta epsilon zeta eta theta iota"  # 9 words: c0 .. c8


def whitespace_tokens(text):
    """A stand-in tokenizer: one token per word, ids 10, 11, ..., with character offsets."""
    offsets = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    return [10 + i for i in range(len(offsets))], offsets


def two_windows(**kwargs):
    # T = 12 with a 2-token question leaves 7 passage tokens; stride 3 → windows over c0..c6 and c3..c8.
    ids, offsets = whitespace_tokens(CONTEXT)
    return make_windows([5, 6], ids, offsets, qid="q", context=CONTEXT, cls_id=CLS, sep_id=SEP, pad_id=PAD,
                        max_seq_length=12, doc_stride=3, **kwargs)


# ---------------------------------------------------------------------------------------------------------------
# Windows


def test_window_layout_and_max_context():
    w0, w1 = two_windows()
    assert w0.input_ids == [CLS, 5, 6, SEP, 10, 11, 12, 13, 14, 15, 16, SEP]
    assert w0.token_type_ids == [0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1]
    assert w0.attention_mask == [1] * 12
    assert w1.input_ids == [CLS, 5, 6, SEP, 13, 14, 15, 16, 17, 18, SEP, PAD]
    assert w1.token_type_ids == [0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0]
    assert w1.attention_mask == [1] * 11 + [0]
    assert (w0.doc_start, w1.doc_start) == (0, 3)
    assert w0.offsets[:4] == [None] * 4 and w0.offsets[4] == (0, 5) and w0.offsets[11] is None
    assert w1.offsets[4:10] == [(17, 22), (23, 30), (31, 35), (36, 39), (40, 45), (46, 50)]
    assert w1.offsets[10:] == [None, None]
    # Scores min(left, right) + 0.01·len: c3 3.07 vs 0.06, c4 2.07 vs 1.06 → window 0; c5 1.07 vs 2.06,
    # c6 0.07 vs 2.06 → window 1.
    f, t = False, True
    assert w0.token_is_max_context == [f, f, f, f, t, t, t, t, t, f, f, f]
    assert w1.token_is_max_context == [f, f, f, f, f, f, t, t, t, t, f, f]
    assert w0.start_position is None and w0.context is CONTEXT


def test_training_positions():
    w0, w1 = two_windows(answer=("zeta eta", 31))  # c5..c6: inside both windows
    assert (w0.start_position, w0.end_position) == (9, 10)
    assert (w1.start_position, w1.end_position) == (6, 7)
    w0, w1 = two_windows(answer=("theta iota", 40))  # c7..c8: only in window 1
    assert (w0.start_position, w0.end_position) == (0, 0)
    assert (w1.start_position, w1.end_position) == (8, 9)
    assert [(w.start_position, w.end_position) for w in two_windows(is_impossible=True)] == [(0, 0), (0, 0)]


def test_question_truncation_and_no_room():
    ids, offsets = whitespace_tokens("a b")
    (window,) = make_windows([5, 6, 7, 8], ids, offsets, qid="q", context="a b", cls_id=CLS, sep_id=SEP,
                             max_seq_length=8, doc_stride=2, max_query_length=2, pad_to_max_length=False)
    assert window.input_ids == [CLS, 5, 6, SEP, 10, 11, SEP]
    with pytest.raises(ValueError, match="leaves no room"):
        make_windows([5, 6, 7], ids, offsets, qid="q", context="a b", cls_id=CLS, sep_id=SEP, max_seq_length=6)


def test_char_span_to_token_span_with_sub_words():
    offsets = [(0, 2), (2, 9), (10, 12), (13, 16)]  # "un" "##happy" "is" "bad" in "unhappy is bad"
    assert char_span_to_token_span(offsets, 2, 7) == (1, 1)  # "happy" lies inside one sub-word
    assert char_span_to_token_span(offsets, 0, 12) == (0, 2)
    assert char_span_to_token_span(offsets, 9, 10) is None  # the space between tokens
    ids, _ = whitespace_tokens("unhappy is bad")
    with pytest.raises(ValueError, match="covers no context token"):
        make_windows([5], [10, 11, 12, 13], offsets, qid="q", context="unhappy is bad", cls_id=CLS, sep_id=SEP,
                     answer=(" ", 9))


@settings(max_examples=80, deadline=None)
@given(n=st.integers(0, 30), q=st.integers(0, 4), room=st.integers(1, 12), stride=st.integers(1, 8),
       data=st.data())
def test_windows_cover_every_token_once_at_max_context(n, q, room, stride, data):
    context = " ".join(f"w{i}" for i in range(n))
    ids, offsets = whitespace_tokens(context)
    answer = None
    if n:
        first = data.draw(st.integers(0, n - 1))
        last = data.draw(st.integers(first, n - 1))
        answer = (context[offsets[first][0]:offsets[last][1]], offsets[first][0])
    windows = make_windows(list(range(50, 50 + q)), ids, offsets, qid="q", context=context, cls_id=CLS,
                           sep_id=SEP, max_seq_length=q + 3 + room, doc_stride=stride, answer=answer)
    assert all(len(w.input_ids) == q + 3 + room for w in windows)
    best = [0] * n
    for w in windows:
        for pos, (offset, is_max) in enumerate(zip(w.offsets, w.token_is_max_context)):
            if offset is not None:
                token = w.doc_start + pos - (q + 2)
                assert w.input_ids[pos] == ids[token] and offset == offsets[token]
                best[token] += is_max
        if answer is not None and w.start_position:
            assert w.input_ids[w.start_position:w.end_position + 1] == ids[first:last + 1]
    assert best == [1] * n  # every token is scored in exactly one window
    if answer is not None:
        # The target is set exactly in the windows that hold the whole answer, and (0, 0) elsewhere.
        holds = [w.doc_start <= first and last < w.doc_start + sum(o is not None for o in w.offsets) for w in windows]
        assert [w.start_position > 0 for w in windows] == holds
        if stride == 1:  # with stride 1 every answer that fits in a window lies wholly inside one
            assert any(holds) == (last - first + 1 <= room)


# ---------------------------------------------------------------------------------------------------------------
# Post-processing


def two_window_logits():
    # Window 0 strongly prefers "zeta" (c5, position 9), but c5 has its max context in window 1, so that
    # candidate is dropped; window 1 prefers "zeta eta" (positions 6-7) over "zeta" (6-6).
    s0, e0, s1, e1 = ([-10.0] * 12 for _ in range(4))
    s0[9], e0[9] = 10.0, 10.0
    s1[6], e1[7], e1[6] = 5.0, 5.0, 4.0
    return [s0, s1], [e0, e1]


def test_best_span_in_second_window_by_max_context_rule():
    starts, ends = two_window_logits()
    predictions, null_odds, nbest = postprocess(two_windows(), starts, ends)
    assert predictions == {"q": "zeta eta"} and null_odds == {}
    top = [(n["text"], n["start_logit"], n["end_logit"]) for n in nbest["q"][:3]]
    # Third: window 0's best legal span, start c0 (first of the tied -10 starts) to c5, score -10 + 10 = 0.
    assert top == [("zeta eta", 5.0, 5.0), ("zeta", 5.0, 4.0), ("alpha beta gamma delta epsilon zeta", -10.0, 10.0)]
    probs = [n["probability"] for n in nbest["q"]]
    assert sum(probs) == pytest.approx(1.0) and probs[0] / probs[1] == pytest.approx(math.e)
    assert len({n["text"] for n in nbest["q"]}) == len(nbest["q"]) <= 20  # texts are deduplicated


def test_max_answer_length_and_no_candidate():
    starts, ends = two_window_logits()
    predictions, _, _ = postprocess(two_windows(), starts, ends, max_answer_length=1)
    assert predictions == {"q": "zeta"}
    predictions, null_odds, nbest = postprocess(two_windows(), starts, ends, max_answer_length=0)
    assert predictions == {"q": ""} and nbest == {"q": []}
    predictions, null_odds, _ = postprocess(two_windows(), starts, ends, max_answer_length=0, version_2=True)
    assert predictions == {"q": ""} and null_odds == {"q": math.inf}


def test_v2_null_score_is_min_over_windows():
    starts, ends = two_window_logits()
    starts[0][0], ends[0][0] = 1.0, 1.0  # null score 2.0 in window 0
    starts[1][0], ends[1][0] = 0.5, 0.0  # null score 0.5 in window 1: the minimum
    predictions, null_odds, nbest = postprocess(two_windows(), starts, ends, version_2=True)
    assert null_odds == {"q": 0.5 - 10.0}
    assert predictions == {"q": "zeta eta"}
    assert [(n["text"], n["start_logit"], n["end_logit"]) for n in nbest["q"][2:3]] == [("", 0.5, 0.0)]


def one_window_v2(null_threshold):
    context = "alpha beta gamma"
    ids, offsets = whitespace_tokens(context)
    windows = make_windows([5], ids, offsets, qid="v2", context=context, cls_id=CLS, sep_id=SEP, max_seq_length=8)
    starts, ends = [-10.0] * 8, [-10.0] * 8
    starts[0], ends[0] = 2.0, 1.0  # s_null = 3
    starts[3], ends[4] = 2.0, 2.0  # "alpha beta" (positions 3-4): s_best = 4
    return postprocess(windows, [starts], [ends], version_2=True, null_threshold=null_threshold)


def test_null_threshold_rule_both_ways():
    # score_diff = s_null − s_best = 3 − 4 = −1; answer "" iff score_diff > threshold.
    predictions, null_odds, nbest = one_window_v2(0.0)
    assert predictions == {"v2": "alpha beta"} and null_odds == {"v2": -1.0}
    assert [n["text"] for n in nbest["v2"][:2]] == ["alpha beta", ""]
    assert one_window_v2(-1.5)[0] == {"v2": ""}
    assert one_window_v2(-1.0)[0] == {"v2": "alpha beta"}  # a tie keeps the span
    assert one_window_v2(math.inf)[0] == {"v2": "alpha beta"}
