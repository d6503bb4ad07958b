"""RoBERTa's four input formats (Liu et al., 2019, section 4.2): SENTENCE-PAIR+NSP's rules pinned on corpora whose
token ids name their document and sentence (one natural sentence per segment, the next sentence or another
document's, the walk that puts a sentence back, lengths), SEGMENT-PAIR+NSP as BERT's segment pairs, the four
objectives' instance kinds, and a short pretraining run of each NSP format through the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertkit.data.instances import ListDocuments, SpecialIds, create_nsp_instances, create_sentence_pair_instances
from bertkit.models.registry import OBJECTIVES

SPECIAL = SpecialIds(cls=1, sep=2, pad=0, mask=3)


def corpus(lengths: list[list[int]]) -> ListDocuments:
    """Token id 100000 + 10000 d + 100 k + j: piece j of sentence k of document d (ids say where they came from)."""
    return ListDocuments([[[100000 + 10000 * d + 100 * k + j for j in range(n)] for k, n in enumerate(doc)]
                          for d, doc in enumerate(lengths)])


def where(piece: int) -> tuple[int, int]:
    return (piece - 100000) // 10000, (piece % 10000) // 100


def segments(instance) -> tuple[np.ndarray, np.ndarray]:
    ids = instance.input_ids
    seps = np.flatnonzero(ids == SPECIAL.sep)
    return ids[1:seps[0]], ids[seps[0] + 1:seps[1]]


def check_sentence_pairs(lengths, doc_index, max_seq_length, seed):
    docs = corpus(lengths)
    instances = create_sentence_pair_instances(docs, doc_index, max_seq_length, np.random.default_rng(seed), SPECIAL)
    k = 0  # the walk: the sentence the next A must be
    for x in instances:
        assert len(x) <= max_seq_length and x.input_ids[0] == SPECIAL.cls and x.input_ids[-1] == SPECIAL.sep
        a, b = segments(x)
        assert len(a) >= 1 and len(b) >= 1
        # Token types 0 on [CLS] A [SEP], 1 on B [SEP]; the three specials flagged.
        assert x.token_type_ids.tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1)
        assert x.special_mask.sum() == 3
        # Each segment is a piece of ONE natural sentence (truncation only shortens it).
        assert len({where(p) for p in a}) == 1 and len({where(p) for p in b}) == 1
        assert where(a[0]) == (doc_index, k)
        d, j = where(b[0])
        if x.label == 0:  # IsNext: the following sentence of the same document; the walk skips it
            assert (d, j) == (doc_index, k + 1)
            k += 2
        else:  # NotNext: a sentence of another document; the next sentence is put back
            assert x.label == 1 and d != doc_index
            k += 1
        untruncated = lengths[doc_index][where(a[0])[1]] + lengths[d][j]
        assert len(a) + len(b) == min(untruncated, max_seq_length - 3)
    assert k == len(lengths[doc_index])  # every sentence is an A or an IsNext B, once
    return instances


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(1, 12), min_size=1, max_size=7), min_size=2, max_size=5),
       st.integers(8, 24), st.integers(0, 2**32 - 1), st.data())
def test_sentence_pair_rules(lengths, max_seq_length, seed, data):
    doc_index = data.draw(st.integers(0, len(lengths) - 1))
    check_sentence_pairs(lengths, doc_index, max_seq_length, seed)


def test_sentence_pairs_by_example():
    # Document 0: three sentences. The last sentence is always NotNext (it has no successor).
    instances = check_sentence_pairs([[3, 4, 2], [5, 5]], 0, 32, seed=0)
    assert instances[-1].label == 1
    labels = [x.label for seed in range(200)
              for x in create_sentence_pair_instances(corpus([[3] * 9, [3] * 9]), 0, 32,
                                                      np.random.default_rng(seed), SPECIAL)]
    # Labels: 1/2 NotNext per draw, plus the forced one when the walk reaches the last sentence alone.
    assert 0.45 < np.mean(labels) < 0.65
    again = create_sentence_pair_instances(corpus([[3, 4, 2], [5, 5]]), 0, 32, np.random.default_rng(0), SPECIAL)
    assert [x.input_ids.tolist() for x in again] == [x.input_ids.tolist() for x in instances]  # seeded: the same


def test_sentence_pairs_need_two_documents():
    with pytest.raises(ValueError, match="at least 2 documents"):
        create_sentence_pair_instances(corpus([[3, 3]]), 0, 16, np.random.default_rng(0), SPECIAL)


def test_segment_pairs_hold_several_sentences_and_respect_documents():
    """SEGMENT-PAIR+NSP (BERT's own instances): segments of several sentences up to the length, IsNext segments
    contiguous within one document, NotNext segments from another."""
    lengths = [[3] * 12, [3] * 12, [3] * 12]
    several = 0
    for seed in range(20):
        for x in create_nsp_instances(corpus(lengths), 1, 32, 0.0, np.random.default_rng(seed), SPECIAL):
            a, b = segments(x)
            assert len(x) <= 32 and {where(p)[0] for p in a} == {1}
            several += len({where(p) for p in a}) > 1
            if x.label == 0:  # B continues A in the same document
                assert {where(p)[0] for p in b} == {1} and where(b[0])[1] == where(a[-1])[1] + 1
            else:
                assert 1 not in {where(p)[0] for p in b}
    assert several > 0


def test_the_four_formats_are_objectives():
    def kind(name):
        return OBJECTIVES[name].instances, OBJECTIVES[name].pair_task

    assert kind("roberta-segment-pair") == ("nsp", "nsp")
    assert kind("roberta-sentence-pair") == ("sentence-pair", "nsp")
    assert kind("roberta") == ("full-sentences", None) and kind("roberta-doc") == ("doc-sentences", None)


@pytest.mark.parametrize("objective", ["roberta-sentence-pair", "roberta-segment-pair"])
def test_pretraining_with_the_nsp_formats(objective, tmp_path, one_thread):
    from conftest import synthetic_corpus

    from bertkit import WordPieceTokenizer
    from bertkit.data.corpus import iter_lines
    from bertkit.data.prepare import prepare
    from bertkit.training.pretrain import pretrain, resolve_config

    text = synthetic_corpus(tmp_path / "corpus.txt", documents=12)
    held_out = synthetic_corpus(tmp_path / "held_out.txt", documents=4, seed=1)
    tok = WordPieceTokenizer.train(iter_lines([text]), vocab_size=120, min_frequency=1, show_progress=False)
    tok.save(tmp_path / "tok")
    prepare([text], tmp_path / "tok", tmp_path / "data", eval_paths=[held_out], progress=False)
    config = resolve_config("tiny", {"objective": objective, "hidden_size": 32, "num_hidden_layers": 1,
                                     "num_attention_heads": 2, "intermediate_size": 64, "max_seq_length": 32,
                                     "max_predictions_per_seq": 5, "eval_instances": 16, "progress": False,
                                     "max_steps": 3, "batch_size": 8, "log_every": 1})
    result = pretrain(tmp_path / "data", tmp_path / "run", config)
    assert result.step == 3 and "eval_nsp_accuracy" in result.eval_metrics
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all("nsp_loss" in r for r in records if "loss" in r)
