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
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from bertkit.io import atomic_write
from bertkit.tokenizers.base import PieceTokenizer, checked_texts, truncate_longest_first

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


class WordPieceTokenizer(PieceTokenizer):
    """BERT's WordPiece tokenizer.

    Build one with `train` (from text), `from_vocab` (a `vocab.txt`) or `from_pretrained` (a model directory);
    `save(dir)` writes `vocab.txt`, `tokenizer_config.json` and `tokenizer.json`, which transformers also reads.
    """

    kind = "wordpiece"  # as `load_tokenizer` and shard manifests name it
    cls_token, sep_token, pad_token, unk_token, mask_token = "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"

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
    def train(cls, texts: Iterable[str], vocab_size: int = 30522, min_frequency: int = 2,
              lowercase: bool = True, strip_accents: bool | None = None, *, limit_alphabet: int = 1000,
              show_progress: bool = True) -> "WordPieceTokenizer":
        """Learn a WordPiece vocabulary of at most `vocab_size` tokens from an iterable of strings.

        texts: any iterable of strings (read lazily, once); to train from corpus files pass
        `bertkit.data.corpus.iter_lines(paths)`, whose errors name the file and line. Blank strings are skipped;
        ValueError when nothing is left. Special tokens get ids 0-4.
        """
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
            for text in checked_texts(stream):
                seen += 1
                yield text

        engine.train_from_iterator(counted(texts), trainer=trainer)
        if seen == 0:
            raise ValueError("the texts given have no text to train on")
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
