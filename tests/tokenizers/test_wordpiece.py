"""The tokenizer with `compat="transformers"` gives the ids of transformers' pure-Python BertTokenizer (BertTokenizerLegacy)."""

import random
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertkit import WordPieceTokenizer
from bertkit.data.corpus import iter_lines
from bertkit.tokenizers.wordpiece import SPECIAL_TOKENS, truncate_longest_first

from conftest import TINY_TEXT, shared_data

legacy = pytest.importorskip("transformers.models.bert.tokenization_bert_legacy")

# Characters that exercise every normalisation rule: accents (composed and combining), CJK ideographs, Hangul,
# Greek capitals (final sigma), control and zero-width characters, exotic spaces, ASCII and Unicode punctuation,
# ligatures, emoji.
ALPHABET = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789" "àéîõüçñÅÉØßæœ" "\u0301\u0308\u093e"
            "中文字日本語한국어" "ΣΟΔΑσςπ" "\x00\x01\x7f\u200b\ufffd\t\n\r" "\u00a0\u3000\u2028\u1680"
            ".,;:!?'\"()[]{}-_/\\@#$%^&*+=<>|~`¿¡«»—…" "ﬁǄİı😀" + " " * 12)
texts = st.text(alphabet=ALPHABET, max_size=60)
long_words = st.text(alphabet="abcdefghij", min_size=90, max_size=130)


def _pair_of(tok, vocab_path, lowercase):
    ref = legacy.BertTokenizerLegacy(str(vocab_path), do_lower_case=lowercase)
    return tok, ref


@pytest.fixture(scope="module")
def tiny_pair(tiny_tokenizer, tiny_vocab_dir):
    return _pair_of(tiny_tokenizer, tiny_vocab_dir / "vocab.txt", True)


@pytest.fixture(scope="module", params=[("bert-base-uncased-vocab.txt", True), ("bert-base-cased-vocab.txt", False)])
def google_pair(request):
    name, lowercase = request.param
    path = shared_data("vocab", name)
    return _pair_of(WordPieceTokenizer.from_vocab(path, lowercase=lowercase, compat="transformers"), path, lowercase)


def _check(tok, ref, text, pair=None, max_length=None):
    kwargs = dict(truncation=True, max_length=max_length) if max_length else {}
    kwargs.update(return_token_type_ids=True, return_attention_mask=True)
    want = ref(text, pair, **kwargs)
    got = tok.encode(text, pair=pair, max_length=max_length)
    assert got.input_ids == want["input_ids"], (text, pair)
    assert got.token_type_ids == want["token_type_ids"]
    assert got.attention_mask == want["attention_mask"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts)
def test_single_text_parity_with_a_trained_vocab(tiny_pair, text):
    _check(*tiny_pair, text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts, pair=texts, max_length=st.integers(3, 40))
def test_pair_truncation_parity(tiny_pair, text, pair, max_length):
    _check(*tiny_pair, text, pair, max_length)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(texts, long_words.map(lambda w: "x " + w + " y")), pair=st.none() | texts,
       max_length=st.none() | st.integers(3, 30))
def test_google_vocab_parity(google_pair, text, pair, max_length):
    _check(*google_pair, text, pair, max_length)


def test_reference_sentence_and_special_ids():
    tok = WordPieceTokenizer.from_vocab(shared_data("vocab", "bert-base-uncased-vocab.txt"))
    assert tok.encode("There is my school and I love this place").input_ids == [
        101, 2045, 2003, 2026, 2082, 1998, 1045, 2293, 2023, 2173, 102]
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 100, 101, 102, 103)


def test_trained_vocab_has_special_tokens_first(tiny_tokenizer):
    assert [tiny_tokenizer.id_to_token(i) for i in range(5)] == list(SPECIAL_TOKENS)
    assert tiny_tokenizer.vocab_size <= 200


def test_offsets_word_ids_and_types(tiny_tokenizer):
    enc = tiny_tokenizer.encode("Quick foxes!", pair="a dog")
    assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]"
    sep = enc.tokens.index("[SEP]")
    assert enc.token_type_ids == [0] * (sep + 1) + [1] * (len(enc) - sep - 1)
    assert enc.sequence_ids[0] is None and enc.sequence_ids[1] == 0 and enc.sequence_ids[-2] == 1
    text = "Quick foxes!"
    words = {}
    for tokid, (s, e), w, seq in zip(enc.input_ids, enc.offsets, enc.word_ids, enc.sequence_ids):
        if seq == 0:
            words.setdefault(w, []).append(text[s:e])
    assert ["".join(v).lower() for v in words.values()] == ["quick", "foxes", "!"]
    assert enc.special_tokens_mask[0] == 1 and sum(enc.special_tokens_mask) == 3


def test_decode_joins_word_pieces(tiny_tokenizer):
    text = "unbelievably long words get split"
    ids = tiny_tokenizer.encode(text).input_ids
    assert any(t.startswith("##") for t in tiny_tokenizer.convert_ids_to_tokens(ids))
    assert tiny_tokenizer.decode(ids) == text


def test_padding_and_batch(tiny_tokenizer):
    encs = tiny_tokenizer.encode_batch(["a dog", "the quick brown fox jumps"], padding=True)
    assert len(encs[0]) == len(encs[1])
    assert encs[0].attention_mask.count(0) == encs[0].input_ids.count(tiny_tokenizer.pad_id) > 0
    assert len(tiny_tokenizer.encode("a dog", max_length=16, padding="max_length")) == 16


def test_no_truncation_raises(tiny_tokenizer):
    with pytest.raises(ValueError, match="longer than max_length"):
        tiny_tokenizer.encode(" ".join(["dog"] * 20), max_length=8, truncation=False)


@given(a=st.integers(0, 50), b=st.integers(0, 50), limit=st.integers(0, 60))
def test_longest_first_rule(a, b, limit):
    ka, kb, na, nb = truncate_longest_first(list(range(a)), list(range(b)), limit)
    # Google's rule, one token at a time: cut the longer sequence; on a tie, cut the second.
    ra, rb = a, b
    while ra + rb > limit:
        if ra > rb:
            ra -= 1
        else:
            rb -= 1
    assert (na, nb) == (ra, rb)
    assert ka == list(range(na)) and kb == list(range(nb))


def test_save_load_round_trip_and_transformers_reads_it(tiny_tokenizer, tmp_path):
    tiny_tokenizer.save(tmp_path)
    again = WordPieceTokenizer.from_pretrained(tmp_path)
    assert again.get_vocab() == tiny_tokenizer.get_vocab() and again.lowercase
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertTokenizer.from_pretrained(str(tmp_path))
    for text in TINY_TEXT[:8]:
        assert hf(text)["input_ids"] == tiny_tokenizer.encode(text).input_ids


def test_mask_token_in_text_is_one_token(tiny_tokenizer):
    enc = tiny_tokenizer.encode("the [MASK] fox")
    assert enc.input_ids.count(tiny_tokenizer.mask_id) == 1


# ---- bad input -----------------------------------------------------------------------------------------------
def test_missing_vocab(tmp_path):
    with pytest.raises(FileNotFoundError, match="vocab.txt: vocabulary file not found"):
        WordPieceTokenizer.from_vocab(tmp_path / "vocab.txt")


def test_vocab_without_special_tokens(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")
    with pytest.raises(ValueError, match=r"lacks the special tokens \['\[CLS\]', '\[SEP\]', '\[MASK\]'\]"):
        WordPieceTokenizer.from_vocab(tmp_path / "vocab.txt")


def test_vocab_invalid_utf8_names_line(tmp_path):
    (tmp_path / "vocab.txt").write_bytes(b"[PAD]\n[UNK]\n\xff\xfe\n")
    with pytest.raises(ValueError, match=r"vocab.txt:3: vocabulary is not valid UTF-8"):
        WordPieceTokenizer.from_vocab(tmp_path / "vocab.txt")


def test_empty_corpus(tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="empty"):
        WordPieceTokenizer.train(iter_lines([tmp_path / "empty.txt"]), vocab_size=100, show_progress=False)


def test_train_from_file_with_invalid_utf8_names_file_and_line(tmp_path):
    (tmp_path / "c.txt").write_bytes(b"good line\nanother\n\xff bad\n")
    with pytest.raises(ValueError, match=r"c.txt:3"):
        WordPieceTokenizer.train(iter_lines([tmp_path / "c.txt"]), vocab_size=100, show_progress=False)


def tied_texts() -> list[str]:
    """Words of a few letters, each as frequent as many others: a trainer that breaks ties by chance shows it."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(2, 6))) for _ in range(60)]
    return [" ".join(words[i:i + 6]) for i in range(0, 60, 6)] * 2


def _train(texts, **kwargs) -> dict[str, int]:
    fields = dict(vocab_size=120, min_frequency=1, show_progress=False, **kwargs)
    return WordPieceTokenizer.train(texts, **fields).get_vocab()


def test_training_gives_the_same_vocabulary_and_ids_every_time():
    first = _train(tied_texts())
    assert len(first) == 120
    for _ in range(4):  # the bare `tokenizers` trainer gives another vocabulary nearly every time on this text
        assert _train(tied_texts()) == first


def test_training_reads_a_generator_through_a_temporary_copy_that_it_removes(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert _train(iter(tied_texts())) == _train(tied_texts())
    assert list(tmp_path.iterdir()) == []

    def broken():
        yield "some text"
        yield 3

    with pytest.raises(TypeError, match=r"texts\[1\] is int"):
        _train(broken())
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="no text to train on"):
        _train(iter(["", "  "]))


def test_corpus_files_are_read_twice_not_copied(tmp_path, monkeypatch):
    from bertkit.data.corpus import CorpusLines

    (tmp_path / "corpus.txt").write_text("\n".join(tied_texts()) + "\n", encoding="utf-8")
    monkeypatch.setattr(tempfile, "mkstemp", lambda *a, **k: pytest.fail("a copy of files that can be read again"))
    assert _train(CorpusLines([tmp_path / "corpus.txt"])) == _train(tied_texts())
    (tmp_path / "bad.txt").write_bytes(b"fine\n\xff\n")
    with pytest.raises(ValueError, match=r"bad.txt:2"):
        _train(CorpusLines(tmp_path / "bad.txt"))


def test_a_cut_alphabet_keeps_the_most_frequent_characters_and_ties_go_to_the_lower_code_point():
    vocab = _train(["ab ba ab ba ab ba hg gh fe ef dc cd"], limit_alphabet=4)  # a, b 6 times; c .. h twice
    assert sorted(t for t in vocab if len(t) == 1) == ["a", "b", "c", "d"]
    assert sorted(t for t in vocab if t.startswith("##") and len(t) == 3) == ["##a", "##b", "##c", "##d"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(texts, min_size=1, max_size=6))
def test_continuations_follow_the_special_tokens_in_code_point_order(sample):
    if not any(t.strip() for t in sample):
        return
    try:
        tok = WordPieceTokenizer.train(sample, vocab_size=80, min_frequency=1, show_progress=False)
    except ValueError:  # only characters that normalisation removes
        return
    tokens = [tok.id_to_token(i) for i in range(tok.vocab_size)]
    assert tokens[:5] == list(SPECIAL_TOKENS)
    singles = [t for t in tokens if t.startswith("##") and len(t) == 3]
    # Every one-character continuation was handed to the trainer in order, none made up in its hash map's order.
    assert tokens[5:5 + len(singles)] == sorted(singles)
    for piece in singles:  # a continuation of a character of the alphabet
        assert piece[2:] in tok.get_vocab()


@pytest.mark.slow
def test_full_wikitext_parity():
    """Every line of WikiText-2 (both splits), both Google vocabs, both rule sets against their own references
    (bench/tokenizer_parity.py does the same)."""
    from importlib import import_module
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    for compat in ("google", "transformers"):
        result = import_module("tokenizer_parity").run(shared_data(), compat=compat)
        assert result["mismatches"] == 0, result
