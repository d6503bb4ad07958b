"""WordPiece tokenisation on the `tokenizers` engine, giving exactly the ids of one of two reference tokenizers.

Two rule sets (`compat`), each exact, with the running interpreter's `unicodedata` as the Unicode table:

    "google"        google-research/bert `tokenization.py` (`FullTokenizer`), which made Google's checkpoints:
                    drop NUL, U+FFFD and every character of category Cc or Cf but tab, newline and carriage return;
                    whitespace (space, tab, newline, return, Zs) -> " " -> spaces around CJK ideographs
                    -> split on whitespace (`str.split`)
                    -> per word [uncased: lower-case with `str.lower` (final sigma), strip accents (NFD, drop Mn)]
                    -> split off every punctuation character (ASCII symbols and categories P*)
                    -> greedy longest-match-first WordPiece (words over 200 characters become [UNK])
    "transformers"  transformers' pure-Python BertTokenizer (`BertTokenizerLegacy` since transformers 5), which
                    changed three things: it drops every category C* character (unassigned, private use and
                    surrogates too), composes characters (NFC) after the CJK spaces, and takes words up to 100
                    characters; its `strip_accents` may differ from its casing

A bare vocab.txt gets Google's rules and the casing its vocabulary shows (`vocabulary_casing`); a directory that
transformers (or an earlier bertkit) wrote gets transformers' rules and its own casing; bertkit saves the choice
(`bertkit_compat` in tokenizer_config.json). Both rule sets keep the five special tokens written in a text whole
(Google's tokenizer has no special tokens: its scripts add them as ids).

The engine normalises, splits and pieces text at native speed, but with Unicode tables of its own that are older
than Python's: it keeps unassigned code points, does not know characters added since (U+061D is no punctuation to
it, U+1ABF no accent, U+0890 no format character) and lower-cases letter by letter (always "σ", never the final
"ς"). So each text takes one of two roads, chosen per text by `needs_python`:

    ASCII, or only characters that Unicode 3.2 already had and that no later version changed (category, combining
    class, decomposition): the engine alone; every table since agrees on those (a test checks each of them)
    anything else (newer or changed characters, surrogates, anything beyond the BMP, a capital sigma when
    lower-casing, and for Google's rules private-use characters, which they keep): `google_words` applies the
    rules above in Python, keeping for every character where in the text it came from, and the engine only
    pieces the words

Both roads give the same ids, tokens and word ids, and character offsets into the original text (where the engine
cuts a cluster of combining marks that NFC composed or reordered, the Python road gives the whole cluster). What
BERT adds on top, `[CLS] A [SEP] B [SEP]` with token types 0/1 and longest-first pair truncation, is written in
`base.py` so that the rule is visible and the same for training data, fine-tuning and inference.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tqdm import tqdm

from bertkit.io import atomic_write, read_json_object
from bertkit.tokenizers.base import PieceTokenizer, check_vocab, replayable, truncate_longest_first

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
COMPATS = ("google", "transformers")  # the two rule sets (see the module docstring)
# Longer words become [UNK]: `max_input_chars_per_word` of Google's WordpieceTokenizer, and transformers' default.
MAX_WORD_CHARS = {"google": 200, "transformers": 100}
RULES = {"google": "Google's tokenization.py rules", "transformers": "transformers' BertTokenizer rules"}

# CJK ideograph blocks that BERT surrounds with spaces (as in Google's tokenizer).
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
               (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
# Special tokens written in a text stay one token (the engine matches them in the raw text, as transformers does).
_SPECIAL_IN_TEXT = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS))


# ---- Google's rules in Python, for the texts the engine's own tables would get wrong ----------------------------
@functools.lru_cache(maxsize=2)
def _engine_unsafe(compat: str = "transformers") -> re.Pattern:
    """A pattern matching every character on which the engine's Unicode tables may disagree with the interpreter's.

    Safe are the BMP characters assigned in Unicode 3.2 (`unicodedata.ucd_3_2_0`) whose general category, canonical
    combining class and decomposition are the same in the running table: Unicode's stability rules keep their
    normalisation, and any table of the last twenty years agrees on their category, so the engine gives Google's
    result on every text made only of them. Unsafe: everything else, surrogates (the engine cannot even receive
    them) and every code point beyond the BMP (rare in text; not scanned, to keep this one-off scan at ~50 ms).
    Under Google's rules also private-use characters (Co): Google keeps them, the engine drops them.
    """
    old = unicodedata.ucd_3_2_0
    unsafe: list[list[int]] = []
    for cp in range(0x80, 0x10000):
        char = chr(cp)
        category = old.category(char)
        if not (category == "Cn" or category == "Cs" or category != unicodedata.category(char)
                or (compat == "google" and category == "Co")
                or old.combining(char) != unicodedata.combining(char)
                or old.decomposition(char) != unicodedata.decomposition(char)):
            continue
        if unsafe and unsafe[-1][1] == cp - 1:
            unsafe[-1][1] = cp
        else:
            unsafe.append([cp, cp])
    ranges = "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in unsafe)
    return re.compile(f"[{ranges}\\U00010000-\\U0010ffff]")


def needs_python(text: str, lowercase: bool, compat: str = "transformers") -> bool:
    """True when `text` must go through `google_words`: the engine alone might not give the rules' ids for it."""
    if text.isascii():  # O(1) in CPython; the engine's rules for ASCII are both rule sets' exactly
        return False
    # A capital sigma lower-cases by its context (str.lower's Final_Sigma rule); the engine always writes "σ".
    return (lowercase and "\u03a3" in text) or _engine_unsafe(compat).search(text) is not None


def _is_punctuation(char: str) -> bool:
    """Google's punctuation: every non-alphanumeric printable ASCII character, and every category P* character."""
    cp = ord(char)
    return (33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
            or unicodedata.category(char).startswith("P"))


_KEEP, _DROP, _SPACE, _CJK, _PUNCT = range(5)


class _CharKinds(dict):
    """character -> what the rules do with it (_KEEP, _DROP, _SPACE, _CJK or _PUNCT), looked up once.

    dropped: the control categories cleaning removes (Google's: Cc and Cf; transformers': every C*).
    """

    def __init__(self, dropped: tuple[str, ...]) -> None:
        super().__init__()
        self.dropped = dropped

    def __missing__(self, char: str) -> int:
        cp = ord(char)
        if cp == 0 or cp == 0xFFFD or (unicodedata.category(char) in self.dropped and char not in "\t\n\r"):
            kind = _DROP  # cleaned away: its neighbours touch
        elif char.isspace():  # Google's whitespace (space, \t, \n, \r, Zs) and str.split's (U+2028, U+2029)
            kind = _SPACE
        elif cp >= 0x3400 and any(a <= cp <= b for a, b in _CJK_RANGES):
            kind = _CJK
        else:
            kind = _PUNCT if _is_punctuation(char) else _KEEP
        if len(self) < 1 << 16:  # bounded, whatever the text
            self[char] = kind
        return kind


_KINDS = {"google": _CharKinds(("Cc", "Cf")), "transformers": _CharKinds(("Cc", "Cf", "Cn", "Co", "Cs"))}


def _strip_accents(text: str) -> str:
    """Google's accent stripping: NFD, then every nonspacing mark (category Mn) dropped."""
    return "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


# Where each character of a word came from: (starts, ends), character i from text[starts[i]:ends[i]]. Ranges where
# characters map one to one (most words), lists elsewhere: no tuple per character (which the garbage collector
# would scan over and over on long texts).
Where = tuple[Sequence[int], Sequence[int]]


def _aligned(transform, text: str, where: Where, by_char: bool = False) -> tuple[str, Where]:
    """`transform(text)` and, for each of its characters, where in the original text it came from.

    The transform is applied to the whole text, and that result is returned (so it is exact); where each character
    came from follows from applying it to each character, or where that is not the same (NFC composing "a" + U+0301
    into "á") to each cluster, a character and the combining marks after it, whose result then spans the whole
    cluster. by_char: the transform works character by character but for context that keeps lengths (`str.lower`'s
    final sigma). Where the clusters do not add up either (a composition across clusters: decomposed Hangul), the
    text is cut only where it splits cleanly (transform(a) + transform(b) == transform(a + b)).
    """
    out = transform(text)
    if out == text:
        return text, where
    starts, ends = where
    if by_char:
        lengths = [len(transform(c)) for c in text]
        if sum(lengths) == len(out):
            return out, ([s for s, n in zip(starts, lengths) for _ in range(n)],
                         [e for e, n in zip(ends, lengths) for _ in range(n)])
    cuts = [0, *(i for i in range(1, len(text)) if unicodedata.combining(text[i]) == 0), len(text)]
    pieces: list[str] = []
    new_starts: list[int] = []
    new_ends: list[int] = []
    for a, b in zip(cuts, cuts[1:]):
        piece = transform(text[a:b])
        parts = [transform(c) for c in text[a:b]]
        if "".join(parts) == piece:  # character by character
            counts = [len(part) for part in parts]
            new_starts += [s for s, n in zip(starts[a:b], counts) for _ in range(n)]
            new_ends += [e for e, n in zip(ends[a:b], counts) for _ in range(n)]
        else:  # the cluster as a whole
            new_starts += [starts[a]] * len(piece)
            new_ends += [ends[b - 1]] * len(piece)
        pieces.append(piece)
    if "".join(pieces) != out:
        cuts = [0, *(c for c in cuts[1:-1] if transform(text[:c]) + transform(text[c:]) == out), len(text)]
        sizes = [len(transform(text[:c])) for c in cuts]
        new_starts = [starts[a] for a, n, m in zip(cuts, sizes, sizes[1:]) for _ in range(m - n)]
        new_ends = [ends[b - 1] for b, n, m in zip(cuts[1:], sizes, sizes[1:]) for _ in range(m - n)]
    return out, (new_starts, new_ends)


def google_words(text: str, lowercase: bool = True, strip_accents: bool | None = None,
                 compat: str = "transformers") -> list[tuple[str, Where]]:
    """The BasicTokenizer of `compat`'s rules on `text`: its words, each with where in `text` every one of its
    characters came from.

    Returns [(word, (starts, ends))], word[i] came from text[starts[i]:ends[i]] (a combining mark composed into it
    included). The words are exactly those of the reference tokenizer (see the module docstring) under the
    interpreter's `unicodedata`; special tokens written in the text ("[MASK]") come back whole. strip_accents:
    None = lowercase.
    """
    strip = lowercase if strip_accents is None else strip_accents
    rules = (lowercase, strip, compat == "transformers", _KINDS[compat])
    words: list[tuple[str, Where]] = []
    done = 0
    for match in _SPECIAL_IN_TEXT.finditer(text):
        _segment(text, done, match.start(), rules, words)
        size = len(match.group())
        words.append((match.group(), ([match.start()] * size, [match.end()] * size)))
        done = match.end()
    _segment(text, done, len(text), rules, words)
    return words


_NOT_SPACE = re.compile(r"\S+")  # `re`'s \s is exactly str.isspace


def _segment(text: str, start: int, end: int, rules: tuple, out: list) -> None:
    """Append to `out` the words of text[start:end] (no special token in it).

    rules: (lowercase, strip accents, compose with NFC, the rules' `_CharKinds`)."""
    part = text[start:end]
    table = rules[3]
    kinds = {table[char] for char in set(part)}
    if _DROP not in kinds and _CJK not in kinds:  # most texts: the words are the runs between whitespace
        for match in _NOT_SPACE.finditer(part):
            a, b = match.start() + start, match.end() + start
            _word(match.group(), (range(a, b), range(a + 1, b + 1)), rules, out)
        return
    chars: list[str] = []
    starts: list[int] = []
    for i in range(start, end):
        char = text[i]
        kind = table[char]
        if kind == _KEEP or kind == _PUNCT:
            chars.append(char), starts.append(i)
        elif kind != _DROP:  # whitespace ends a word; a CJK ideograph is a word of its own
            if chars:
                _word("".join(chars), (starts, [s + 1 for s in starts]), rules, out)
                chars, starts = [], []
            if kind == _CJK:
                _word(char, (range(i, i + 1), range(i + 1, i + 2)), rules, out)
    if chars:
        _word("".join(chars), (starts, [s + 1 for s in starts]), rules, out)


def _word(word: str, where: Where, rules: tuple, out: list) -> None:
    """Append to `out` the words of one whitespace-separated chunk: normalised, punctuation split off."""
    lowercase, strip, nfc, table = rules
    if word.isascii():  # already NFC, no accents
        word = word.lower() if lowercase else word
    else:
        if nfc:  # transformers' rules only; Google's never compose
            word, where = _aligned(_nfc, word, where)
        if lowercase:
            word, where = _aligned(str.lower, word, where, by_char=True)
        if strip:
            word, where = _aligned(_strip_accents, word, where)
    if word.isalnum():  # letters and digits only: nothing to split off
        out.append((word, where))
        return
    starts, ends = where
    start = 0
    for i, char in enumerate(word):
        if table[char] == _PUNCT:
            if start < i:
                out.append((word[start:i], (starts[start:i], ends[start:i])))
            out.append((char, (starts[i:i + 1], ends[i:i + 1])))
            start = i + 1
    if start < len(word):
        out.append((word[start:], (starts[start:], ends[start:])))


def _vocab_lines(text: str, compat: str) -> list[str]:
    """The tokens of a vocab.txt as each reference reads them: Google's `load_vocab` splits at "\n" only and
    strips every token (`str.strip`); transformers' reads text lines ("\n", "\r\n" or "\r") and drops only the
    line end. Never `str.splitlines`, which also splits at U+0085, U+2028 and other separators inside a token."""
    lines = text.split("\n") if compat == "google" else re.split("\r\n|\r|\n", text)
    if lines and lines[-1] == "":  # the end of the last line, not a line
        lines.pop()
    return [line.strip() for line in lines] if compat == "google" else lines


_SURROGATE = re.compile("[\ud800-\udfff]")


def _engine_words(words: list[str]) -> list[str]:
    """The words as the engine can take them: one holding a lone surrogate (which Google's rules keep; the engine
    cannot receive it) becomes "[UNK]", which is what WordPiece makes of it, as no vocabulary piece holds one."""
    return [("[UNK]" if not w.isascii() and _SURROGATE.search(w) else w) for w in words]


def _engine_casing(normalizer: dict) -> tuple[str, bool, bool | None] | None:
    """("transformers", lowercase, strip_accents) from a tokenizer.json normaliser holding BertNormalizers (alone or
    in a Sequence, as bertkit writes it); None for any other normaliser."""
    steps = normalizer.get("normalizers", []) if normalizer.get("type") == "Sequence" else [normalizer]
    bert = [step for step in steps if isinstance(step, dict) and step.get("type") == "BertNormalizer"]
    if not bert:
        return None
    lowercase = any(step.get("lowercase", True) for step in bert)
    strip = any(step.get("lowercase", True) if step.get("strip_accents") is None else step["strip_accents"]
                for step in bert)
    return "transformers", lowercase, None if strip == lowercase else strip


@dataclass
class Pieces:
    """The engine's answer for one text that went through `google_words`, in the shape of a `tokenizers.Encoding`.

    ids, tokens: the WordPiece pieces; offsets[i]: (start, end) of piece i in the original text (or word, for
    `encode_words`); word_ids[i]: the index of the word piece i belongs to.
    """

    ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]
    word_ids: list[int]

    def __len__(self) -> int:
        return len(self.ids)


class _CharCounts:
    """How often each character occurs in many strings, counted a megabyte at a time with numpy."""

    def __init__(self) -> None:
        self.totals = np.zeros(0x110000, dtype=np.int64)
        self.buffer: list[str] = []
        self.size = 0

    def add(self, text: str) -> None:
        self.buffer.append(text)
        self.size += len(text)
        if self.size >= 1 << 20:
            self._flush()

    def _flush(self) -> None:
        codes = np.frombuffer("".join(self.buffer).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        self.totals += np.bincount(codes, minlength=len(self.totals))
        self.buffer, self.size = [], 0

    def finish(self) -> Counter[str]:
        self._flush()
        return Counter({chr(c): int(self.totals[c]) for c in np.flatnonzero(self.totals)})


def _fixed_order(engine, counts: Counter[str], limit_alphabet: int) -> tuple[list[str], list[str]]:
    """(continuations, initial alphabet) for the `tokenizers` WordPiece trainer, from the character counts of the
    text it will be fed: "##c" for every word character c of the alphabet it will keep, in code point order, and
    that alphabet itself when it must cut one (more than `limit_alphabet` characters; else []).

    The engine's normaliser works character by character, so the counts of its output are those of each
    character's normal form; its alphabet is every character that its pre-tokenizer keeps (all but whitespace),
    and a word character is one that the pre-tokenizer leaves inside a word (not punctuation, not CJK).
    """
    normal: Counter[str] = Counter()
    for char, n in counts.items():
        for c in engine.normalizer.normalize_str(char):
            normal[c] += n
    chars = sorted((c for c in normal if engine.pre_tokenizer.pre_tokenize_str(c)), key=lambda c: (-normal[c], c))
    kept = sorted(chars[:limit_alphabet])

    def inside_a_word(c: str) -> bool:
        return len(engine.pre_tokenizer.pre_tokenize_str(engine.normalizer.normalize_str(f"a{c}a"))) == 1

    return [f"##{c}" for c in kept if inside_a_word(c)], (kept if len(chars) > limit_alphabet else [])


def _capitalised(vocab: Iterable[str]) -> list[str]:
    """The pieces that a lower-cased text can never reach: any with a character that `str.lower` changes ("The",
    "##A"), special and reserved tokens ("[CLS]", "[unused0]") aside."""
    return [t for t in vocab if t != t.lower() and not (t.startswith("[") and t.endswith("]"))]


def vocabulary_casing(vocab: Iterable[str]) -> tuple[bool | None, str]:
    """(cased, why) for a WordPiece vocabulary: True when it holds capitalised pieces (Google's cased vocabularies
    hold thousands), False when it has lower-case letters but no capitalised piece (an uncased one), None when it
    has no cased letter at all (nothing to tell by). `why` says it in words, for the one line the user sees."""
    tokens = list(vocab)
    capitals = _capitalised(tokens)
    if capitals:
        return True, f"cased vocabulary ({len(capitals)} capitalised pieces, e.g. {', '.join(capitals[:3])})"
    if any(t != t.upper() for t in tokens if not (t.startswith("[") and t.endswith("]"))):
        return False, "uncased vocabulary (no capitalised piece)"
    return None, "vocabulary without cased letters"


def _check_casing(source: str, vocab: Iterable[str], lowercase: bool | None, force_casing: bool) -> tuple[bool, str]:
    """(lowercase, note): the casing asked for, or the vocabulary's when None; ValueError for a casing that
    contradicts the vocabulary (lower-casing for a cased one, keeping case for an uncased one) unless forced."""
    cased, why = vocabulary_casing(vocab)
    if lowercase is None:
        return cased is not True, why
    if cased is not None and lowercase == cased and not force_casing:
        wanted, what = ("lower-casing", "its capitalised pieces would never be used") if lowercase else (
            "no lower-casing", "every capitalised word would be pieced as the vocabulary never saw it")
        raise ValueError(f"{source}: {why}, but {wanted} was asked for: {what}; leave the casing to the vocabulary, "
                         f"or force it (force_casing=True, --force-casing)")
    return bool(lowercase), why + (" (casing forced)" if cased is not None and lowercase == cased else "")


class WordPieceTokenizer(PieceTokenizer):
    """BERT's WordPiece tokenizer.

    Build one with `train` (from text), `from_vocab` (a `vocab.txt`) or `from_pretrained` (a model directory);
    `save(dir)` writes `vocab.txt`, `tokenizer_config.json` and `tokenizer.json`, which transformers also reads.
    """

    kind = "wordpiece"  # as `load_tokenizer` and shard manifests name it
    decode_keeps_unk = True  # [UNK] stands for text that was there
    cls_token, sep_token, pad_token, unk_token, mask_token = "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"

    def __init__(self, vocab: dict[str, int], lowercase: bool = True, strip_accents: bool | None = None,
                 source: str = "vocab", compat: str = "transformers") -> None:
        """vocab: {token: id}, ids 0..V-1; compat: "google" or "transformers" (the module docstring), whose
        rules tie accent stripping to lower-casing (Google's; strip_accents must be None or equal lowercase)."""
        if compat not in COMPATS:
            raise ValueError(f"compat {compat!r}: choose google (Google's tokenization.py) or transformers "
                             f"(transformers' BertTokenizer)")
        if compat == "google" and strip_accents is not None and bool(strip_accents) != bool(lowercase):
            raise ValueError(f"{source}: Google's rules strip accents exactly when they lower-case; "
                             f"strip_accents={strip_accents} with lowercase={lowercase} needs compat='transformers'")
        check_vocab(vocab, SPECIAL_TOKENS, source, "a BERT vocabulary")
        self.compat = compat
        self.lowercase = bool(lowercase)
        self.strip_accents = self.lowercase if strip_accents is None else bool(strip_accents)
        # Which rules and casing were chosen, and why, when they were not the files' own (a bare vocab.txt);
        # the command line prints it.
        self.rules_note: str | None = None
        self.backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]",
                                                  max_input_chars_per_word=MAX_WORD_CHARS[compat]))
        self.backend.normalizer = self._normalizer(self.lowercase, self.strip_accents, compat)
        self.backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        self.backend.decoder = decoders.WordPiece(prefix="##")
        self.backend.add_special_tokens(list(SPECIAL_TOKENS))
        self._vocab = dict(vocab)
        self._id_to_token = {i: t for t, i in vocab.items()}
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (vocab[t] for t in SPECIAL_TOKENS)
        self.special_ids = frozenset((self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id))
        self.backend.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", self.cls_id), ("[SEP]", self.sep_id)])
        self._word_engine: Tokenizer | None = None  # pieces the words of `google_words`; made on first use

    @property
    def _words(self) -> Tokenizer:
        """The engine without normaliser or pre-tokenizer: it only pieces words already split by the rules."""
        if self._word_engine is None:
            engine = Tokenizer(models.WordPiece(self._vocab, unk_token="[UNK]",
                                                max_input_chars_per_word=MAX_WORD_CHARS[self.compat]))
            engine.add_special_tokens(list(SPECIAL_TOKENS))
            self._word_engine = engine
        return self._word_engine

    @staticmethod
    def _normalizer(lowercase: bool, strip_accents: bool, compat: str = "transformers") -> normalizers.Normalizer:
        # The rules with the engine's tables: exact on the texts `needs_python` lets through (see the module
        # docstring); also what transformers runs when it reads the saved tokenizer.json.
        if compat == "google":  # clean, CJK spaces, [NFD + drop Mn, lower-case]: nothing composes
            return normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                              strip_accents=strip_accents, lowercase=lowercase)
        steps = [normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False,
                                            lowercase=False),
                 # transformers' BertTokenizer composes characters before lower-casing.
                 normalizers.NFC()]
        if lowercase or strip_accents:
            steps.append(normalizers.BertNormalizer(clean_text=False, handle_chinese_chars=False,
                                                    strip_accents=strip_accents, lowercase=lowercase))
        return normalizers.Sequence(steps)

    # ---- construction ----------------------------------------------------------------------------------------
    @classmethod
    def from_vocab(cls, path: str | os.PathLike, lowercase: bool | None = None, strip_accents: bool | None = None,
                   compat: str = "google", force_casing: bool = False) -> "WordPieceTokenizer":
        """Load a `vocab.txt` (one token per line, the line number is the id).

        A bare vocabulary carries no casing: lowercase None takes the vocabulary's (`vocabulary_casing`: cased when
        it holds capitalised pieces), and a lowercase that contradicts it raises ValueError unless force_casing.
        compat: Google's rules by default, as Google's checkpoints were made with them. `rules_note` says what was
        chosen and why (also logged).
        """
        path = Path(path)
        if path.is_dir():
            path = path / "vocab.txt"
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: vocabulary file not found") from None
        except OSError as err:
            raise OSError(f"{path}: cannot read the vocabulary ({err.strerror})") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            line = raw[: err.start].count(b"\n") + 1
            raise ValueError(f"{path}:{line}: vocabulary is not valid UTF-8") from None
        vocab: dict[str, int] = {}
        for number, token in enumerate(_vocab_lines(text, compat), start=1):
            if token in vocab:
                raise ValueError(f"{path}:{number}: token {token!r} appears twice (first on line {vocab[token] + 1})")
            vocab[token] = len(vocab)
        if not vocab:
            raise ValueError(f"{path}: the vocabulary is empty")
        detected = lowercase is None
        lowercase, why = _check_casing(str(path), vocab, lowercase, force_casing)
        tok = cls(vocab, lowercase=lowercase, strip_accents=strip_accents, source=str(path), compat=compat)
        if detected:
            tok.rules_note = (f"{path.name}: {why}: {'lower-casing' if lowercase else 'no lower-casing'}; "
                              f"{RULES[compat]}")
            log.info("%s", tok.rules_note)
        return tok

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, *, compat: str | None = None,
                        lowercase: bool | None = None, force_casing: bool = False) -> "WordPieceTokenizer":
        """Load from a model directory: `vocab.txt`, with the rules and casing its other files give.

            tokenizer_config.json   its do_lower_case and strip_accents; compat from `bertkit_compat`, else
                                    transformers (a directory transformers or an earlier bertkit wrote)
            only a tokenizer.json   transformers' rules, casing from its BertNormalizer
            neither, or a vocab.txt itself   `from_vocab`: Google's rules, the vocabulary's casing

        compat / lowercase (None: as above) override the files; a lowercase that contradicts the vocabulary's
        casing raises ValueError unless force_casing (the casing a file gives is taken as it stands).
        """
        directory = Path(directory)
        vocab_file = directory if directory.is_file() else directory / "vocab.txt"
        config, engine_file = directory / "tokenizer_config.json", directory / "tokenizer.json"
        settings = None
        if directory.is_dir() and config.is_file():
            data = read_json_object(config)
            settings = (data.get("bertkit_compat", "transformers"), data.get("do_lower_case", True),
                        data.get("strip_accents"))
        elif directory.is_dir() and engine_file.is_file():
            settings = _engine_casing(read_json_object(engine_file).get("normalizer") or {})
        if settings is None:
            return cls.from_vocab(vocab_file, lowercase=lowercase, compat=compat or "google",
                                  force_casing=force_casing)
        found_compat, found_lowercase, strip_accents = settings
        if found_compat not in COMPATS:
            raise ValueError(f"{config}: bertkit_compat {found_compat!r} is neither google nor transformers")
        tok = cls.from_vocab(vocab_file, lowercase=bool(found_lowercase), force_casing=True,
                             strip_accents=None if compat == "google" else strip_accents,
                             compat=compat or found_compat)
        if lowercase is not None and lowercase != tok.lowercase:
            tok = cls.from_vocab(vocab_file, lowercase=lowercase, compat=tok.compat, force_casing=force_casing)
        return tok

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 30522, min_frequency: int = 2,
              lowercase: bool = True, strip_accents: bool | None = None, *, limit_alphabet: int = 1000,
              show_progress: bool = True, compat: str = "transformers") -> "WordPieceTokenizer":
        """Learn a WordPiece vocabulary of at most `vocab_size` tokens from an iterable of strings.

        texts: any iterable of strings; to train from corpus files pass `bertkit.data.corpus.CorpusLines(paths)`,
        whose errors name the file and line. The text is read twice (see `replayable`: corpus files and lists are
        read again, a generator is copied to a temporary file as it is read). Blank strings are skipped; ValueError
        when nothing is left. Special tokens get ids 0-4, then every "##" continuation of the alphabet's word
        characters, in code point order.

        The same text gives the same vocabulary, ids included, on every run: the `tokenizers` trainer numbers
        the continuation pieces in its hash map's order, which changes from process to process, and breaks ties
        between equally frequent merges by those numbers. Counting the characters first and handing the trainer
        the continuations (and, when there are more than `limit_alphabet` characters, the kept alphabet: the most
        frequent, ties to the lower code point) fixes that order.

        compat: the rules the vocabulary learns from and the tokenizer keeps (saved with it); transformers' by
        default, so that transformers' BertTokenizer reads the saved directory with the same ids.
        """
        if vocab_size < len(SPECIAL_TOKENS) + 1:
            raise ValueError(f"vocab_size {vocab_size} is too small")
        if compat not in COMPATS:
            raise ValueError(f"compat {compat!r}: choose google or transformers")
        strip = lowercase if strip_accents is None else strip_accents
        if compat == "google" and strip != lowercase:
            raise ValueError("Google's rules strip accents exactly when they lower-case; "
                             "a different strip_accents needs compat='transformers'")
        engine = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=MAX_WORD_CHARS[compat]))
        engine.normalizer = cls._normalizer(lowercase, strip, compat)
        engine.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        with replayable(texts) as passes:
            # The texts the engine's tables would get wrong are given to it already split by Google's rules (words
            # joined by spaces), which its normaliser leaves as they are but for a few characters whose category
            # changed since its tables (U+1734 say): the vocabulary learns from Google's words.
            def fed() -> Iterator[str]:
                return (" ".join(w for w, _ in google_words(t, lowercase, strip, compat))
                        if needs_python(t, lowercase, compat) else t for t in passes())

            counts = _CharCounts()
            for text in tqdm(fed(), desc="counting characters", unit=" texts", unit_scale=True, mininterval=1,
                             disable=not show_progress):
                counts.add(text)
            counts = counts.finish()
            if not counts:
                raise ValueError("the texts given have no text to train on")
            continuations, alphabet = _fixed_order(engine, counts, limit_alphabet)
            trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                                special_tokens=[*SPECIAL_TOKENS, *continuations],
                                                limit_alphabet=limit_alphabet, initial_alphabet=alphabet,
                                                continuing_subword_prefix="##", show_progress=show_progress)
            engine.train_from_iterator(fed(), trainer=trainer)  # texts already checked (and non-empty) above
        vocab = engine.get_vocab()
        return cls(vocab, lowercase=lowercase, strip_accents=strip_accents, source="trained vocabulary",
                   compat=compat)

    def save(self, directory: str | os.PathLike) -> None:
        """Write `vocab.txt`, `tokenizer_config.json` and `tokenizer.json` into `directory`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tokens = [self._id_to_token[i] for i in range(len(self._id_to_token))]
        atomic_write(directory / "vocab.txt", "".join(t + "\n" for t in tokens))
        config = {"tokenizer_class": "BertTokenizer", "do_lower_case": self.lowercase,
                  "strip_accents": None if self.strip_accents == self.lowercase else self.strip_accents,
                  "tokenize_chinese_chars": True, "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                  "cls_token": "[CLS]", "mask_token": "[MASK]", "model_max_length": 512,
                  # bertkit's rule set (transformers ignores the field; its BertTokenizer applies its own rules).
                  "bertkit_compat": self.compat}
        atomic_write(directory / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")
        atomic_write(directory / "tokenizer.json", self.backend.to_str(pretty=True))

    # ---- vocabulary ------------------------------------------------------------------------------------------
    def word_start_flags(self) -> np.ndarray:
        """(V,) bool: True for the pieces that begin a word wherever they stand, i.e. all but "##" continuations.

        The first piece of a text always begins a word; BERT's pre-tokenizer cuts "#" off as punctuation, so a
        word's first piece never carries the prefix.
        """
        flags = np.ones(self.vocab_size, dtype=bool)
        flags[[i for t, i in self._vocab.items() if t.startswith("##")]] = False
        return flags

    def vocab_hash(self) -> str:
        """SHA-256 of the vocabulary and casing: shards and models record it to refuse a mismatched tokenizer."""
        # hashes from before the compat switch (transformers' rules) stay the same
        compat = f"compat={self.compat}\n" if self.compat != "transformers" else ""
        return self._vocab_digest(f"lowercase={self.lowercase};strip_accents={self.strip_accents}\n{compat}")

    # ---- encoding --------------------------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[str]:
        """WordPiece tokens of `text`, without special tokens."""
        return list(self.encode_raw([text])[0].tokens)

    def needs_python(self, text: str) -> bool:
        """True when `text` goes through Python (`google_words`) rather than the engine alone."""
        return needs_python(text, self.lowercase, self.compat)

    def _by_road(self, texts: Sequence, is_slow, fast, slow) -> list:
        """fast(items) for the items the engine takes alone and slow(items) for the others, in the input order."""
        marks = [is_slow(t) for t in texts]
        if not any(marks):
            return fast(list(texts))
        out = [None] * len(texts)
        for flag, run in ((False, fast), (True, slow)):
            where = [i for i, m in enumerate(marks) if m == flag]
            if where:
                for i, result in zip(where, run([texts[i] for i in where])):
                    out[i] = result
        return out

    def _piece_words(self, items: list[list[tuple[str, Where, int]]]) -> list[Pieces]:
        """Pieces of words already split by Google's rules: per item [(word, where, word index)].

        An engine offset (s, e) within a word becomes (starts[s], ends[e - 1]) in the text; word_ids become the
        given word indexes.
        """
        encodings = self._words.encode_batch([_engine_words([w for w, _, _ in item]) for item in items],
                                             is_pretokenized=True, add_special_tokens=False)
        out = []
        for item, enc in zip(items, encodings):
            offsets, word_ids = [], []
            for (start, end), w in zip(enc.offsets, enc.word_ids):
                word, (starts, ends), index = item[w]
                if _SURROGATE.search(word):  # pieced as "[UNK]" (see `_engine_words`): the whole word
                    start, end = 0, len(word)
                offsets.append((starts[start], ends[end - 1]))
                word_ids.append(index)
            out.append(Pieces(list(enc.ids), list(enc.tokens), offsets, word_ids))
        return out

    def _google_items(self, texts: Sequence[str]) -> list[list[tuple[str, Where, int]]]:
        return [[(w, where, i) for i, (w, where) in enumerate(self._basic(t))] for t in texts]

    def _basic(self, text: str) -> list[tuple[str, Where]]:
        return google_words(text, self.lowercase, self.strip_accents, self.compat)

    def encode_raw(self, texts: Sequence[str]):
        """Encodings (no special tokens) of whole texts: ids, tokens, character offsets, word ids.

        For tasks that build their own inputs from pieces and need offsets into the text (SQuAD windows). Texts the
        engine takes alone come back as `tokenizers.Encoding`, the others as `Pieces` (the same four fields).
        """
        return self._by_road(list(texts), self.needs_python,
                             lambda items: self.backend.encode_batch(items, add_special_tokens=False),
                             lambda items: self._piece_words(self._google_items(items)))

    def encode_plain(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids without special tokens for many texts at once (parallel in the engine); for corpus preparation."""
        def ids(engine: Tokenizer, items: list, **options) -> list[list[int]]:
            call = getattr(engine, "encode_batch_fast", engine.encode_batch)  # without offsets: faster
            return [e.ids for e in call(items, add_special_tokens=False, **options)]

        return self._by_road(list(texts), self.needs_python, lambda items: ids(self.backend, items),
                             lambda items: ids(self._words, [_engine_words([w for w, _ in self._basic(t)])
                                                             for t in items], is_pretokenized=True))

    def encode_words(self, words: Sequence[Sequence[str]]):
        """Encodings (no special tokens) of pre-split words, one list of words per item.

        For tasks whose input comes split into words (CoNLL NER): each word is normalised and pieced on its own
        (Google's rules may still split it, at punctuation), and `word_ids` index the given words; offsets are
        within each word. `tokenizers.Encoding` or `Pieces`, as for `encode_raw`.
        """
        def slow(items: list) -> list[Pieces]:
            return self._piece_words([[(w, where, i) for i, word in enumerate(item)
                                       for w, where in self._basic(word)]
                                      for item in items])

        return self._by_road([list(item) for item in words], lambda item: any(map(self.needs_python, item)),
                             lambda items: self.backend.encode_batch(items, is_pretokenized=True,
                                                                     add_special_tokens=False),
                             slow)

    def _truncate(self, n_a: int, n_b: int | None, budget: int) -> tuple[int, int]:
        _, _, n_a, n_b = truncate_longest_first(range(n_a), None if n_b is None else range(n_b), budget)
        return n_a, n_b

    def __repr__(self) -> str:
        return (f"WordPieceTokenizer(vocab_size={self.vocab_size}, lowercase={self.lowercase}, "
                f"compat={self.compat!r})")
