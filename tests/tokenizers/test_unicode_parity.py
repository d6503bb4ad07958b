"""transformers' ids on any Unicode: bertkit's WordPiece with `compat="transformers"` against a pure-Python
transcription of transformers' BertTokenizer (Google's rules have their own test, test_google_rules.py).

The reference below is written from transformers' pure-Python BertTokenizer (`BertTokenizerLegacy` in transformers
5), its port of google-research/bert `tokenization.py`: drop NUL, U+FFFD and every category C* character but \\t \\n \\r; whitespace (space, \\t, \\n, \\r, Zs) to " ";
spaces around CJK ideographs; NFC; split on whitespace (`str.split`); per word, when uncased, `str.lower` and NFD
with every Mn dropped; split off punctuation (ASCII 33-47, 58-64, 91-96, 123-126 and categories P*); greedy
longest-match-first WordPiece, words over 100 characters [UNK]. Special tokens written in the text stay whole.
(google-research/bert itself drops only Cc and Cf and allows 200 characters per word.) The interpreter's
`unicodedata` is the table.

Random texts draw from every plane: ASCII, controls and format characters, every kind of whitespace, combining
marks, decomposed (NFD) accents and Greek, CJK, Hangul, emoji, Greek capitals (final sigma), characters newer than
the engine's tables, unassigned code points, private use, surrogates, and words near the 100-character limit. The fast suite checks about 10^4
texts; `pytest -m slow` ten times as many.
"""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertkit import WordPieceTokenizer
from bertkit.tokenizers.wordpiece import SPECIAL_TOKENS, google_words, needs_python

from conftest import shared_data


# ---- the reference ----------------------------------------------------------------------------------------------
def _ref_is_cjk(cp: int) -> bool:
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


def _ref_is_punctuation(char: str) -> bool:
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _ref_clean(text: str) -> str:
    out = []
    for char in text:
        cp = ord(char)
        if cp == 0 or cp == 0xFFFD or (char not in "\t\n\r" and unicodedata.category(char).startswith("C")):
            continue
        out.append(" " if char in " \t\n\r" or unicodedata.category(char) == "Zs" else char)
    return "".join(out)


def _ref_split_punctuation(word: str) -> list[str]:
    out: list[list[str]] = []
    new_word = True
    for char in word:
        if _ref_is_punctuation(char):
            out.append([char])
            new_word = True
        else:
            if new_word:
                out.append([])
            new_word = False
            out[-1].append(char)
    return ["".join(x) for x in out]


def ref_basic(text: str, lowercase: bool, strip_accents: bool | None = None) -> list[str]:
    """Google's BasicTokenizer."""
    strip = lowercase if strip_accents is None else strip_accents
    text = "".join(f" {c} " if _ref_is_cjk(ord(c)) else c for c in _ref_clean(text))
    words = []
    for word in unicodedata.normalize("NFC", text).split():
        if lowercase:
            word = word.lower()
        if strip:
            word = "".join(c for c in unicodedata.normalize("NFD", word) if unicodedata.category(c) != "Mn")
        words.extend(_ref_split_punctuation(word))
    return " ".join(words).split()


def ref_wordpiece(word: str, vocab) -> list[str]:
    """Google's WordpieceTokenizer on one word: greedy longest match first, [UNK] for a word it cannot cover."""
    if len(word) > 100:
        return ["[UNK]"]
    pieces, start = [], 0
    while start < len(word):
        end = len(word)
        while end > start:
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in vocab:
                break
            end -= 1
        if end == start:
            return ["[UNK]"]
        pieces.append(piece)
        start = end
    return pieces


def ref_tokens(text: str, vocab, lowercase: bool, strip_accents: bool | None = None) -> list[str]:
    """The pieces of `text`; a special token written in the text is one piece, as in transformers."""
    out: list[str] = []
    rest = text
    while rest:
        found = [(rest.find(t), t) for t in SPECIAL_TOKENS if t in rest]
        at, special = min(found) if found else (len(rest), "")
        for word in ref_basic(rest[:at], lowercase, strip_accents):
            out.extend(ref_wordpiece(word, vocab))
        if special:
            out.append(special)
        rest = rest[at + len(special):]
    return out


def ref_encode(tok: WordPieceTokenizer, text: str, pair: str | None, max_length: int | None) -> tuple[list, list]:
    """(input_ids, token_type_ids) of `[CLS] A [SEP] (B [SEP])`, cut one piece at a time from the longer text."""
    vocab = tok.get_vocab()
    a = [vocab[t] for t in ref_tokens(text, vocab, tok.lowercase, tok.strip_accents)]
    b = None if pair is None else [vocab[t] for t in ref_tokens(pair, vocab, tok.lowercase, tok.strip_accents)]
    if max_length is not None:
        budget = max_length - (2 if b is None else 3)
        while len(a) + len(b or []) > budget:
            if b is None or len(a) > len(b):
                a = a[:-1]
            else:
                b = b[:-1]
    ids = [vocab["[CLS]"], *a, vocab["[SEP]"]]
    types = [0] * len(ids)
    if b is not None:
        ids += [*b, vocab["[SEP]"]]
        types += [1] * (len(b) + 1)
    return ids, types


# ---- random text from every plane -------------------------------------------------------------------------------
# Characters on which the engine's own tables and Python's disagree: Unicode 10-14 punctuation, marks and format
# characters, CJK Extension G, and old characters whose category changed.
NEWER = ("\u061d\u09fd\u0a76\u0c77\u0c84\u1b7d\u2e4c\u2e52\u2e55\u2e5d\u1abf\u1ac0\u07fd\u0898\u08ca\u0890\u0891"
         "\u08e2\u1734\u1715\u0d04\u166d\u31bb\U00011938\U000110cd\U00013430\U00010ead\U00016ff0\U00031350\U0002b820")
WHITESPACE = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2003\u200a\u2028\u2029\u202f\u205f\u3000"
CONTROLS = "\x00\x01\x08\x1b\x7f\x9f\xad\u061c\u180e\u200b\u200c\u200d\u200e\u2060\u2066\ufeff\ufff9\ufffd"
LETTERS = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789àéîõüçñÅÉØßæœİıǄǅﬁŉ"
           "ΣΟΔΑσςπΆΈ" "ДЖЯдж" "한국어" "한" "ひらカタ" "עברית" "عربي" "हिन्दी" "ไทย")
PUNCTUATION = ".,;:!?'\"()[]{}-_/\\@#$%^&*+=<>|~`¿¡«»—…‰†‡•¶§·、。「」『』〜・︰﹏！？＠"

alphabet = st.sampled_from(LETTERS + PUNCTUATION + NEWER + CONTROLS + WHITESPACE + "#" * 4 + " " * 8)
any_char = st.characters(exclude_categories=())  # every plane, surrogates and unassigned code points included
marks = st.characters(categories=["Mn", "Mc", "Me"])
cjk = st.one_of(st.integers(0x4E00, 0x9FFF), st.integers(0x3400, 0x4DBF), st.integers(0xF900, 0xFAFF),
                st.integers(0x20000, 0x2CEAF), st.integers(0x2F800, 0x2FA1F), st.integers(0x30000, 0x3134F)).map(chr)
emoji = st.integers(0x1F000, 0x1FAFF).map(chr)
unassigned = st.characters(categories=["Cn", "Co", "Cs"])
special = st.sampled_from(SPECIAL_TOKENS)
char = st.one_of(alphabet, alphabet, alphabet, any_char, marks, cjk, emoji, unassigned)
long_word = st.builds(lambda n, tail: "x" * n + tail, st.integers(95, 105), st.sampled_from(["", "\u0301", "\u200b",
                                                                                           "\U000e0001", ".", "Σ"]))
# Decomposed (NFD) accents and Greek: the rules that compose (transformers') and those that do not (Google's) differ.
decomposed = st.sampled_from(["Café résumé naïve Ångström", "Ελληνικά ΆΈΉ ΐΰ", "Ünïcödé ÀÉÎÕÜ"]).map(
    lambda s: unicodedata.normalize("NFD", s))
texts = st.lists(st.one_of(char, char, char, char, char, char, char, special, long_word, decomposed),
                 max_size=40).map("".join)
batches = st.lists(texts, min_size=10, max_size=40)
pairs = st.lists(st.tuples(texts, texts, st.none() | st.integers(3, 40)), min_size=4, max_size=16)


# ---- tokenizers under test --------------------------------------------------------------------------------------
def _in_process_vocab() -> dict[str, int]:
    """Every character of the fixed alphabets as a word and as a continuation, plus a few longer pieces: most words
    are pieced, so a character kept or dropped wrongly changes the pieces instead of hiding in an [UNK]."""
    chars = set(LETTERS + PUNCTUATION + NEWER + "xﬁ")
    for c in list(chars):
        chars.update(c.lower(), *unicodedata.normalize("NFD", c.lower()), *unicodedata.normalize("NFD", c))
        chars.update(unicodedata.normalize("NFC", c))
    chars -= set(CONTROLS + WHITESPACE)
    tokens = list(SPECIAL_TOKENS) + ["the", "##ing", "xxxx", "##xxxx", "##xx", "ος", "##ος", "σας", "ΟΔΟΣ"]
    for c in sorted(chars):
        tokens += [c, "##" + c]
    return {t: i for i, t in enumerate(dict.fromkeys(tokens))}


IN_PROCESS = _in_process_vocab()


@pytest.fixture(scope="module", params=["google-uncased", "google-cased", "own-uncased", "own-cased",
                                        "own-lowercase-keep-accents"])
def tokenizer(request) -> WordPieceTokenizer:
    """Both Google vocabularies (skipped without ../shared/data) and an in-process one in three casings."""
    if request.param == "google-uncased":
        return WordPieceTokenizer.from_vocab(shared_data("vocab", "bert-base-uncased-vocab.txt"), lowercase=True,
                                             compat="transformers")
    if request.param == "google-cased":
        return WordPieceTokenizer.from_vocab(shared_data("vocab", "bert-base-cased-vocab.txt"), lowercase=False,
                                             compat="transformers")
    lowercase = request.param != "own-cased"
    strip = False if request.param == "own-lowercase-keep-accents" else None
    return WordPieceTokenizer(IN_PROCESS, lowercase=lowercase, strip_accents=strip)


def _check_batch(tok: WordPieceTokenizer, batch: list[str]) -> None:
    vocab = tok.get_vocab()
    got = tok.encode_batch(batch)
    for text, enc in zip(batch, got):
        want = ["[CLS]", *ref_tokens(text, vocab, tok.lowercase, tok.strip_accents), "[SEP]"]
        assert enc.tokens == want, ascii(text)
        assert enc.input_ids == [vocab[t] for t in want], ascii(text)
        _check_offsets(text, enc)
    assert tok.encode_plain(batch) == [e.input_ids[1:-1] for e in got]


def _check_offsets(text: str, enc) -> None:
    """Offsets lie in the text, in order, and a word's pieces do not overlap (but where one character became
    several, "İ" -> "i" + U+0307, and pieces of it share its span)."""
    previous = None
    for token, (start, end), word in zip(enc.tokens, enc.offsets, enc.word_ids):
        if word is None:
            continue
        assert 0 <= start < end <= len(text), (ascii(text), token, start, end)
        if previous is not None:
            assert start >= previous[0], (ascii(text), enc.tokens, enc.offsets)
            if token.startswith("##"):
                assert start >= previous[1] or (start, end) == previous, (ascii(text), enc.tokens, enc.offsets)
        previous = start, end


FAST = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                                   HealthCheck.data_too_large])


@settings(max_examples=80, **FAST)
@given(batch=batches)
def test_random_texts_give_googles_ids(tokenizer, batch):
    _check_batch(tokenizer, batch)


def _check_pairs(tok: WordPieceTokenizer, items: list) -> None:
    for text, pair, max_length in items:
        enc = tok.encode(text, pair=pair, max_length=max_length)
        ids, types = ref_encode(tok, text, pair, max_length)
        assert (enc.input_ids, enc.token_type_ids) == (ids, types), (ascii(text), ascii(pair), max_length)


@settings(max_examples=40, **FAST)
@given(items=pairs)
def test_random_pairs_give_googles_ids(tokenizer, items):
    _check_pairs(tokenizer, items)


@pytest.mark.slow
@settings(max_examples=800, **FAST)
@given(batch=batches)
def test_many_random_texts_give_googles_ids(tokenizer, batch):
    _check_batch(tokenizer, batch)


@pytest.mark.slow
@settings(max_examples=400, **FAST)
@given(items=pairs)
def test_many_random_pairs_give_googles_ids(tokenizer, items):
    _check_pairs(tokenizer, items)


# ---- the two roads ----------------------------------------------------------------------------------------------
def _python_road(tok: WordPieceTokenizer, texts: list[str]):
    return tok._piece_words(tok._google_items(texts))


safe_texts = st.lists(st.sampled_from(LETTERS + PUNCTUATION + "\u0301\u0308\u0327 \t\n\xa0\u3000\u200b\x7f中文字"),
                      max_size=50).map("".join)


def _cluster(text: str, start: int, end: int) -> tuple[int, int]:
    """(start, end) widened over the characters that belong to their neighbours: marks, characters that cleaning
    drops, and Hangul vowel and final jamo (which NFC composes with the consonant before them)."""
    def attached(char: str) -> bool:
        return unicodedata.category(char)[0] in "MC" or 0x1160 <= ord(char) <= 0x11FF

    while start > 0 and attached(text[start]):
        start -= 1
    while end < len(text) and attached(text[end]):
        end += 1
    return start, end


@settings(max_examples=150, **FAST)
@given(batch=st.lists(safe_texts, min_size=1, max_size=10))
def test_both_roads_give_the_same_pieces_offsets_and_word_ids(tokenizer, batch):
    """On texts the engine takes alone, the Python road gives the same pieces and word ids, and offsets that are
    the engine's or (where the engine cuts a cluster that NFC composed or reordered) the whole cluster."""
    batch = [t for t in batch if not tokenizer.needs_python(t)]
    for text, engine, python in zip(batch, tokenizer.backend.encode_batch(batch, add_special_tokens=False),
                                    _python_road(tokenizer, batch)):
        assert (engine.ids, engine.word_ids) == (python.ids, python.word_ids), ascii(text)
        for ours, theirs in zip(python.offsets, engine.offsets):
            assert ours[0] <= theirs[0] and theirs[1] <= ours[1], (ascii(text), ours, theirs)
            assert _cluster(text, *ours) == _cluster(text, *theirs), (ascii(text), ours, theirs)


def _check_engine_characters(contexts: tuple[str, ...]) -> None:
    for lowercase in (True, False):
        tok = WordPieceTokenizer(IN_PROCESS, lowercase=lowercase)
        normalizer, pre_tokenizer = tok.backend.normalizer, tok.backend.pre_tokenizer
        chars = [chr(cp) for cp in range(0x80, 0x10000) if not needs_python(chr(cp), lowercase)]
        assert len(chars) > 40000
        for context in contexts:
            texts = [context.format(c, c) for c in chars]
            got = pre_tokenizer.pre_tokenize_str(normalizer.normalize_str("\n".join(texts)))
            if [w for w, _ in got] != ref_basic("\n".join(texts), lowercase):  # find the character to name it
                for c, text in zip(chars, texts):
                    words = [w for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))]
                    assert words == ref_basic(text, lowercase), (hex(ord(c)), context)


def test_engine_agrees_with_google_on_every_character_it_takes():
    """Every BMP character `needs_python` lets through, between letters and among combining marks: the engine's
    words are Google's (the claim behind the engine's road, checked for the installed engine and interpreter)."""
    _check_engine_characters(("a{}a", "\u0316{}\u0301"))


@pytest.mark.slow
def test_engine_agrees_with_google_on_every_character_in_more_contexts():
    _check_engine_characters(("{}", "a{}a", "1{}", "{}\u0301", "\u0316{}\u0316", "{}{}", "\u03a3{}", "{}\u1161"))


# ---- known cases ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, lowercase, want", [
    ("a\U000e0080b", True, ["ab"]),  # unassigned (Cn): dropped, its neighbours touch
    ("a\u0378b", False, ["ab"]),
    ("a\ue000b \U000f0000", False, ["ab"]),  # private use (Co): dropped
    ("a\ud800b", True, ["ab"]),  # a lone surrogate (Cs): dropped
    ("x\u061dy", False, ["x", "\u061d", "y"]),  # Unicode 14 punctuation: split off
    ("x\u2e4cy", True, ["x", "\u2e4c", "y"]),
    ("xa\u1abf", True, ["xa"]),  # Unicode 14 nonspacing mark: stripped when uncased
    ("xa\u1abf", False, ["xa\u1abf"]),
    ("x\u0890y", False, ["xy"]),  # Unicode 14 format character: dropped
    ("ΟΔΟΣ ΣΑΣ.", True, ["οδος", "σας", "."]),  # final sigma where str.lower writes it
    ("a\x0bb a\x85b", True, ["ab", "ab"]),  # controls that the engine would take for spaces
    ("a\u2028b", True, ["a", "b"]),  # a line separator splits, as str.split does
    ("e\u0301 \u1100\u1161", False, ["é", "가"]),  # NFC first
])
def test_known_cases(text, lowercase, want):
    assert [w for w, _ in google_words(text, lowercase)] == want == ref_basic(text, lowercase)
    tokens = dict.fromkeys([*IN_PROCESS, *want])
    tok = WordPieceTokenizer({t: i for i, t in enumerate(tokens)}, lowercase=lowercase)
    assert tok.tokenize(text) == want


def test_offsets_point_into_the_original_text():
    tok = WordPieceTokenizer(IN_PROCESS, lowercase=True)
    text = "\u200bΟΔΟΣ\U000e0080, É\u0301x\u2e4cy 😀"
    enc = tok.encode(text)
    assert enc.tokens == ["[CLS]", "ο", "##δ", "##ος", ",", "e", "##x", "\u2e4c", "y", "[UNK]", "[SEP]"]
    spans = [text[s:e] for s, e in enc.offsets[1:-1]]
    assert spans == ["Ο", "Δ", "ΟΣ", ",", "É", "x", "\u2e4c", "y", "😀"]  # the stripped accent belongs to no piece
    assert enc.word_ids[1:-1] == [0, 0, 0, 1, 2, 2, 3, 4, 5]


def test_words_and_corpus_preparation_take_the_same_road(tmp_path):
    """`encode_words` (NER) and `prepare` (shards) give the ids of `encode` on text the engine alone gets wrong."""
    from bertkit.data.prepare import prepare
    from bertkit.data.shards import ShardedCorpus

    tok = WordPieceTokenizer(IN_PROCESS, lowercase=True)
    lines = ["ΟΔΟΣ x\u061dy", "a\U000e0080b ça", "xa\u1abf the 中文", "plain ascii line"]
    words = [line.split() for line in lines]
    for item, enc in zip(words, tok.encode_words(words)):
        assert enc.ids == [i for w in item for i in tok.encode(w).input_ids[1:-1]]
        assert enc.word_ids == [k for k, w in enumerate(item) for _ in tok.encode(w).input_ids[1:-1]]
    tok.save(tmp_path / "tok")
    (tmp_path / "c.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    prepare(tmp_path / "c.txt", tmp_path / "tok", tmp_path / "out", progress=False)
    (document, _), = ShardedCorpus(tmp_path / "out").documents_in_order()
    assert [s.tolist() for s in document] == tok.encode_plain(lines)
    assert tok.encode_plain(lines)[0] == tok.encode(lines[0]).input_ids[1:-1]


def test_training_learns_googles_words():
    tok = WordPieceTokenizer.train(["ΟΔΟΣ x\u061dy"] * 20, vocab_size=60, min_frequency=1, show_progress=False)
    assert {"\u061d", "ς"} <= set(tok.get_vocab())
    assert tok.tokenize("ΟΔΟΣ x\u061dy")[-3:] == ["x", "\u061d", "y"]


def test_reference_is_transformers_legacy_tokenizer():
    """The transcription above gives the pieces of transformers' legacy (pure-Python) BertTokenizer."""
    legacy = pytest.importorskip("transformers.models.bert.tokenization_bert_legacy")
    path = shared_data("vocab", "bert-base-uncased-vocab.txt")
    ref = legacy.BertTokenizerLegacy(str(path), do_lower_case=True)
    samples = [
        "a\U000e0080b x\u061dy xa\u1abf ΟΔΟΣ ΣΑΣ. a\x0bb a\u2028b e\u0301 \u1100\u1161 中文 😀 " + "x" * 101,
        "Ünïcode naïve café — “quotes” İstanbul ﬁne ǅ", "\ud800\ue000 [MASK] x[SEP]y \u3000\u200b\ufeff",
    ]
    for text in samples:
        assert ref_tokens(text, ref.vocab, True) == ref.tokenize(text), ascii(text)
