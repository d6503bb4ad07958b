"""Google's rules (`compat="google"`): the ids of google-research/bert `tokenization.py` on any Unicode, and the
casing a bare vocab.txt gets.

The reference is `google_reference.py`, a transcription of Google's file. Random texts come from the same
strategies as the transformers-rules test (test_unicode_parity.py: every plane, controls, private use,
unassigned code points, surrogates, newer characters), plus decomposed accents and Greek and words around Google's
200-character limit. Both Google vocabularies (each with its own casing, as a user gets it from a bare vocab.txt)
when ../shared/data is present, and an in-process vocabulary in both casings always.
"""

from __future__ import annotations

import json
import shutil
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertkit import WordPieceTokenizer, cli
from bertkit.tokenizers import load_tokenizer
from bertkit.tokenizers.wordpiece import google_words, needs_python, vocabulary_casing

import google_reference as google
from conftest import shared_data
from test_unicode_parity import (FAST, IN_PROCESS, LETTERS, PUNCTUATION, _check_offsets, char, decomposed,
                                 special)

google_long_word = st.builds(lambda n, tail: "x" * n + tail, st.integers(195, 205),
                             st.sampled_from(["", "\u0301", "\u200b", "\ue000", ".", "Σ", "A"]))
texts = st.lists(st.one_of(char, char, char, char, char, char, special, decomposed, google_long_word),
                 max_size=40).map("".join)
batches = st.lists(texts, min_size=10, max_size=40)


def reference(vocab: dict[str, int], lowercase: bool) -> google.FullTokenizer:
    return google.FullTokenizer(vocab, do_lower_case=lowercase)


def _check_batch(tok: WordPieceTokenizer, ref: google.FullTokenizer, batch: list[str]) -> None:
    got = tok.encode_batch(batch)
    for text, enc in zip(batch, got):
        want = ["[CLS]", *google.tokens_with_specials(ref, text), "[SEP]"]
        assert enc.tokens == want, ascii(text)
        assert enc.input_ids == ref.convert_tokens_to_ids(want), ascii(text)
        _check_offsets(text, enc)
    assert tok.encode_plain(batch) == [e.input_ids[1:-1] for e in got]
    words = [text.split(" ") for text in batch]
    assert [e.ids for e in tok.encode_words(words)] == [
        [i for w in item for i in ref.convert_tokens_to_ids(google.tokens_with_specials(ref, w))] for item in words]


@pytest.fixture(scope="module", params=["google-uncased", "google-cased", "own-uncased", "own-cased"])
def pair(request):
    """(bertkit, reference): Google's vocabularies through a bare vocab.txt's defaults, and an in-process one."""
    if request.param.startswith("google"):
        path = shared_data("vocab", f"bert-base-{request.param[7:]}-vocab.txt")
        tok = load_tokenizer(path)  # what a user gets: Google's rules, the vocabulary's casing
        assert tok.compat == "google" and tok.lowercase == (request.param == "google-uncased")
        return tok, google.FullTokenizer(str(path), do_lower_case=tok.lowercase)
    lowercase = request.param == "own-uncased"
    return (WordPieceTokenizer(IN_PROCESS, lowercase=lowercase, compat="google"),
            reference(IN_PROCESS, lowercase))


@settings(max_examples=80, **FAST)
@given(batch=batches)
def test_random_texts_give_googles_ids(pair, batch):
    _check_batch(*pair, batch)


@pytest.mark.slow
@settings(max_examples=800, **FAST)
@given(batch=batches)
def test_many_random_texts_give_googles_ids(pair, batch):
    _check_batch(*pair, batch)


def test_googles_vocab_file_reader_reads_the_same_vocabularies():
    for name in ("bert-base-cased-vocab.txt", "bert-base-uncased-vocab.txt"):
        path = shared_data("vocab", name)
        assert load_tokenizer(path).get_vocab() == dict(google.load_vocab(path))


def test_vocab_files_are_read_as_each_reference_reads_them(tmp_path):
    """Lines end at "\n" (Google) or "\n" / "\r" (transformers), never at U+0085 or U+2028 inside a token; Google
    strips every token."""
    legacy = pytest.importorskip("transformers.models.bert.tokenization_bert_legacy")
    path = tmp_path / "vocab.txt"
    path.write_bytes("\n".join([*google.SPECIALS, "a\u2028b", "c\x85", "d ", "\u3000e", "##f"]).encode() + b"\n")
    assert WordPieceTokenizer.from_vocab(path, compat="google").get_vocab() == dict(google.load_vocab(path))
    assert WordPieceTokenizer.from_vocab(path, compat="transformers").get_vocab() == dict(
        legacy.load_vocab(str(path)))
    path.write_bytes(b"[PAD]\r\n[UNK]\r[CLS]\n[SEP]\n[MASK]\nx")  # a lone "\r" ends a line for transformers only
    assert list(WordPieceTokenizer.from_vocab(path, compat="transformers").get_vocab()) == [
        *google.SPECIALS, "x"] == list(legacy.load_vocab(str(path)))
    assert "[UNK]\r[CLS]" in google.load_vocab(path)
    with pytest.raises(ValueError, match="lacks the special tokens"):
        WordPieceTokenizer.from_vocab(path, compat="google")


# ---- the engine's road ------------------------------------------------------------------------------------------
def _ref_words(text: str, lowercase: bool) -> list[str]:
    return google.BasicTokenizer(do_lower_case=lowercase).tokenize(text)


def _check_engine_characters(contexts: tuple[str, ...]) -> None:
    for lowercase in (True, False):
        tok = WordPieceTokenizer(IN_PROCESS, lowercase=lowercase, compat="google")
        normalizer, pre_tokenizer = tok.backend.normalizer, tok.backend.pre_tokenizer
        chars = [chr(cp) for cp in range(0x80, 0x10000) if not needs_python(chr(cp), lowercase, "google")]
        assert len(chars) > 40000
        for context in contexts:
            texts = [context.format(c, c) for c in chars]
            got = pre_tokenizer.pre_tokenize_str(normalizer.normalize_str("\n".join(texts)))
            if [w for w, _ in got] != _ref_words("\n".join(texts), lowercase):  # find the character to name it
                for c, text in zip(chars, texts):
                    words = [w for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))]
                    assert words == _ref_words(text, lowercase), (hex(ord(c)), context)


def test_engine_agrees_with_google_on_every_character_it_takes():
    """Every BMP character that `needs_python` lets through under Google's rules, between letters and among
    combining marks: the engine's words are Google's."""
    _check_engine_characters(("a{}a", "\u0316{}\u0301"))


@pytest.mark.slow
def test_engine_agrees_with_google_on_every_character_in_more_contexts():
    _check_engine_characters(("{}", "a{}a", "1{}", "{}\u0301", "\u0316{}\u0316", "{}{}", "\u03a3{}", "{}\u1161"))


# ---- known cases ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, lowercase, want", [
    (unicodedata.normalize("NFD", "Café é"), False, ["Cafe\u0301", "e\u0301"]),  # nothing composes
    (unicodedata.normalize("NFD", "Café é"), True, ["cafe", "e"]),
    ("a\ue000b \U000f0000", False, ["a\ue000b", "\U000f0000"]),  # private use (Co): kept
    ("a\U000e0080b a\u0378b", True, ["a\U000e0080b", "a\u0378b"]),  # unassigned (Cn): kept
    ("a\ud800b", False, ["a\ud800b"]),  # a lone surrogate (Cs): kept
    ("x\u0890y a\u200bb", False, ["xy", "ab"]),  # format characters (Cf): dropped
    ("ΟΔΟΣ ΣΑΣ.", True, ["οδος", "σας", "."]),  # final sigma where str.lower writes it
])
def test_known_cases(text, lowercase, want):
    assert [w for w, _ in google_words(text, lowercase, compat="google")] == want == _ref_words(text, lowercase)


@pytest.mark.parametrize("n", [100, 101, 199, 200, 201])
def test_words_up_to_200_characters_are_pieced(n):
    tok = WordPieceTokenizer(IN_PROCESS, lowercase=True, compat="google")
    pieces = tok.tokenize("a " + "x" * n + " b")
    assert pieces == ["a", *google.WordpieceTokenizer(IN_PROCESS).tokenize("x" * n), "b"]
    assert (pieces[1:-1] == ["[UNK]"]) == (n > 200)
    transformers_rules = WordPieceTokenizer(IN_PROCESS, lowercase=True, compat="transformers")
    assert (transformers_rules.tokenize("x" * n) == ["[UNK]"]) == (n > 100)


def test_surrogate_words_are_unknown_with_offsets_over_the_word():
    tok = WordPieceTokenizer(IN_PROCESS, lowercase=False, compat="google")
    enc = tok.encode("ab a\ud800b c")
    assert enc.tokens == ["[CLS]", "a", "##b", "[UNK]", "c", "[SEP]"]
    assert enc.offsets[3] == (3, 6) and enc.word_ids[1:-1] == [0, 0, 1, 2]


# ---- casing from the vocabulary ---------------------------------------------------------------------------------
def _vocab_file(tmp_path, tokens, name="vocab.txt"):
    path = tmp_path / name
    path.write_text("".join(t + "\n" for t in [*google.SPECIALS, *tokens]), encoding="utf-8")
    return path


def test_casing_is_detected_from_the_vocabulary(tmp_path):
    cased = _vocab_file(tmp_path, ["Hello", "hello", "world", "##A", "[unused0]"], "cased.txt")
    uncased = _vocab_file(tmp_path, ["hello", "world", "##a", "ℝ", "[unused0]"], "uncased.txt")
    assert vocabulary_casing(["[CLS]", "中", "1"])[0] is None
    tok = load_tokenizer(cased)
    assert (tok.lowercase, tok.compat) == (False, "google") and tok.tokenize("Hello World") == ["Hello", "[UNK]"]
    assert tok.rules_note == ("cased.txt: cased vocabulary (2 capitalised pieces, e.g. Hello, ##A): no lower-casing; "
                              "Google's tokenization.py rules")
    tok = load_tokenizer(uncased)
    assert tok.lowercase and tok.tokenize("Hello World") == ["hello", "world"]
    assert tok.rules_note.startswith("uncased.txt: uncased vocabulary (no capitalised piece): lower-casing")


def test_a_casing_that_contradicts_the_vocabulary_is_refused_unless_forced(tmp_path):
    cased = _vocab_file(tmp_path, ["Hello", "hello"], "cased.txt")
    uncased = _vocab_file(tmp_path, ["hello"], "uncased.txt")
    with pytest.raises(ValueError, match=r"cased.txt: cased vocabulary .* but lower-casing was asked for"):
        load_tokenizer(cased, lowercase=True)
    with pytest.raises(ValueError, match=r"uncased.txt: uncased vocabulary .* but no lower-casing was asked for"):
        WordPieceTokenizer.from_vocab(uncased, lowercase=False)
    assert load_tokenizer(cased, lowercase=True, force_casing=True).tokenize("Hello") == ["hello"]
    assert load_tokenizer(cased, lowercase=False).rules_note is None  # asked, and consistent: nothing to say


def test_real_cased_vocabulary_keeps_case():
    path = shared_data("vocab", "bert-base-cased-vocab.txt")
    tok = load_tokenizer(path)
    assert tok.encode("Hello World").tokens == ["[CLS]", "Hello", "World", "[SEP]"]


# ---- which rules where, and the saved field ---------------------------------------------------------------------
def test_rules_are_saved_and_read_back(tmp_path):
    text = unicodedata.normalize("NFD", "Café naïve ") + "x" * 150
    for compat in ("google", "transformers"):
        tok = WordPieceTokenizer(IN_PROCESS, lowercase=False, compat=compat)
        tok.save(tmp_path / compat)
        assert json.loads((tmp_path / compat / "tokenizer_config.json").read_text())["bertkit_compat"] == compat
        back = load_tokenizer(tmp_path / compat)
        assert (back.compat, back.lowercase, back.vocab_hash()) == (compat, False, tok.vocab_hash())
        assert back.encode(text).input_ids == tok.encode(text).input_ids
    google_ids = load_tokenizer(tmp_path / "google").encode(text).input_ids
    assert google_ids != load_tokenizer(tmp_path / "transformers").encode(text).input_ids
    assert load_tokenizer(tmp_path / "transformers", compat="google").encode(text).input_ids == google_ids
    # A bare vocab.txt in a directory: Google's rules, as for the file itself.
    (tmp_path / "bare").mkdir()
    shutil.copy(tmp_path / "google" / "vocab.txt", tmp_path / "bare" / "vocab.txt")
    assert load_tokenizer(tmp_path / "bare").compat == "google"


def test_directories_without_the_field_keep_transformers_rules(tmp_path):
    """A directory an earlier bertkit (or transformers) wrote: transformers' rules and its own casing, and the
    vocabulary hash it was recorded with."""
    tok = WordPieceTokenizer(IN_PROCESS, lowercase=True)
    tok.save(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del config["bertkit_compat"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    back = load_tokenizer(tmp_path)
    assert (back.compat, back.lowercase, back.vocab_hash()) == ("transformers", True, tok.vocab_hash())
    assert back.vocab_hash() != WordPieceTokenizer(IN_PROCESS, lowercase=True, compat="google").vocab_hash()
    (tmp_path / "tokenizer_config.json").unlink()  # only a tokenizer.json: its BertNormalizer's casing
    assert (load_tokenizer(tmp_path).compat, load_tokenizer(tmp_path).lowercase) == ("transformers", True)


def test_transformers_written_directory_gets_transformers_rules(tmp_path):
    """vocab.txt + tokenizer_config.json as transformers' pure-Python BertTokenizer saves them (transformers 5's
    BertTokenizer saves only a tokenizer.json, which load_tokenizer runs as transformers does)."""
    legacy = pytest.importorskip("transformers.models.bert.tokenization_bert_legacy")
    path = _vocab_file(tmp_path, sorted(set(LETTERS + PUNCTUATION) | {"##" + c for c in LETTERS}))
    for lowercase in (True, False):
        out = tmp_path / f"hf-{lowercase}"
        legacy.BertTokenizerLegacy(str(path), do_lower_case=lowercase).save_pretrained(str(out))
        tok = load_tokenizer(out)
        assert (tok.compat, tok.lowercase) == ("transformers", lowercase)
        ref = legacy.BertTokenizerLegacy(str(path), do_lower_case=lowercase)
        text = unicodedata.normalize("NFD", "Café ÀÉ ") + "a" * 150
        assert tok.encode(text).input_ids == ref(text)["input_ids"]


def test_training_with_googles_rules():
    text = unicodedata.normalize("NFD", "Café Ελληνικά") + " x\ue000y"
    tok = WordPieceTokenizer.train([text] * 20, vocab_size=80, min_frequency=1, lowercase=False, compat="google",
                                   show_progress=False)
    assert tok.compat == "google"
    ref = google.FullTokenizer(tok.get_vocab(), do_lower_case=False)
    assert tok.tokenize(text) == ref.tokenize(text) and "\u0301" in "".join(tok.tokenize(text))
    with pytest.raises(ValueError, match="strip accents exactly when they lower-case"):
        WordPieceTokenizer(IN_PROCESS, lowercase=True, strip_accents=False, compat="google")


# ---- the command line -------------------------------------------------------------------------------------------
def test_cli_tokenize_says_which_rules_and_refuses_a_contradicting_casing(tmp_path, capsys):
    cased = _vocab_file(tmp_path, ["Hello", "hello", "World", "world"], "cased.txt")
    assert cli.main(["tokenize", "--model-or-vocab", str(cased), "--json", "Hello World"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["tokens"] == ["[CLS]", "Hello", "World", "[SEP]"]
    assert out.err.strip() == ("cased.txt: cased vocabulary (2 capitalised pieces, e.g. Hello, World): "
                               "no lower-casing; Google's tokenization.py rules")
    assert cli.main(["tokenize", "--model-or-vocab", str(cased), "--no-cased", "Hello"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "but lower-casing was asked for" in err and "--force-casing" in err
    assert cli.main(["tokenize", "--model-or-vocab", str(cased), "--lowercase", "true", "Hello"]) == 2
    assert "but lower-casing was asked for" in capsys.readouterr().err
    assert cli.main(["tokenize", "--model-or-vocab", str(cased), "--no-cased", "--force-casing", "--json",
                     "Hello"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == ["[CLS]", "hello", "[SEP]"]
    text = unicodedata.normalize("NFD", "é")
    _vocab_file(tmp_path, ["é", "e", "##\u0301", "A"], "accents.txt")
    for compat, want in (("google", ["e", "##\u0301"]), ("transformers", ["é"])):
        assert cli.main(["tokenize", "--model-or-vocab", str(tmp_path / "accents.txt"), "--compat", compat,
                         "--json", text]) == 0
        assert json.loads(capsys.readouterr().out)["tokens"][1:-1] == want


def test_cli_prepare_tokenizes_a_bare_cased_vocabulary_with_its_casing(tmp_path, capsys):
    from bertkit.data.shards import ShardedCorpus

    cased = _vocab_file(tmp_path, ["Hello", "hello", "World", "world", "."], "cased.txt")
    (tmp_path / "c.txt").write_text("Hello World.\nhello world\n", encoding="utf-8")
    assert cli.main(["prepare", "--corpus", str(tmp_path / "c.txt"), "--tokenizer", str(cased),
                     "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert "cased vocabulary" in capsys.readouterr().err
    tok = load_tokenizer(tmp_path / "out" / "tokenizer")
    assert (tok.compat, tok.lowercase) == ("google", False)
    (document, _), = ShardedCorpus(tmp_path / "out").documents_in_order()
    assert [s.tolist() for s in document] == tok.encode_plain(["Hello World.", "hello world"])
    assert tok.tokenize("Hello World.") == ["Hello", "World", "."]
    assert cli.main(["prepare", "--corpus", str(tmp_path / "c.txt"), "--tokenizer", str(cased), "--no-cased",
                     "--out", str(tmp_path / "out2"), "--quiet"]) == 2
    assert "but lower-casing was asked for" in capsys.readouterr().err
