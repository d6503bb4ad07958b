"""The word tokenizer (ELMo's words + characters): frequency-ranked ids, `<s> A </s>` framing, characters with
word marks, long words cut and unknown characters counted, the open vocabulary that keeps unknown words' spelling,
and the files round trip."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertkit.tokenizers import WordTokenizer, detect_tokenizer_kind, load_tokenizer
from bertkit.tokenizers.word import BOS_CHAR, BOW, EOS_CHAR, EOW, FIRST_CHAR, UNK_CHAR

TEXTS = ["the cat sat on the mat .", "the dog sat on the log !", "a cat and a dog , the end ."]


@pytest.fixture(scope="module")
def tok():
    return WordTokenizer.train(TEXTS, vocab_size=100, max_characters=8, show_progress=False)


def test_vocabulary_is_ranked_by_frequency_after_the_specials(tok):
    assert [tok.id_to_token(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, None)
    assert tok.id_to_token(4) == "the"  # 5 times
    counts = {w: sum(t.split().count(w) for t in TEXTS) for t in TEXTS for w in t.split()}
    ranked = [tok.id_to_token(i) for i in range(4, tok.vocab_size)]
    assert [counts[w] for w in ranked] == sorted((counts[w] for w in ranked), reverse=True)


def test_framing_and_unknown_words(tok):
    enc = tok.encode("The cat, zebra!")
    assert enc.tokens == ["<s>", "<unk>", "cat", ",", "<unk>", "!", "</s>"]  # case kept: "The" is unknown
    assert enc.offsets[1:-1] == [(0, 3), (4, 7), (7, 8), (9, 14), (14, 15)]
    assert tok.encode("a", "the").input_ids == [2, tok.token_to_id("a"), 3, 4, 3]


def test_characters_marks_truncation_and_unknown_characters(tok):
    before = dict(tok.char_stats)
    ids = tok.char_ids(["cat", "<s>", "</s>", "<pad>", "catcatcat", "cQt"])
    c, a, t = (tok.char_to_id[x] for x in "cat")
    assert ids[0].tolist() == [BOW, c, a, t, EOW, 0, 0, 0]
    assert ids[1].tolist()[:3] == [BOW, BOS_CHAR, EOW] and ids[2].tolist()[:3] == [BOW, EOS_CHAR, EOW]
    assert ids[3].tolist() == [0] * 8
    assert ids[4].tolist() == [BOW, c, a, t, c, a, t, EOW]  # 9 characters cut to 6
    assert ids[5].tolist()[:4] == [BOW, c, UNK_CHAR, t]
    assert tok.char_stats["truncated_words"] - before.get("truncated_words", 0) == 1
    assert tok.char_stats["unknown_chars"] - before.get("unknown_chars", 0) == 1
    assert min(tok.char_to_id.values()) == FIRST_CHAR and tok.char_vocab_size == FIRST_CHAR + len(tok.chars)


def test_open_vocabulary_keeps_unknown_words_spelling(tmp_path):
    tok = WordTokenizer.train(TEXTS, vocab_size=100, show_progress=False)
    tok.open_vocabulary = True
    enc = tok.encode("zebra cat zebra Quokka")
    V = tok.vocab_size
    assert enc.input_ids[1:-1] == [V, tok.token_to_id("cat"), V, V + 1]
    assert tok.id_to_token(V + 1) == "Quokka"
    assert np.array_equal(tok.char_ids_of(np.array(enc.input_ids)), tok.char_ids(enc.tokens))
    words = tok.encode_words([["Quokka", "sat"]])[0]
    assert words.ids == [V + 1, tok.token_to_id("sat")]
    assert tok.encode_raw(["a zebra"])[0].ids == [tok.token_to_id("a"), V]


def test_files_round_trip_and_detection(tok, tmp_path):
    tok.save(tmp_path / "w")
    assert detect_tokenizer_kind(tmp_path / "w") == "word"
    again = load_tokenizer(tmp_path / "w")
    assert type(again) is WordTokenizer and again.vocab_hash() == tok.vocab_hash()
    assert again.chars == tok.chars and again.max_characters == 8
    for text in TEXTS:
        assert again.encode(text).input_ids == tok.encode(text).input_ids
    (tmp_path / "w" / "word_chars.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ValueError, match="word_chars.json"):
        load_tokenizer(tmp_path / "w")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="abc .,!XY", min_size=1, max_size=8), min_size=1, max_size=6))
def test_every_word_is_one_token_and_characters_spell_it(tok, words):
    text = " ".join(words)
    enc = tok.encode_raw([text])[0]
    pieces = [text[a:b] for a, b in enc.offsets]
    assert "".join(pieces) == text.replace(" ", "")  # whitespace dropped, nothing else lost
    for piece, index in zip(pieces, enc.ids):
        assert index == (tok.token_to_id(piece) if tok.token_to_id(piece) is not None else tok.unk_id)
        chars = tok.word_chars(piece)
        assert chars[0] == BOW and chars.count(EOW) == 1 and len(chars) == 8
