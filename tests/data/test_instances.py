"""Tests for `bertkit.data.instances`: the NSP/SOP pair rules, truncation, RoBERTa packing and collation.

Corpora here give every token a unique id (10 + its position in the corpus), so an instance's content can be
traced back to the exact document and sentence it came from.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertkit.data.instances import (
    DocumentSource,
    Instance,
    ListDocuments,
    SpecialIds,
    create_nsp_instances,
    create_sop_instances,
    pack_doc_sentences,
    pack_full_sentences,
    pad_instances,
    truncate_pair,
)

SPECIAL = SpecialIds(cls=1, sep=2, pad=0, mask=3)
FIRST_ID = 10  # corpus tokens are FIRST_ID, FIRST_ID + 1, ...: never a special id


def make_corpus(sentence_lengths: list[list[int]]) -> tuple[ListDocuments, np.ndarray, np.ndarray, list[list[np.ndarray]]]:
    """Corpus with unique consecutive ids; returns (docs, doc_of[id], sentence_start[id] (bool), raw sentences)."""
    raw, next_id, doc_of, is_start = [], FIRST_ID, [], []
    for d, lengths in enumerate(sentence_lengths):
        doc = []
        for n in lengths:
            doc.append(np.arange(next_id, next_id + n))
            doc_of += [d] * n
            is_start += [True] + [False] * (n - 1)
            next_id += n
        raw.append(doc)
    pad = [-1] * FIRST_ID
    return ListDocuments(raw), np.array(pad + doc_of), np.array([False] * FIRST_ID + is_start), raw


def random_lengths(rng: np.random.Generator, n_docs: int, n_sent: tuple[int, int], sent_len: tuple[int, int]):
    return [list(rng.integers(*sent_len, size=rng.integers(*n_sent))) for _ in range(n_docs)]


def segments(x: Instance) -> tuple[np.ndarray, np.ndarray]:
    """(A, B) of a pair instance, checking the `[CLS] A [SEP] B [SEP]` layout on the way."""
    seps = np.flatnonzero(x.input_ids == SPECIAL.sep)
    assert x.input_ids[0] == SPECIAL.cls and len(seps) == 2 and seps[1] == len(x) - 1
    return x.input_ids[1:seps[0]], x.input_ids[seps[0] + 1:-1]


def all_instances(make, docs, max_seq_length, short_seq_prob, seed):
    rng = np.random.default_rng(seed)
    return [(d, x) for d in range(len(docs)) for x in make(docs, d, max_seq_length, short_seq_prob, rng, SPECIAL)]


def is_consecutive(a: np.ndarray) -> bool:
    return bool(np.all(np.diff(a) == 1))


# ------------------------------------------------------------------------------------------ truncate_pair


def reference_lengths(la: int, lb: int, max_num_tokens: int) -> tuple[int, int]:
    """Longest-first lengths, one token at a time (b on a tie), as Google's loop does it."""
    while la + lb > max_num_tokens:
        if la > lb:
            la -= 1
        else:
            lb -= 1
    return la, lb


@settings(max_examples=150, deadline=None, database=None)
@given(la=st.integers(0, 40), lb=st.integers(0, 40), max_num_tokens=st.integers(0, 90), seed=st.integers(0, 2**32))
def test_truncate_pair_longest_first_contiguous_and_parallel(la, lb, max_num_tokens, seed):
    a = np.stack([np.arange(la), 10 * np.arange(la)])  # row 1 is a parallel array (e.g. word starts)
    b = np.stack([np.arange(100, 100 + lb), 10 * np.arange(100, 100 + lb)])
    ta, tb = truncate_pair(a, b, max_num_tokens, np.random.default_rng(seed))
    assert ta.shape[1] + tb.shape[1] == min(la + lb, max_num_tokens)
    assert (ta.shape[1], tb.shape[1]) == reference_lengths(la, lb, max_num_tokens)
    # Longest first: a side is only cut while it is the longer one (b on a tie), so if both were cut they end
    # within one token, and a side cut alone was at least as long as the other before its last cut.
    if ta.shape[1] < la and tb.shape[1] < lb:
        assert abs(ta.shape[1] - tb.shape[1]) <= 1
    elif ta.shape[1] < la:
        assert ta.shape[1] >= lb
    elif tb.shape[1] < lb:
        assert tb.shape[1] >= la - 1
    for orig, cut in ((a, ta), (b, tb)):
        assert is_consecutive(cut[0])  # a contiguous sub-array: tokens come off the ends only
        if cut.shape[1]:
            assert orig[0, 0] <= cut[0, 0] and cut[0, -1] <= orig[0, -1]
        np.testing.assert_array_equal(cut[1], 10 * cut[0])  # the parallel row got the same cut


def google_truncate(a: np.ndarray, b: np.ndarray, max_num_tokens: int, rng: np.random.Generator):
    """google-research/bert `truncate_seq_pair`, one token per step (the longer side, b on a tie), each step
    taking its front-or-back choice from the next of the draws `rng.random(excess) < 0.5`."""
    excess = len(a) + len(b) - max_num_tokens
    if excess <= 0:
        return a, b
    a, b = list(a), list(b)
    for from_front in rng.random(excess) < 0.5:
        trunc = a if len(a) > len(b) else b
        if from_front:
            del trunc[0]
        else:
            trunc.pop()
    return np.array(a, dtype=np.int64), np.array(b, dtype=np.int64)


@settings(max_examples=300, deadline=None, database=None)
@given(la=st.integers(0, 60), lb=st.integers(0, 60), max_num_tokens=st.integers(0, 130), seed=st.integers(0, 2**32))
def test_truncate_pair_cuts_exactly_what_googles_loop_cuts(la, lb, max_num_tokens, seed):
    a, b = np.arange(la), np.arange(100, 100 + lb)
    ta, tb = truncate_pair(a, b, max_num_tokens, np.random.default_rng(seed))
    ra, rb = google_truncate(a, b, max_num_tokens, np.random.default_rng(seed))
    np.testing.assert_array_equal(ta, ra)
    np.testing.assert_array_equal(tb, rb)


def test_truncate_pair_no_cut_consumes_no_randomness():
    rng = np.random.default_rng(5)
    a, b = np.arange(3), np.arange(4)
    ta, tb = truncate_pair(a, b, 7, rng)
    np.testing.assert_array_equal(ta, a), np.testing.assert_array_equal(tb, b)
    assert rng.random() == np.random.default_rng(5).random()


def test_truncate_pair_removes_from_both_ends_at_random():
    # 400 removals from one side, each front or back with p = 1/2: the front cut is Binomial(400, 1/2).
    fronts = []
    for seed in range(20):
        ta, _ = truncate_pair(np.arange(1000), np.arange(0), 600, np.random.default_rng(seed))
        fronts.append(ta[0])
        assert len(ta) == 600
    assert all(150 < f < 250 for f in fronts)  # ±5 sd around 200
    assert len(set(fronts)) > 5


def test_truncate_pair_rejects_negative_budget():
    with pytest.raises(ValueError):
        truncate_pair(np.arange(3), np.arange(3), -1, np.random.default_rng(0))


# ------------------------------------------------------------------------------------------------- NSP


def test_nsp_structure_lengths_and_token_types():
    docs, doc_of, _, _ = make_corpus(random_lengths(np.random.default_rng(0), 60, (1, 15), (1, 12)))
    pairs = all_instances(create_nsp_instances, docs, 32, 0.1, seed=1)
    assert len(pairs) > 100
    for d, x in pairs:
        a, b = segments(x)
        assert len(x) <= 32 and len(a) >= 1 and len(b) >= 1
        la = len(a)
        assert x.input_ids.dtype == np.int64 and x.token_type_ids.dtype == np.int64
        np.testing.assert_array_equal(x.token_type_ids, [0] * (la + 2) + [1] * (len(b) + 1))
        np.testing.assert_array_equal(np.flatnonzero(x.special_mask), [0, la + 1, len(x) - 1])
        assert x.word_starts[x.special_mask].all()
        assert x.label in (0, 1) and x.segment_ids is None
        assert (doc_of[a] == d).all()  # A always comes from the document being cut
        assert is_consecutive(a) and is_consecutive(b)  # truncation only trims ends of contiguous spans
        if x.label == 0:
            assert (doc_of[b] == d).all() and b[0] > a[-1]
        else:
            assert len(set(doc_of[b])) == 1 and doc_of[b[0]] != d


def test_nsp_isnext_is_the_literal_continuation_and_notnext_starts_a_sentence():
    # Short sentences and a long budget: nothing is truncated, so pairs can be checked exactly.
    docs, doc_of, is_start, raw = make_corpus(random_lengths(np.random.default_rng(2), 20, (2, 12), (1, 4)))
    total = 0
    for d, x in all_instances(create_nsp_instances, docs, 128, 0.0, seed=3):
        a, b = segments(x)
        assert is_start[a[0]] and is_start[b[0]]
        if x.label == 0:
            assert b[0] == a[-1] + 1  # B is the next sentence of the same document
            total += 1
        else:
            assert doc_of[b[0]] != d
    assert total > 10


def one_token_corpus(n_docs: int, n_sent: int):
    """Every sentence is one token: chunks hit the target exactly and nothing is ever truncated."""
    return make_corpus([[1] * n_sent for _ in range(n_docs)])


def test_nsp_every_sentence_used_exactly_once_thanks_to_put_back():
    docs, doc_of, _, raw = one_token_corpus(40, 30)
    pairs = all_instances(create_nsp_instances, docs, 16, 0.1, seed=4)
    assert sum(x.label for _, x in pairs) > 20  # NotNext pairs did put sentences back
    for d in range(len(docs)):
        own = [t for dd, x in pairs if dd == d for seg in segments(x)[: 2 if x.label == 0 else 1] for t in seg]
        # Every sentence of the document lands in exactly one instance, in order.
        np.testing.assert_array_equal(own, np.concatenate(raw[d]))


def test_nsp_notnext_ratio_is_one_half():
    docs, _, _, raw = one_token_corpus(600, 30)
    pairs = all_instances(create_nsp_instances, docs, 12, 0.0, seed=5)
    # A one-sentence chunk (only the document's last sentence here) is NotNext by force; leave those out.
    free = [x.label for d, x in pairs if segments(x)[0][-1] != raw[d][-1][0]]
    assert len(free) > 2800
    assert 0.46 < np.mean(free) < 0.54  # n ≈ 3,000: ±4 sd


def test_nsp_short_seq_prob():
    # max_num_tokens = 16; a document's target is 16, or with p = 0.1 uniform in [2, 16]. With one-token
    # sentences a pair fills the target exactly (IsNext: the chunk; NotNext: A + target_b) unless its B ran into
    # the end of a document, so such pairs reveal their document's target.
    docs, _, _, raw = one_token_corpus(1000, 40)
    last_tokens = {doc[-1][0] for doc in raw}
    targets: dict[int, int] = {}
    for d, x in all_instances(create_nsp_instances, docs, 19, 0.1, seed=6):
        if segments(x)[1][-1] not in last_tokens:
            assert targets.setdefault(d, len(x) - 3) == len(x) - 3  # one target per document
    assert len(targets) > 990
    short = np.mean([t < 16 for t in targets.values()])
    # Expected 0.1 * 14/15 = 0.093 (a short draw of 16 looks long); sd ≈ 0.009.
    assert 0.06 < short < 0.13


def test_nsp_random_document_is_never_the_same_even_when_draws_keep_failing():
    # 50 documents, only 0 and 1 non-empty: most of the 10 fair draws fail and the fallback walk decides.
    lengths = [[1] * 30, [1] * 30] + [[] for _ in range(48)]
    docs, doc_of, _, _ = make_corpus(lengths)
    rng = np.random.default_rng(7)
    notnext = 0
    for _ in range(20):
        for x in create_nsp_instances(docs, 0, 12, 0.0, rng, SPECIAL):
            if x.label == 1:
                notnext += 1
                assert (doc_of[segments(x)[1]] == 1).all()
    assert notnext > 30
    assert create_nsp_instances(docs, 5, 12, 0.0, rng, SPECIAL) == []  # an empty document makes nothing


def test_nsp_needs_two_documents():
    docs, _, _, _ = make_corpus([[3, 4, 5]])
    with pytest.raises(ValueError, match="at least 2 documents"):
        create_nsp_instances(docs, 0, 16, 0.1, np.random.default_rng(0), SPECIAL)
    with pytest.raises(ValueError, match="max_seq_length"):
        create_nsp_instances(make_corpus([[3], [4]])[0], 0, 4, 0.1, np.random.default_rng(0), SPECIAL)


def test_nsp_long_sentences_are_truncated_to_max_seq_length():
    docs, _, _, _ = make_corpus([[50, 70, 40], [90], [30, 30]])
    for d, x in all_instances(create_nsp_instances, docs, 24, 0.0, seed=8):
        assert len(x) == 24  # every pair overflows, so truncation fills the row exactly


def test_nsp_is_deterministic_given_the_seed():
    docs, _, _, _ = make_corpus(random_lengths(np.random.default_rng(9), 10, (1, 10), (1, 10)))
    run = lambda seed: [(x.input_ids.tolist(), x.label) for _, x in all_instances(create_nsp_instances, docs, 24, 0.1, seed)]
    assert run(10) == run(10)
    assert run(10) != run(11)


def test_word_starts_travel_with_the_tokens():
    ids = [[np.arange(10, 16), np.arange(16, 20)], [np.arange(20, 25)]]
    starts = [[np.array([1, 0, 1, 0, 0, 1], bool), np.array([1, 1, 0, 1], bool)], [np.array([1, 0, 0, 1, 0], bool)]]
    flag = {t: s for doc_i, doc_s in zip(ids, starts) for si, ss in zip(doc_i, doc_s) for t, s in zip(si, ss)}
    docs = ListDocuments(ids, starts)
    for make in (create_nsp_instances, create_sop_instances):
        for _, x in all_instances(make, docs, 9, 0.0, seed=12):
            a, b = segments(x)
            for seg, offset in ((a, 1), (b, len(a) + 2)):
                expect = [flag[t] for t in seg]
                expect[0] = True  # a segment's first piece starts a unit, even if truncation cut its word's head
                np.testing.assert_array_equal(x.word_starts[offset:offset + len(seg)], expect)


def test_list_documents_is_a_document_source_and_validates_word_starts():
    docs = ListDocuments([[[10, 11], [12]]])
    assert isinstance(docs, DocumentSource) and len(docs) == 1
    ids, starts = docs.document(0)
    assert [s.tolist() for s in starts] == [[True, True], [True]] and ids[0].dtype == np.int64
    with pytest.raises(ValueError):
        ListDocuments([[[1, 2, 3]]], [[[True, False]]])


# ------------------------------------------------------------------------------------------------- SOP


def test_sop_pairs_are_ordered_or_swapped_halves_of_one_document():
    docs, doc_of, _, _ = make_corpus(random_lengths(np.random.default_rng(13), 500, (1, 12), (1, 8)))
    pairs = all_instances(create_sop_instances, docs, 12, 0.1, seed=14)
    labels = []
    for d, x in pairs:
        a, b = segments(x)
        assert len(x) <= 12 and len(a) >= 1 and len(b) >= 1
        np.testing.assert_array_equal(x.token_type_ids, [0] * (len(a) + 2) + [1] * (len(b) + 1))
        assert (doc_of[a] == d).all() and (doc_of[b] == d).all()  # never a random document
        if x.label == 0:
            assert a[-1] < b[0]
        else:
            assert b[-1] < a[0]
        labels.append(x.label)
    assert len(labels) > 1200
    assert 0.44 < np.mean(labels) < 0.56  # n ≈ 1,300: ±4 sd


def test_sop_uses_every_sentence_once():
    docs, _, _, raw = one_token_corpus(30, 25)
    pairs = all_instances(create_sop_instances, docs, 12, 0.2, seed=15)
    dropped = 0
    for d in range(len(docs)):
        own = np.sort(np.concatenate([np.concatenate(segments(x)) for dd, x in pairs if dd == d]))
        whole = np.concatenate(raw[d])
        # Only a lone one-token chunk at the document's end cannot make a pair and is left out.
        dropped += len(own) == len(whole) - 1
        np.testing.assert_array_equal(own, whole[:len(own)])
        assert len(own) >= len(whole) - 1
    assert dropped < len(docs)


def test_sop_splits_a_single_sentence_at_a_word_boundary():
    ids = [[np.arange(10, 20)], [np.array([30])]]
    starts = [[np.array([1, 0, 0, 1, 0, 1, 1, 0, 0, 0], bool)], [np.array([1], bool)]]
    docs = ListDocuments(ids, starts)  # a one-document corpus would do too; SOP never looks elsewhere
    rng = np.random.default_rng(16)
    cuts, labels = set(), []
    for _ in range(60):
        (x,) = create_sop_instances(docs, 0, 32, 0.0, rng, SPECIAL)
        a, b = segments(x)
        first, second = (a, b) if x.label == 0 else (b, a)
        np.testing.assert_array_equal(np.concatenate([first, second]), np.arange(10, 20))
        cuts.add(len(first))
        labels.append(x.label)
    assert cuts == {3, 5, 6}  # exactly the word boundaries inside the sentence
    assert set(labels) == {0, 1}
    assert create_sop_instances(docs, 1, 32, 0.0, rng, SPECIAL) == []  # one token cannot make two segments
    single = ListDocuments([[np.arange(10, 14)]])
    assert len(create_sop_instances(single, 0, 32, 0.0, rng, SPECIAL)) == 1


# --------------------------------------------------------------------------------------------- packing


def content(x: Instance) -> np.ndarray:
    return x.input_ids[~x.special_mask]


def test_full_sentences_rows_concatenate_to_the_corpus():
    lengths = random_lengths(np.random.default_rng(17), 25, (0, 8), (1, 9)) + [[30]]  # one sentence > a row
    docs, doc_of, is_start, raw = make_corpus(lengths)
    rows = list(pack_full_sentences(docs, 16, special=SPECIAL))
    corpus = np.concatenate([s for doc in raw for s in doc])
    np.testing.assert_array_equal(np.concatenate([content(x) for x in rows]), corpus)
    sentence_len = {s[0]: len(s) for doc in raw for s in doc}
    for i, x in enumerate(rows):
        assert len(x) <= 16 and x.label == -1 and (x.token_type_ids == 0).all()
        assert x.input_ids[0] == SPECIAL.cls and x.input_ids[-1] == SPECIAL.sep
        # Specials are exactly [CLS], [SEP] and the separators between documents.
        np.testing.assert_array_equal(x.special_mask, np.isin(x.input_ids, [SPECIAL.cls, SPECIAL.sep]))
        c = content(x)
        docs_in_row = doc_of[c]
        boundaries = np.flatnonzero(np.diff(docs_in_row)) + 1
        assert np.unique(docs_in_row).size == len(boundaries) + 1
        # One [SEP] per document change, and segment ids count the documents of the row.
        assert (x.input_ids == SPECIAL.sep).sum() == len(boundaries) + 1
        np.testing.assert_array_equal(x.segment_ids[1:-1][~x.special_mask[1:-1]], np.cumsum(
            np.r_[0, np.diff(docs_in_row) != 0]))
        # Full sentences: a row starts at a sentence start unless it continues a sentence too long for one row.
        if not is_start[c[0]]:
            assert doc_of[c[0]] == len(raw) - 1
        # Greedy: the row was closed because the next sentence (plus a separator) did not fit.
        if i + 1 < len(rows) and is_start[content(rows[i + 1])[0]]:
            nxt = content(rows[i + 1])[0]
            extra = int(doc_of[nxt] != doc_of[c[-1]])
            assert len(c) + (x.input_ids == SPECIAL.sep).sum() - 1 + extra + sentence_len[nxt] > 14


def test_doc_sentences_never_cross_documents():
    docs, doc_of, _, raw = make_corpus(random_lengths(np.random.default_rng(18), 25, (0, 8), (1, 9)))
    rows = list(pack_doc_sentences(docs, 16, special=SPECIAL))
    corpus = np.concatenate([s for doc in raw for s in doc])
    np.testing.assert_array_equal(np.concatenate([content(x) for x in rows]), corpus)
    for x in rows:
        assert len(x) <= 16 and np.unique(doc_of[content(x)]).size == 1
        assert (x.segment_ids == 0).all() and x.special_mask.sum() == 2
    n_docs = sum(1 for doc in raw if doc)
    assert len(rows) >= n_docs


def test_packing_with_rng_visits_documents_in_a_permuted_order():
    docs, _, _, raw = make_corpus(random_lengths(np.random.default_rng(19), 12, (1, 5), (1, 6)))
    order = np.random.default_rng(20).permutation(len(raw))
    rows = list(pack_full_sentences(docs, 20, np.random.default_rng(20), special=SPECIAL))
    expected = np.concatenate([s for d in order for s in raw[d]])
    np.testing.assert_array_equal(np.concatenate([content(x) for x in rows]), expected)


# ------------------------------------------------------------------------------------------- collation


def test_pad_instances_pair_batch():
    docs, _, _, _ = make_corpus([[3, 4, 2], [5, 1]])
    batch = [x for _, x in all_instances(create_nsp_instances, docs, 16, 0.0, seed=21)]
    out = pad_instances(batch, 16, SPECIAL.pad)
    assert set(out) == {"input_ids", "token_type_ids", "attention_mask", "special_mask", "word_starts",
                        "next_sentence_label"}
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert out[key].shape == (len(batch), 16) and out[key].dtype == np.int64
    for row, x in enumerate(batch):
        n = len(x)
        np.testing.assert_array_equal(out["input_ids"][row, :n], x.input_ids)
        assert (out["input_ids"][row, n:] == SPECIAL.pad).all()
        assert out["attention_mask"][row].tolist() == [1] * n + [0] * (16 - n)
        assert out["special_mask"][row, n:].all() and (out["token_type_ids"][row, n:] == 0).all()
    np.testing.assert_array_equal(out["next_sentence_label"], [x.label for x in batch])


def test_pad_instances_packed_batch_and_errors():
    docs, _, _, _ = make_corpus([[3, 4, 2], [5, 1]])
    rows = list(pack_full_sentences(docs, 10, special=SPECIAL))
    out = pad_instances(rows, None, SPECIAL.pad)
    assert "next_sentence_label" not in out and out["input_ids"].shape[1] == max(len(x) for x in rows)
    assert (out["segment_ids"][out["attention_mask"] == 0] == -1).all()
    with pytest.raises(ValueError, match="max_len"):
        pad_instances(rows, 4, SPECIAL.pad)
    pairs = create_sop_instances(docs, 0, 10, 0.0, np.random.default_rng(0), SPECIAL)
    with pytest.raises(ValueError, match="pair label"):
        pad_instances(rows + pairs, 10, SPECIAL.pad)


# ------------------------------------------------------------------------ layouts of many rows at once
# The loader lays a lane chunk's rows out at once (`pair_rows`, `packed_rows`) from the rules' plans; they must be
# the plain functions' instances padded by `pad_instances`, array for array, on any corpus (empty documents and
# sentences, sentences longer than a row, partial word starts included).

corpora = st.lists(  # documents of sentences of (length, word-start probability)
    st.lists(st.tuples(st.integers(0, 40), st.sampled_from([0.0, 0.5, 1.0])), min_size=0, max_size=7),
    min_size=2, max_size=7)


def _corpus(shape, seed: int) -> ListDocuments:
    rng = np.random.default_rng(seed)
    ids = [[rng.integers(FIRST_ID, 90, size=n) for n, _ in doc] for doc in shape]
    starts = [[rng.random(n) < p for n, p in doc] for doc in shape]
    return ListDocuments(ids, starts)


def _assert_same_arrays(expected: dict, got: dict) -> None:
    assert sorted(expected) == sorted(got)
    for key in expected:
        assert got[key].dtype == expected[key].dtype and np.array_equal(got[key], expected[key]), key


@settings(max_examples=150, deadline=None)
@given(corpora, st.integers(3, 60), st.booleans(), st.integers(0, 2**16))
def test_packed_rows_equal_the_padded_packer(shape, max_seq_length, cross, seed):
    from bertkit.data.instances import CachedDocuments, packed_rows

    docs = _corpus(shape, seed)
    pack = pack_full_sentences if cross else pack_doc_sentences
    plain = list(pack(docs, max_seq_length, special=SPECIAL))
    cached = CachedDocuments(docs)
    fast = packed_rows([cached.flat(d) for d in range(len(docs))], max_seq_length, SPECIAL, cross)
    if not plain:
        assert fast is None
        return
    _assert_same_arrays(pad_instances(plain, max_seq_length, SPECIAL.pad), fast)


@settings(max_examples=150, deadline=None)
@given(corpora, st.integers(5, 60), st.sampled_from(["nsp", "sop", "sentence-pair"]), st.integers(0, 2**16))
def test_pair_rows_equal_the_padded_instances(shape, max_seq_length, kind, seed):
    from bertkit.data.instances import (
        CachedDocuments, create_sentence_pair_instances, nsp_pairs, pair_rows, sentence_pairs, sop_pairs,
    )

    docs = _corpus(shape, seed)
    if sum(1 for doc in shape if any(n for n, _ in doc)) < 2:
        return  # NSP's random next segments need two non-empty documents (the error is tested above)
    cached = CachedDocuments(docs)
    for d in range(len(docs)):
        if kind == "nsp":
            plain = create_nsp_instances(docs, d, max_seq_length, 0.3, np.random.default_rng(seed), SPECIAL)
            pairs = nsp_pairs(cached, d, max_seq_length, 0.3, np.random.default_rng(seed))
        elif kind == "sop":
            plain = create_sop_instances(docs, d, max_seq_length, 0.3, np.random.default_rng(seed), SPECIAL)
            pairs = sop_pairs(cached, d, max_seq_length, 0.3, np.random.default_rng(seed))
        else:
            plain = create_sentence_pair_instances(docs, d, max_seq_length, np.random.default_rng(seed), SPECIAL)
            pairs = sentence_pairs(cached, d, max_seq_length, np.random.default_rng(seed))
        assert len(pairs) == len(plain)
        if plain:
            _assert_same_arrays(pad_instances(plain, max_seq_length, SPECIAL.pad),
                                pair_rows(pairs, max_seq_length, SPECIAL))
