"""Google's rules (`compat="google"`) against google-research/bert's tokenization.py itself, run side by side.

The released file (../shared/ref/google-bert, unchanged, with its six and tensorflow stand-ins; CI has it, the
tests skip without it) is imported by `google_reference.import_released`. With Google's uncased and cased
vocabularies (../shared/data/vocab), loaded as a user gets them from a bare vocab.txt (Google's rules, the casing
the vocabulary shows), bertkit's tokens and ids equal `FullTokenizer`'s on: the strings the other tokenizer tests
use; a set of strings on which Google's and transformers' rule sets differ (decomposed accents, words of 100-200
characters, control, format, private-use and unassigned characters, accents, CJK, punctuation), where
transformers' rules are also checked to differ from Google's on some (the set can tell the rules apart);
WikiText-2 lines changed where the rules part (bench/tokenizer_rules.py's variants); and random text from every
plane (hypothesis). The transcription `google_reference.py`, which the faster tests in
test_google_rules.py use, equals the released file on all of it.
"""

from __future__ import annotations

import sys
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings

from bertkit.tokenizers import load_tokenizer

import google_reference as google
from conftest import TINY_TEXT, shared_data, shared_ref
from test_google_rules import batches
from test_unicode_parity import FAST

ROOT = Path(__file__).resolve().parents[2]
VOCABS = {"uncased": "bert-base-uncased-vocab.txt", "cased": "bert-base-cased-vocab.txt"}
NFD = lambda s: unicodedata.normalize("NFD", s)  # noqa: E731

# Strings where the two rule sets differ (and a few where they should not), by the rule each exercises.
DIFFERING = {
    "decomposed accents": [NFD("Café résumé naïve Ångström"), NFD("Ελληνικά ΆΈΉ ΐΰ"), NFD("Ünïcödé ÀÉÎÕÜ"),
                           NFD("Crème brûlée à la française"), NFD("한국어 텍스트")],
    "long words": ["x" * 101, "a " + "y" * 150 + " b", "word " + "ab" * 90, "z" * 199 + " end", "q" * 200,
                   "r" * 201, NFD("é" * 60), "unbelievable" * 12 + ".", "x" * 100],
    "control characters": ["a\x00b c", "tab\there\nnew\rline", "a\x7fb", "bell\x07 x", "a\x85b", "a\ufffdb",
                           "\x1b[31mred\x1b[0m", "nul\x00\x00nul"],
    "format, private use, unassigned": ["a\u200bb", "a\u200db\ufeffc", "x\u0890y", "a\ue000b \U000f0000",
                                        "a\U000e0080b a\u0378b", "soft\u00adhyphen", "a\ud800b"],
    "accents": ["Café résumé", "İstanbul ılık", "Ǆemal ǅ ǆ", "ﬁnance ﬂow", "Straße STRASSE", "ŉ Øre æble",
                "ÀÉÎÕÜ àéîõü", "ΟΔΟΣ ΣΑΣ."],
    "CJK": ["日本語のテキスト", "中文字符 are split", "漢字かなカナ", "𠀀𪜀 rare ideographs", "ｶﾀｶﾅ full-width ＡＢＣ"],
    "punctuation": ["$5^2`~ |x|", "¿Qué? ¡Sí!", "«quoted» “curly”", "—dash… ‰†‡•¶§", "a.b,c;d:e", "don't",
                    "「日本」『語』〜", "(a)[b]{c}<d>", "@#%&*+=\\/", "ℝ ∞ ≠ ±"],
}
# The strings the other tokenizer tests use: the in-process vocabulary texts, test_google_rules.py's known cases
# and bench/tokenizer_rules.py's.
EXISTING = [*dict.fromkeys(TINY_TEXT), NFD("Café é"), "a\ue000b \U000f0000", "a\U000e0080b a\u0378b", "a\ud800b",
            "x\u0890y a\u200bb", "ΟΔΟΣ ΣΑΣ.", "ab a\ud800b c", "Hello World", "paris is the [MASK] of france",
            "x" * 150, "word " + "ab" * 90, NFD("Café résumé naïve Ångström"), NFD("Ελληνικά ΆΈΉ"), ""]


@pytest.fixture(scope="module")
def released():
    return google.import_released(shared_ref("google-bert"))


@pytest.fixture(scope="module", params=list(VOCABS))
def three(request, released):
    """(bertkit as a bare vocab.txt gives it, Google's FullTokenizer, the transcription) for one vocabulary."""
    path = shared_data("vocab", VOCABS[request.param])
    tok = load_tokenizer(path)
    lowercase = request.param == "uncased"
    assert (tok.compat, tok.lowercase) == ("google", lowercase)
    return tok, released.FullTokenizer(str(path), do_lower_case=lowercase), google.FullTokenizer(
        str(path), do_lower_case=lowercase)


def check(tok, theirs, transcribed, texts: list[str]) -> None:
    """bertkit's tokens and ids are Google's on every text (special tokens written in the text kept whole, the one
    thing bertkit adds), and the transcription's are too."""
    for text, enc in zip(texts, tok.encode_batch(texts)):
        want = google.tokens_with_specials(theirs, text)
        assert enc.tokens[1:-1] == want, ascii(text)
        assert enc.input_ids[1:-1] == theirs.convert_tokens_to_ids(want), ascii(text)
        assert google.tokens_with_specials(transcribed, text) == want, ascii(text)
    assert tok.encode_plain(texts) == [theirs.convert_tokens_to_ids(google.tokens_with_specials(theirs, t))
                                       for t in texts]


def test_the_existing_test_strings_give_googles_ids(three):
    check(*three, EXISTING)


@pytest.mark.parametrize("rule", list(DIFFERING))
def test_where_the_rule_sets_differ_bertkit_gives_googles_ids(three, rule):
    check(*three, DIFFERING[rule])


def test_the_differing_strings_tell_the_rule_sets_apart(three):
    """transformers' rules (NFC, the 100-character limit, every C* character dropped) give other tokens than
    Google's file on some of the strings, for each vocabulary: the set above checks something."""
    tok, theirs, _ = three
    path = shared_data("vocab", VOCABS["uncased" if tok.lowercase else "cased"])
    other = load_tokenizer(path, compat="transformers")
    differ = {rule: sum(other.tokenize(s) != theirs.tokenize(s) for s in strings)
              for rule, strings in DIFFERING.items()}
    assert differ["long words"] > 0 and differ["format, private use, unassigned"] > 0, differ
    if not tok.lowercase:  # cased: no accent stripping, so only transformers' NFC composes the accents
        assert differ["decomposed accents"] > 0, differ


@settings(max_examples=25, **FAST)
@given(batch=batches)
def test_random_texts_give_the_released_files_ids(three, batch):
    check(*three, batch)


@pytest.mark.slow
@settings(max_examples=100, **FAST)
@given(batch=batches)
def test_many_random_texts_give_the_released_files_ids(three, batch):
    check(*three, batch)


def test_wikitext_lines_changed_where_the_rules_part_tell_them_apart(three):
    """bench/tokenizer_rules.py's WikiText-2 variants (NFD, a 150-character word, a private-use character), on the
    first 30 lines each changes: Google's file and transformers' BertTokenizerLegacy differ on them (so a parity
    check on them can tell the rule sets apart, which WikiText-2 as it stands cannot), and bertkit's google rules
    give Google's ids on every one."""
    legacy = pytest.importorskip("transformers.models.bert.tokenization_bert_legacy")
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from tokenizer_parity import read_lines
        from tokenizer_rules import VARIANTS
    finally:
        sys.path.remove(str(ROOT / "bench"))
    tok, theirs, _ = three
    path = shared_data("vocab", VOCABS["uncased" if tok.lowercase else "cased"])
    other = legacy.BertTokenizerLegacy(str(path), do_lower_case=tok.lowercase)
    lines = [line for line in read_lines(shared_data("wikitext-2", "wiki.valid.raw")) if line.strip()]
    for name, change in VARIANTS.items():
        changed = [new for new, line in zip(map(change, lines), lines) if new is not None and new != line][:30]
        assert len(changed) == 30
        want = [theirs.convert_tokens_to_ids(theirs.tokenize(line)) for line in changed]
        assert tok.encode_plain(changed) == want, name
        differ = sum(other.convert_tokens_to_ids(other.tokenize(line)) != ids for line, ids in zip(changed, want))
        if name != "nfd" or not tok.lowercase:  # uncased strips the accents under both rules
            assert differ > 0, name
