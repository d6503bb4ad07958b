"""WordPiece tokenisation on the `tokenizers` engine, with BERT's input format built here.

The engine does the heavy lifting (normalisation, pre-tokenisation, greedy longest-match-first WordPiece, training),
configured to give exactly the ids of Google's original Python tokenizer:

    clean text (drop NUL, U+FFFD and control characters; whitespace -> " ") and put spaces around CJK characters
    -> NFC -> [uncased: final-sigma rule, lower-case, strip accents (NFD, drop Mn)]
    -> split on whitespace and punctuation -> WordPiece (words over 100 characters become [UNK])

What BERT adds on top, `[CLS] A [SEP] B [SEP]` with token types 0/1 and longest-first pair truncation, is written
here in Python so that the rule is visible and the same for training data, fine-tuning and inference.
"""

from __future__ import annotations

import hashlib
import json
import os
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bertkit.io import atomic_write
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MAX_WORD_CHARS = 100  # longer words become [UNK], as in Google's tokenizer

# CJK ideograph blocks that BERT surrounds with spaces (as in Google's tokenizer).
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
               (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _final_sigma(text: str) -> str:
    """Write "ς" for every capital sigma that Python's `str.lower()` would turn into a final sigma.

    Google's tokenizer lower-cases each whitespace-separated word with `str.lower()`, which applies Unicode's
    context-dependent Final_Sigma rule; the engine lower-cases character by character and always writes "σ".
    Marking those capitals beforehand keeps every offset (one character for one) and makes both agree.
    """
    if "Σ" not in text:
        return text
    words: list[list[int]] = [[]]
    for i, char in enumerate(text):
        cp = ord(char)
        if cp == 0 or cp == 0xFFFD or (unicodedata.category(char).startswith("C") and char not in "\t\n\r"):
            continue  # removed by text cleaning, so its neighbours touch
        if char.isspace() or unicodedata.category(char) == "Zs" or any(a <= cp <= b for a, b in _CJK_RANGES):
            words.append([])
        else:
            words[-1].append(i)
    chars = list(text)
    for word in words:
        if not any(text[i] == "Σ" for i in word):
            continue
        lowered = "".join(text[i] for i in word).lower()
        at = 0
        for i in word:
            if text[i] == "Σ" and lowered[at] == "ς":
                chars[i] = "ς"
            at += len(text[i].lower())
    return "".join(chars)


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


class PieceTokenizer:
    """What WordPiece and byte-level BPE share: vocabulary lookups, and the special-token framing of the engine's
    pieces, `CLS A SEP` or `CLS A SEP [SEP] B SEP`, built here in Python so the rule is visible.

    A subclass sets `_vocab`, `_id_to_token`, `backend`, `cls_id`, `sep_id`, `pad_id`, `special_ids`, the three
    framing tokens' strings, how many separators stand between a pair's texts, the pair text's token type, and
    `_truncate` (its pair rule); `encode_raw` gives the engine's encodings of whole texts.
    """

    cls_token = sep_token = pad_token = ""
    pair_separators = 1  # [SEP] between A and B; RoBERTa's "</s></s>" is 2
    pair_type_id = 1  # token type of B and its closing separator; RoBERTa has one type, 0

    # ---- vocabulary ------------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    def __len__(self) -> int:
        return len(self._vocab)

    def get_vocab(self) -> dict[str, int]:
        return dict(self._vocab)

    def token_to_id(self, token: str) -> int | None:
        return self._vocab.get(token)

    def id_to_token(self, index: int) -> str:
        return self._id_to_token[index]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self._id_to_token[int(i)] for i in ids]

    # ---- encoding --------------------------------------------------------------------------------------------
    def encode_raw(self, texts: Sequence[str]):
        """The engine's encodings of whole texts, without special tokens."""
        raise NotImplementedError

    def encode_plain(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids without special tokens for many texts at once (parallel in the engine); for corpus preparation."""
        return [e.ids for e in self.encode_raw(texts)]

    def _truncate(self, n_a: int, n_b: int | None, budget: int) -> tuple[int, int]:
        """How many pieces of a (and b) to keep within `budget` tokens."""
        raise NotImplementedError

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
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"texts[{i}] is {type(t).__name__}, not str")
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(pairs)} pairs")
        firsts = self.encode_raw(texts)
        seconds = self.encode_raw(list(pairs)) if pairs is not None else None
        out = [self._build(firsts[i], None if seconds is None else seconds[i], max_length, truncation)
               for i in range(len(texts))]
        if padding:
            target = max_length if (padding == "max_length" or max_length) and max_length else max(map(len, out))
            for enc in out:
                self._pad(enc, target)
        return out

    def _build(self, a, b, max_length: int | None, truncation: bool) -> Encoding:
        specials = 2 if b is None else 1 + self.pair_separators + 1
        n_a, n_b = len(a.ids), (0 if b is None else len(b.ids))
        if max_length is not None and n_a + n_b + specials > max_length:
            if not truncation:
                raise ValueError(f"input of {n_a + n_b + specials} tokens is longer than max_length {max_length} "
                                 f"and truncation is off")
            n_a, n_b = self._truncate(n_a, None if b is None else n_b, max_length - specials)
        ids = [self.cls_id, *a.ids[:n_a], self.sep_id]
        tokens = [self.cls_token, *a.tokens[:n_a], self.sep_token]
        offsets = [(0, 0), *a.offsets[:n_a], (0, 0)]
        word_ids = [None, *a.word_ids[:n_a], None]
        seq_ids: list[int | None] = [None, *([0] * n_a), None]
        types = [0] * (n_a + 2)
        if b is not None:
            extra = self.pair_separators - 1  # separators after A's closing one
            ids += [*([self.sep_id] * extra), *b.ids[:n_b], self.sep_id]
            tokens += [*([self.sep_token] * extra), *b.tokens[:n_b], self.sep_token]
            offsets += [*([(0, 0)] * extra), *b.offsets[:n_b], (0, 0)]
            word_ids += [*([None] * extra), *b.word_ids[:n_b], None]
            seq_ids += [*([None] * extra), *([1] * n_b), None]
            types += [self.pair_type_id] * (extra + n_b + 1)
        special = [1 if s is None else 0 for s in seq_ids]
        return Encoding(ids, types, [1] * len(ids), tokens, offsets, word_ids, seq_ids, special)

    def _pad(self, enc: Encoding, length: int) -> None:
        extra = length - len(enc.input_ids)
        if extra <= 0:
            return
        enc.input_ids += [self.pad_id] * extra
        enc.token_type_ids += [0] * extra
        enc.attention_mask += [0] * extra
        enc.tokens += [self.pad_token] * extra
        enc.offsets += [(0, 0)] * extra
        enc.word_ids += [None] * extra
        enc.sequence_ids += [None] * extra
        enc.special_tokens_mask += [1] * extra


class WordPieceTokenizer(PieceTokenizer):
    """BERT's WordPiece tokenizer.

    Build one with `train` (from text), `from_vocab` (a `vocab.txt`) or `from_pretrained` (a model directory);
    `save(dir)` writes `vocab.txt`, `tokenizer_config.json` and `tokenizer.json`, which transformers also reads.
    """

    kind = "wordpiece"  # as `load_tokenizer` and shard manifests name it
    cls_token, sep_token, pad_token = "[CLS]", "[SEP]", "[PAD]"

    def __init__(self, vocab: dict[str, int], lowercase: bool = True, strip_accents: bool | None = None,
                 source: str = "vocab") -> None:
        missing = [t for t in SPECIAL_TOKENS if t not in vocab]
        if missing:
            raise ValueError(f"{source}: the vocabulary lacks the special tokens {missing}; a BERT vocabulary needs "
                             f"all of {list(SPECIAL_TOKENS)}")
        if sorted(vocab.values()) != list(range(len(vocab))):
            raise ValueError(f"{source}: vocabulary ids must be 0..{len(vocab) - 1} without gaps")
        self.lowercase = bool(lowercase)
        self.strip_accents = self.lowercase if strip_accents is None else bool(strip_accents)
        self.backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=MAX_WORD_CHARS))
        self.backend.normalizer = self._normalizer(self.lowercase, self.strip_accents)
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

    @staticmethod
    def _normalizer(lowercase: bool, strip_accents: bool) -> normalizers.Normalizer:
        steps = [normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False,
                                            lowercase=False),
                 # Google's tokenizer (as kept by transformers) composes characters before lower-casing.
                 normalizers.NFC()]
        if lowercase or strip_accents:
            steps.append(normalizers.BertNormalizer(clean_text=False, handle_chinese_chars=False,
                                                    strip_accents=strip_accents, lowercase=lowercase))
        return normalizers.Sequence(steps)

    # ---- construction ----------------------------------------------------------------------------------------
    @classmethod
    def from_vocab(cls, path: str | os.PathLike, lowercase: bool = True,
                   strip_accents: bool | None = None) -> "WordPieceTokenizer":
        """Load a `vocab.txt` (one token per line, the line number is the id)."""
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
        for number, token in enumerate(text.splitlines(), start=1):
            token = token.rstrip("\r")  # Google's vocab files end lines with "\n"; tolerate Windows ones
            if token in vocab:
                raise ValueError(f"{path}:{number}: token {token!r} appears twice (first on line {vocab[token] + 1})")
            vocab[token] = len(vocab)
        if not vocab:
            raise ValueError(f"{path}: the vocabulary is empty")
        return cls(vocab, lowercase=lowercase, strip_accents=strip_accents, source=str(path))

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> "WordPieceTokenizer":
        """Load from a model directory: `vocab.txt` plus casing from `tokenizer_config.json` when present.

        A path to a vocab file itself is read with `from_vocab` (uncased).
        """
        directory = Path(directory)
        if directory.is_file():
            return cls.from_vocab(directory)
        lowercase, strip_accents = True, None
        config = directory / "tokenizer_config.json"
        if config.is_file():
            data = json.loads(config.read_text(encoding="utf-8"))
            lowercase = bool(data.get("do_lower_case", True))
            strip_accents = data.get("strip_accents")
        return cls.from_vocab(directory / "vocab.txt", lowercase=lowercase, strip_accents=strip_accents)

    @classmethod
    def train(cls, files: Sequence[str | os.PathLike] | None = None, vocab_size: int = 30522, min_frequency: int = 2,
              lowercase: bool = True, strip_accents: bool | None = None, *, texts: Iterable[str] | None = None,
              limit_alphabet: int = 1000, show_progress: bool = True) -> "WordPieceTokenizer":
        """Learn a WordPiece vocabulary of at most `vocab_size` tokens from text.

        `files` are corpus files in any format `bertkit.data.corpus` reads (plain text, JSON Lines, gzip);
        `texts` is an alternative iterable of strings. Special tokens get ids 0-4.
        """
        from bertkit.data.corpus import iter_lines

        if vocab_size < len(SPECIAL_TOKENS) + 1:
            raise ValueError(f"vocab_size {vocab_size} is too small")
        strip = lowercase if strip_accents is None else strip_accents
        engine = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=MAX_WORD_CHARS))
        engine.normalizer = cls._normalizer(lowercase, strip)
        engine.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                            special_tokens=list(SPECIAL_TOKENS), limit_alphabet=limit_alphabet,
                                            continuing_subword_prefix="##", show_progress=show_progress)
        seen = 0

        def counted(stream: Iterable[str]) -> Iterator[str]:
            nonlocal seen
            for text in stream:
                if text.strip():
                    seen += 1
                    yield text

        source = texts if texts is not None else iter_lines(files or [])
        engine.train_from_iterator(counted(source), trainer=trainer)
        if seen == 0:
            raise ValueError(f"the corpus {[str(f) for f in files or []] or '(texts)'} has no text to train on")
        vocab = engine.get_vocab()
        return cls(vocab, lowercase=lowercase, strip_accents=strip_accents, source="trained vocabulary")

    def save(self, directory: str | os.PathLike) -> None:
        """Write `vocab.txt`, `tokenizer_config.json` and `tokenizer.json` into `directory`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tokens = [self._id_to_token[i] for i in range(len(self._id_to_token))]
        atomic_write(directory / "vocab.txt", "".join(t + "\n" for t in tokens))
        config = {"tokenizer_class": "BertTokenizer", "do_lower_case": self.lowercase,
                  "strip_accents": None if self.strip_accents == self.lowercase else self.strip_accents,
                  "tokenize_chinese_chars": True, "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                  "cls_token": "[CLS]", "mask_token": "[MASK]", "model_max_length": 512}
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
        digest = hashlib.sha256()
        digest.update(f"lowercase={self.lowercase};strip_accents={self.strip_accents}\n".encode())
        for i in range(len(self._id_to_token)):
            digest.update(self._id_to_token[i].encode("utf-8") + b"\n")
        return digest.hexdigest()

    # ---- encoding --------------------------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[str]:
        """WordPiece tokens of `text`, without special tokens."""
        return self.backend.encode(self.engine_text(text), add_special_tokens=False).tokens

    def engine_text(self, text: str) -> str:
        """`text` as the engine must receive it: with final sigmas marked when lower-casing (see _final_sigma).

        Callers that drive `backend` themselves (corpus preparation) pass their text through this first.
        """
        return _final_sigma(text) if self.lowercase else text

    def encode_raw(self, texts: Sequence[str]):
        """Engine encodings (no special tokens) of whole texts: ids, tokens, character offsets, word ids.

        For tasks that build their own inputs from pieces and need offsets into the text (SQuAD windows).
        """
        return self.backend.encode_batch([self.engine_text(t) for t in texts], add_special_tokens=False)

    def encode_words(self, words: Sequence[Sequence[str]]):
        """Engine encodings (no special tokens) of pre-split words, one list of words per item.

        For tasks whose input comes split into words (CoNLL NER): each word is normalised and pieced on its own,
        and `word_ids` index the given words. Returns `tokenizers.Encoding` objects (ids, tokens, offsets within
        each word, word_ids).
        """
        prepared = [[self.engine_text(w) for w in item] for item in words]
        return self.backend.encode_batch(prepared, is_pretokenized=True, add_special_tokens=False)

    def _truncate(self, n_a: int, n_b: int | None, budget: int) -> tuple[int, int]:
        _, _, n_a, n_b = truncate_longest_first(range(n_a), None if n_b is None else range(n_b), budget)
        return n_a, n_b

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text from ids: `##` pieces joined to the previous token, special tokens dropped unless asked for."""
        ids = [int(i) for i in ids]
        if skip_special_tokens:
            ids = [i for i in ids if i not in self.special_ids or i == self.unk_id]
        return self.backend.decode(ids, skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"WordPieceTokenizer(vocab_size={self.vocab_size}, lowercase={self.lowercase})"


# ---- either kind of vocabulary ------------------------------------------------------------------------------------
TOKENIZER_KINDS = ("wordpiece", "bpe")
# tokenizer_config.json classes that settle which kind a directory holding both kinds of files is.
_CONFIG_CLASSES = {"BertTokenizer": "wordpiece", "BertTokenizerFast": "wordpiece",
                   "RobertaTokenizer": "bpe", "RobertaTokenizerFast": "bpe"}


def detect_tokenizer_kind(path: str | os.PathLike) -> str:
    """"wordpiece" or "bpe": the kind of tokenizer that the files at `path` hold.

    path: a directory holding `vocab.txt` (WordPiece) or `vocab.json` + `merges.txt` (byte-level BPE), or one of
    those files itself (a `.json` vocabulary is BPE, with `merges.txt` beside it). A directory with both kinds of
    files is settled by the `tokenizer_class` of its `tokenizer_config.json`. FileNotFoundError when there is
    nothing to load, ValueError when the files are incomplete (`vocab.json` without `merges.txt`) or ambiguous.
    """
    path = Path(path)
    if path.is_file():
        return "bpe" if path.suffix == ".json" else "wordpiece"
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such tokenizer directory or vocabulary file")
    wordpiece = (path / "vocab.txt").is_file()
    bpe = [name for name in ("vocab.json", "merges.txt") if (path / name).is_file()]
    if len(bpe) == 1:
        missing = ({"vocab.json", "merges.txt"} - set(bpe)).pop()
        if not wordpiece:
            raise ValueError(f"{path}: has {bpe[0]} but not {missing}; a byte-level BPE tokenizer needs both")
        bpe = []
    if wordpiece and bpe:
        config = path / "tokenizer_config.json"
        name = json.loads(config.read_text(encoding="utf-8")).get("tokenizer_class") if config.is_file() else None
        if name in _CONFIG_CLASSES:
            return _CONFIG_CLASSES[name]
        raise ValueError(f"{path}: holds both a WordPiece vocabulary (vocab.txt) and a byte-level BPE one "
                         f"(vocab.json + merges.txt); say which to use (kind='wordpiece' or 'bpe', "
                         f"--tokenizer-kind on the command line)")
    if wordpiece:
        return "wordpiece"
    if bpe:
        return "bpe"
    raise FileNotFoundError(f"{path}: no tokenizer files: expected vocab.txt (WordPiece) or vocab.json + merges.txt "
                            f"(byte-level BPE)")


def load_tokenizer(path: str | os.PathLike, kind: str | None = None):
    """A `WordPieceTokenizer` or a `bertkit.bpe.ByteLevelBPETokenizer` from a directory or vocabulary file.

    kind: None detects it from the files (`detect_tokenizer_kind`); "wordpiece" or "bpe" insists on that kind
    and raises ValueError naming the files found when they are the other kind's.
    """
    from bertkit.bpe import ByteLevelBPETokenizer

    if kind is not None and kind not in TOKENIZER_KINDS:
        raise ValueError(f"unknown tokenizer kind {kind!r}; choose one of {', '.join(TOKENIZER_KINDS)}")
    path = Path(path)
    if kind is None:
        kind = detect_tokenizer_kind(path)
    elif not path.exists():
        raise FileNotFoundError(f"{path}: no such tokenizer directory or vocabulary file")
    elif path.is_dir():
        needed = ["vocab.txt"] if kind == "wordpiece" else ["vocab.json", "merges.txt"]
        missing = [name for name in needed if not (path / name).is_file()]
        if missing:
            present = [n for n in ("vocab.txt", "vocab.json", "merges.txt") if (path / n).is_file()]
            what = (" (a WordPiece vocabulary)" if "vocab.txt" in present else
                    " (a byte-level BPE tokenizer)" if len(present) == 2 else "")
            found = f"it has {', '.join(present)}{what}" if present else "it has no tokenizer files"
            raise ValueError(f"{path}: a {kind} tokenizer needs {' + '.join(needed)}, but "
                             f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing; {found}")
    elif (path.suffix == ".json") != (kind == "bpe"):
        raise ValueError(f"{path}: a {kind} tokenizer is not read from this file "
                         f"({'vocab.json + merges.txt' if kind == 'bpe' else 'vocab.txt'} expected)")
    if kind == "wordpiece":
        return WordPieceTokenizer.from_pretrained(path)
    if path.is_file():
        return ByteLevelBPETokenizer.from_files(path, path.parent / "merges.txt")
    return ByteLevelBPETokenizer.from_pretrained(path)
