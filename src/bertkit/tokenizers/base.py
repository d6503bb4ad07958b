"""The one tokenizer interface that every verb reads text through, and what the kinds share.

Every kind (`wordpiece.py`, `bpe.py`, `tokenizer_json.py`, `unigram.py`) is a `PieceTokenizer` and implements all
of it; task, data and inference code use nothing else, so any kind works everywhere:

    kind                                   "wordpiece" | "bpe" | "json" | "unigram" (as load_tokenizer and shard
                                           manifests name it)
    vocab_size, len(tok)                   number of ids (one more than the largest id)
    get_vocab()                            {token: id}, special and added tokens included
    token_to_id(token)                     id, or None for a token outside the vocabulary
    id_to_token(id), convert_ids_to_tokens(ids)   token strings
    tokenize(text)                         the pieces of a text, without special tokens
    encode(text, pair=None, max_length=None, truncation=True, padding=False) -> Encoding
                                           one text or pair, framed with special tokens, longest-first truncation
    encode_batch(texts, pairs=None, max_length=None, truncation=True, padding=False) -> list[Encoding]
    encode_raw(texts)                      the engine's encodings of whole texts WITHOUT special tokens
                                           (`tokenizers.Encoding`, or an object with the same .ids .tokens .offsets
                                           .word_ids: WordPiece's `Pieces`); SQuAD's windows
    encode_plain(texts)                    ids only of the same, for corpus preparation
    encode_words(list_of_word_lists)       engine encodings of pre-split words, no special tokens; .word_ids index
                                           the given words, .offsets are within each word; NER
    build_inputs(ids, pair_ids=None)       (input_ids, token_type_ids): already-pieced ids framed as `encode` frames
                                           them, for code that cuts its own pieces (windows, truncated words)
    num_special_tokens(pair=False)         how many special tokens that framing adds
    decode(ids, skip_special_tokens=True)  text from ids
    pad_id unk_id cls_id sep_id mask_id    special ids, None where the kind has no such token (T5-style framing
                                           has no cls: `A </s>`; a T5 vocabulary has no mask but sentinels)
    pad_token unk_token cls_token sep_token mask_token   their strings (None likewise)
    special_ids                            frozenset of every special id (the five above and any other special,
                                           e.g. T5's `<extra_id_N>` sentinels)
    pair_separators                        special tokens between a pair's two texts (BERT 1, RoBERTa 2, T5 1)
    pair_type_id                           token type of the second text (BERT 1; RoBERTa and T5 0)
    save(directory)                        files transformers' AutoTokenizer reads, with the same ids
    from_pretrained(directory)             (classmethod) read them back; `load_tokenizer` picks the kind
    train(texts, vocab_size=..., ...)      (classmethod, trainable kinds) learn a vocabulary from an iterable of
                                           strings; files go through `bertkit.data.corpus.iter_lines` first
    vocab_hash()                           SHA-256 of everything that decides the ids: shards and models record it
    word_start_flags()                     (V,) bool numpy array: the pieces that begin a word wherever they stand
    backend                                the `tokenizers.Tokenizer` engine (corpus preparation drives it directly)

`Encoding` is what `encode` returns; `truncate_longest_first` is BERT's pair rule. WordPiece and byte-level BPE
frame their pieces here in Python (`CLS A SEP [SEP] B SEP`, so the rule is visible); the tokenizer.json kinds
frame with the file's own post-processor, which is what transformers does with the same file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

# Every public member of the interface above: a test checks each kind has them all.
INTERFACE = ("kind", "vocab_size", "get_vocab", "token_to_id", "id_to_token", "convert_ids_to_tokens", "tokenize",
             "encode", "encode_batch", "encode_raw", "encode_plain", "encode_words", "build_inputs",
             "num_special_tokens", "decode", "pad_id", "unk_id", "cls_id", "sep_id", "mask_id", "special_ids",
             "pad_token", "unk_token", "cls_token", "sep_token", "mask_token", "pair_separators", "pair_type_id",
             "save", "from_pretrained", "train", "vocab_hash", "word_start_flags", "backend")


@dataclass
class Encoding:
    """One encoded text or text pair.

    All lists have the same length T (the number of tokens, special tokens included).
    `offsets[i]` is the (start, end) character span of token i in its own text ((0, 0) for special tokens);
    `sequence_ids[i]` says which text that is (0 = first, 1 = pair, None = special);
    `word_ids[i]` is the index of the word token i belongs to within its text (None for special tokens).
    """

    input_ids: list[int]
    token_type_ids: list[int]
    attention_mask: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]
    word_ids: list[int | None]
    sequence_ids: list[int | None]
    special_tokens_mask: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass(frozen=True)
class Frame:
    """Where the special tokens stand around one text (middle empty) or a pair, as (id, token type) pairs.

    single: prefix A suffix;  pair: prefix A middle B suffix. `type_a` / `type_b` are the texts' token types.
    """

    prefix: tuple[tuple[int, int], ...]
    middle: tuple[tuple[int, int], ...]
    suffix: tuple[tuple[int, int], ...]
    type_a: int = 0
    type_b: int = 0

    def __len__(self) -> int:
        return len(self.prefix) + len(self.middle) + len(self.suffix)


def truncate_longest_first(a: list, b: list | None, max_tokens: int) -> tuple[list, list | None, int, int]:
    """Cut the ends of `a` and `b` until len(a) + len(b) <= max_tokens, always from the longer one (ties: from b).

    Returns the kept parts and how many items were kept of each. This is BERT's pair rule: it keeps as much of
    the shorter text as possible.
    """
    if b is None:
        keep_a = min(len(a), max(max_tokens, 0))
        return a[:keep_a], None, keep_a, 0
    keep_a, keep_b = len(a), len(b)
    excess = keep_a + keep_b - max(max_tokens, 0)
    if excess > 0:
        # First remove from the longer one until both are equal, then alternate, b first on ties.
        gap = min(excess, abs(keep_a - keep_b))
        if keep_a > keep_b:
            keep_a -= gap
        else:
            keep_b -= gap
        excess -= gap
        keep_b -= (excess + 1) // 2
        keep_a -= excess // 2
    return a[:keep_a], b[:keep_b], keep_a, keep_b


def checked_texts(texts: Iterable[str]) -> Iterator[str]:
    """The non-blank strings of `texts`, for training; TypeError naming the item that is not a string.

    Training takes text, not file names: a path among the texts is refused with the way to read files.
    """
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts must be an iterable of strings, not one string")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            hint = (" (training takes text; read files with bertkit.data.corpus.iter_lines(paths))"
                    if hasattr(text, "__fspath__") else "")
            raise TypeError(f"texts[{i}] is {type(text).__name__}, not str{hint}")
        if text.strip():
            yield text


@contextlib.contextmanager
def replayable(texts: Iterable[str]) -> Iterator[Callable[[], Iterator[str]]]:
    """A function that gives the non-blank strings of `texts` (`checked_texts`) afresh at each call, for training
    that reads its text twice. A list, a tuple or an iterable marked `rereadable` (`bertkit.data.corpus.CorpusLines`:
    corpus files) is read again; any other iterable (a generator, `iter_lines`) is read once, the first call copying
    its strings to a temporary file (JSON Lines) that later calls read; the file is removed on leaving the context,
    error or not. A later call while the first pass has not been read to its end is a RuntimeError."""
    if isinstance(texts, (list, tuple)) or getattr(texts, "rereadable", False):
        yield lambda: checked_texts(texts)
        return
    handle, name = tempfile.mkstemp(prefix="bertkit-texts-", suffix=".jsonl")
    os.close(handle)
    state = {"passes": 0, "complete": False}

    def first() -> Iterator[str]:
        with open(name, "w", encoding="utf-8", newline="\n") as spool:
            for text in checked_texts(texts):
                spool.write(json.dumps(text, ensure_ascii=False) + "\n")
                yield text
        state["complete"] = True

    def again() -> Iterator[str]:
        if not state["complete"]:
            raise RuntimeError("the texts' first pass was not read to its end")
        with open(name, encoding="utf-8", newline="\n") as spool:
            for line in spool:
                yield json.loads(line)

    def passes() -> Iterator[str]:
        state["passes"] += 1
        return first() if state["passes"] == 1 else again()

    try:
        yield passes
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


def check_vocab(vocab: dict[str, int], specials: Sequence[str], source: str, what: str = "") -> None:
    """ValueError naming `source` when the vocabulary lacks one of `specials` (`what`: "a BERT vocabulary", said
    with the list it needs) or its ids are not 0..V-1 without gaps."""
    missing = [t for t in specials if t not in vocab]
    if missing:
        raise ValueError(f"{source}: the vocabulary lacks the special tokens {missing}"
                         + (f"; {what} needs all of {list(specials)}" if what else ""))
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise ValueError(f"{source}: vocabulary ids must be 0..{len(vocab) - 1} without gaps")


def word_lists(words: Sequence[Sequence[str]]) -> list[list[str]]:
    """Pre-split words (one list per item) as lists; TypeError naming the first word that is not a str."""
    items = [list(item) for item in words]
    for i, item in enumerate(items):
        for j, word in enumerate(item):
            if not isinstance(word, str):
                raise TypeError(f"words[{i}][{j}] is {type(word).__name__}, not str")
    return items


def train_engine(engine, trainer, texts: Iterable[str]) -> None:
    """Train the `tokenizers` engine with `trainer` on the non-blank strings of `texts` (read once, lazily, through
    `checked_texts`); ValueError when there is no text at all."""
    seen = 0

    def counted(stream: Iterable[str]) -> Iterator[str]:
        nonlocal seen
        for text in checked_texts(stream):
            seen += 1
            yield text

    engine.train_from_iterator(counted(texts), trainer=trainer)
    if seen == 0:
        raise ValueError("the texts given have no text to train on")


class PieceTokenizer(ABC):
    """The interface every tokenizer kind implements (see the module docstring), and the framing they share.

    A Python-framed kind (WordPiece, byte-level BPE) sets `_vocab`, `_id_to_token`, `backend`, the special ids and
    strings, `pair_separators`, `pair_type_id`, and implements `_truncate` (its pair rule) and `encode_raw`; the
    framing `CLS A SEP` / `CLS A SEP [SEP] B SEP` is then built here. A kind framed by its engine overrides
    `_encode_many` and `frame`.
    """

    kind = ""
    cls_token: str | None = None
    sep_token: str | None = None
    pad_token: str | None = None
    unk_token: str | None = None
    mask_token: str | None = None
    cls_id: int | None = None
    sep_id: int | None = None
    pad_id: int | None = None
    unk_id: int | None = None
    mask_id: int | None = None
    special_ids: frozenset = frozenset()
    decode_keeps_unk = False  # `decode` keeps the unknown token when it drops the special ones
    pair_separators = 1  # [SEP] between A and B; RoBERTa's "</s></s>" is 2
    pair_type_id = 1  # token type of B and its closing separator; RoBERTa has one type, 0
    _vocab: dict[str, int]
    _id_to_token: dict[int, str]

    # ---- vocabulary ------------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of ids: one more than the largest (the size a model's embedding needs)."""
        size = self.__dict__.get("_vocab_size")
        if size is None:  # the vocabulary never changes after construction: count once
            size = self._vocab_size = max(self._id_to_token) + 1 if self._id_to_token else 0
        return size

    def __len__(self) -> int:
        return self.vocab_size

    def get_vocab(self) -> dict[str, int]:
        return dict(self._vocab)

    def token_to_id(self, token: str) -> int | None:
        return self._vocab.get(token)

    def id_to_token(self, index: int) -> str:
        return self._id_to_token[int(index)]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self._id_to_token[int(i)] for i in ids]

    # ---- what each kind brings (the first two: its engine's, unless it says otherwise) ------------------------
    def tokenize(self, text: str) -> list[str]:
        """The pieces of `text`, without special tokens."""
        return self.backend.encode(text, add_special_tokens=False).tokens

    def encode_raw(self, texts: Sequence[str]) -> list:
        """The engine's encodings (`tokenizers.Encoding`: ids, tokens, character offsets, word ids) of whole texts,
        without special tokens."""
        return self.backend.encode_batch(list(texts), add_special_tokens=False)

    @abstractmethod
    def encode_words(self, words: Sequence[Sequence[str]]) -> list:
        """The engine's encodings of pre-split words (one list of words per item), without special tokens."""

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text from ids by the engine's decoder (WordPiece: `##` pieces joined to the previous token; byte-level
        BPE: bytes joined back, so accents and CJK come back whole), special tokens dropped unless asked for
        (WordPiece keeps [UNK]: `decode_keeps_unk`)."""
        ids = [int(i) for i in ids]
        if skip_special_tokens:
            ids = [i for i in ids if i not in self.special_ids or (self.decode_keeps_unk and i == self.unk_id)]
        return self.backend.decode(ids, skip_special_tokens=False)

    @abstractmethod
    def save(self, directory) -> None:
        """Write the tokenizer files into `directory` (transformers' AutoTokenizer reads them)."""

    @classmethod
    @abstractmethod
    def from_pretrained(cls, directory) -> "PieceTokenizer":
        """Read a tokenizer of this kind from a directory."""

    @classmethod
    @abstractmethod
    def train(cls, texts: Iterable[str], vocab_size: int, **options) -> "PieceTokenizer":
        """Learn a vocabulary from an iterable of strings."""

    @abstractmethod
    def vocab_hash(self) -> str:
        """SHA-256 of what decides the ids."""

    def _vocab_digest(self, head: str, tail: Iterable[str] = ()) -> str:
        """SHA-256 of `head`, then every token in id order and the `tail` lines, each line newline-ended."""
        digest = hashlib.sha256(head.encode("utf-8"))
        for line in (*(self._id_to_token[i] for i in range(len(self._id_to_token))), *tail):
            digest.update(line.encode("utf-8") + b"\n")
        return digest.hexdigest()

    @abstractmethod
    def word_start_flags(self) -> np.ndarray:
        """(V,) bool: True for the pieces that begin a word wherever they stand."""

    def _truncate(self, n_a: int, n_b: int | None, budget: int) -> tuple[int, int]:
        """How many pieces of a (and b) to keep within `budget` tokens (Python-framed kinds)."""
        raise NotImplementedError

    # ---- framing ---------------------------------------------------------------------------------------------
    def frame(self, pair: bool = False) -> Frame:
        """The special tokens around one text or a pair: `CLS A SEP` / `CLS A SEP [SEP] B SEP` here."""
        if not pair:
            return Frame(((self.cls_id, 0),), (), ((self.sep_id, 0),))
        extra = self.pair_separators - 1  # separators after A's closing one, typed like B
        return Frame(((self.cls_id, 0),), ((self.sep_id, 0), *[(self.sep_id, self.pair_type_id)] * extra),
                     ((self.sep_id, self.pair_type_id),), 0, self.pair_type_id)

    def num_special_tokens(self, pair: bool = False) -> int:
        """How many special tokens `encode` adds to one text (or to a pair)."""
        return len(self.frame(pair))

    def build_inputs(self, ids: Sequence[int], pair_ids: Sequence[int] | None = None) -> tuple[list[int], list[int]]:
        """(input_ids, token_type_ids): pieces already cut (no special tokens) framed as `encode` frames a text.

        For code that builds its own windows or truncates word by word: the result is what `encode` gives when
        the texts' pieces are `ids` and `pair_ids`, for every kind (with or without a leading CLS).
        """
        frame = self.frame(pair_ids is not None)
        out_ids = [i for i, _ in frame.prefix] + [int(i) for i in ids]
        types = [t for _, t in frame.prefix] + [frame.type_a] * len(ids)
        if pair_ids is not None:
            out_ids += [i for i, _ in frame.middle] + [int(i) for i in pair_ids]
            types += [t for _, t in frame.middle] + [frame.type_b] * len(pair_ids)
        out_ids += [i for i, _ in frame.suffix]
        types += [t for _, t in frame.suffix]
        return out_ids, types

    # ---- encoding --------------------------------------------------------------------------------------------
    def encode_plain(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids without special tokens for many texts at once (parallel in the engine); for corpus preparation."""
        return [e.ids for e in self.encode_raw(texts)]

    def encode(self, text: str, pair: str | None = None, max_length: int | None = None, truncation: bool = True,
               padding: bool | str = False) -> Encoding:
        """Encode a text (or a pair) with its special tokens.

        max_length: the longest output, special tokens included. With `truncation`, the pieces are cut
        longest-first to fit; without it a longer input raises ValueError.
        padding: False; True or "max_length" pads up to `max_length` (attention_mask 0 there).
        """
        return self.encode_batch([text], None if pair is None else [pair], max_length, truncation, padding)[0]

    def encode_batch(self, texts: Sequence[str], pairs: Sequence[str] | None = None, max_length: int | None = None,
                     truncation: bool = True, padding: bool | str = False) -> list[Encoding]:
        """`encode` for many texts; padding=True pads to the longest in the batch (or to max_length if set)."""
        texts = list(texts)
        for name, items in (("texts", texts), ("pairs", pairs or [])):
            for i, t in enumerate(items):
                if not isinstance(t, str):
                    raise TypeError(f"{name}[{i}] is {type(t).__name__}, not str")
        if pairs is not None:
            pairs = list(pairs)
            if len(pairs) != len(texts):
                raise ValueError(f"{len(texts)} texts but {len(pairs)} pairs")
        if max_length is not None and max_length < self.num_special_tokens(pairs is not None):
            raise ValueError(f"max_length {max_length} leaves no room for text: the special tokens alone take "
                             f"{self.num_special_tokens(pairs is not None)}")
        out = self._encode_many(texts, pairs, max_length, truncation)
        if padding:
            target = max_length if (padding == "max_length" or max_length) and max_length else max(map(len, out))
            for enc in out:
                self._pad(enc, target)
        return out

    def _encode_many(self, texts: list[str], pairs: list[str] | None, max_length: int | None,
                     truncation: bool) -> list[Encoding]:
        """Framed encodings: the engine's pieces, cut by `_truncate`, in this class's `frame`."""
        firsts = self.encode_raw(texts)
        seconds = self.encode_raw(pairs) if pairs is not None else None
        return [self._build(firsts[i], None if seconds is None else seconds[i], max_length, truncation)
                for i in range(len(texts))]

    def _build(self, a, b, max_length: int | None, truncation: bool) -> Encoding:
        frame = self.frame(b is not None)
        n_a, n_b = len(a.ids), (0 if b is None else len(b.ids))
        if max_length is not None and n_a + n_b + len(frame) > max_length:
            _too_long(n_a + n_b + len(frame), max_length, truncation)
            n_a, n_b = self._truncate(n_a, None if b is None else n_b, max_length - len(frame))
        ids: list[int] = []
        types: list[int] = []
        tokens: list[str] = []
        offsets: list[tuple[int, int]] = []
        word_ids: list[int | None] = []
        seq_ids: list[int | None] = []

        def specials(items) -> None:
            for index, type_id in items:
                ids.append(index), types.append(type_id), tokens.append(self._id_to_token[index])
                offsets.append((0, 0)), word_ids.append(None), seq_ids.append(None)

        def text(enc, n: int, type_id: int, seq: int) -> None:
            ids.extend(enc.ids[:n]), types.extend([type_id] * n), tokens.extend(enc.tokens[:n])
            offsets.extend(enc.offsets[:n]), word_ids.extend(enc.word_ids[:n]), seq_ids.extend([seq] * n)

        specials(frame.prefix)
        text(a, n_a, frame.type_a, 0)
        if b is not None:
            specials(frame.middle)
            text(b, n_b, frame.type_b, 1)
        specials(frame.suffix)
        special = [1 if s is None else 0 for s in seq_ids]
        return Encoding(ids, types, [1] * len(ids), tokens, offsets, word_ids, seq_ids, special)

    def _pad(self, enc: Encoding, length: int) -> None:
        extra = length - len(enc.input_ids)
        if extra <= 0:
            return
        if self.pad_id is None:
            raise ValueError(f"this {self.kind} tokenizer has no padding token; encode without padding")
        enc.input_ids += [self.pad_id] * extra
        enc.token_type_ids += [0] * extra
        enc.attention_mask += [0] * extra
        enc.tokens += [self.pad_token] * extra
        enc.offsets += [(0, 0)] * extra
        enc.word_ids += [None] * extra
        enc.sequence_ids += [None] * extra
        enc.special_tokens_mask += [1] * extra


def _too_long(length: int, max_length: int, truncation: bool) -> None:
    if not truncation:
        raise ValueError(f"input of {length} tokens is longer than max_length {max_length} and truncation is off")
