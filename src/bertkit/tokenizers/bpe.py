"""Byte-level BPE tokenisation (RoBERTa's, GPT-2's vocabulary scheme) on the `tokenizers` engine.

Every text is first seen as UTF-8 bytes mapped to 256 printable characters, so no input is ever unknown; a space
belongs to the word after it (the "Ġ" in "Ġworld"). The engine splits with GPT-2's pattern and applies the learned
merges, configured exactly as transformers' `RobertaTokenizer` is, so both give the same ids from the same
`vocab.json` + `merges.txt`. What RoBERTa adds on top, `<s> A </s>` and `<s> A </s></s> B </s>` with one token
type and longest-first pair truncation, is the framing BERT's tokenizer uses too (`bertkit.tokenizers.base.PieceTokenizer`)
with RoBERTa's tokens and pair rule, so the result is the same `Encoding` (ids, offsets, word and sequence ids).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from bertkit.io import atomic_write, read_json_object
from bertkit.tokenizers.base import PieceTokenizer, check_vocab, train_engine, word_lists

# RoBERTa's special tokens, in the order that gives fairseq's ids 0-4 (<s>=0, <pad>=1, </s>=2, <unk>=3, <mask>).
SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
MERGES_HEADER = "#version: 0.2"


def truncate_pair(n_a: int, n_b: int | None, budget: int) -> tuple[int, int]:
    """How many tokens of a (and b) to keep within `budget`: transformers' (the engine's) longest-first rule.

    The shorter text is kept whole if the longer one can absorb the cut; otherwise both are cut to half the budget
    and the odd token goes to the originally longer one. (BERT's rule, in `bertkit.tokenizers.base`, gives it to the
    first text on ties; RoBERTa has no pair rule of its own, so transformers' is the reference here.)
    """
    budget = max(budget, 0)
    if n_b is None:
        return min(n_a, budget), 0
    if n_a + n_b <= budget:
        return n_a, n_b
    short, long = sorted((n_a, n_b))
    long = short if short > budget else max(short, budget - short)
    if short + long > budget:
        short, long = budget // 2, budget // 2 + budget % 2
    return (long, short) if n_a > n_b else (short, long)


class ByteLevelBPETokenizer(PieceTokenizer):
    """RoBERTa's tokenizer: byte-level BPE with `<s>`/`</s>` framing.

    Build one with `train` (from text), `from_files` (`vocab.json` + `merges.txt`) or `from_pretrained` (a model
    directory); `save(dir)` writes `vocab.json`, `merges.txt`, `tokenizer_config.json` and `tokenizer.json`, which
    transformers' `RobertaTokenizer` reads. The special-token ids are named as in `WordPieceTokenizer` (`cls_id` is
    `<s>`, `sep_id` is `</s>`), so code written for one works with the other.
    """

    kind = "bpe"  # as `bertkit.tokenizers.load_tokenizer` and shard manifests name it
    cls_token, sep_token, pad_token, unk_token, mask_token = "<s>", "</s>", "<pad>", "<unk>", "<mask>"
    pair_separators, pair_type_id = 2, 0  # <s> A </s></s> B </s>, one token type

    def __init__(self, vocab: dict[str, int], merges: Sequence[tuple[str, str]], add_prefix_space: bool = False,
                 trim_offsets: bool = True, source: str = "vocab") -> None:
        check_vocab(vocab, SPECIAL_TOKENS, source, "a RoBERTa vocabulary")
        self.add_prefix_space, self.trim_offsets = bool(add_prefix_space), bool(trim_offsets)
        self._vocab = dict(vocab)
        self._merges = [tuple(m) for m in merges]
        for rank, (a, b) in enumerate(self._merges, start=1):
            # The engine would stop on the first such merge with a bare Exception; say which files disagree.
            lacking = [t for t in (a, b, a + b) if t not in vocab]
            if lacking:
                raise ValueError(f"{source}: merge {rank} ({a!r} {b!r}) needs {lacking[0]!r}, which the vocabulary "
                                 f"lacks: the vocabulary and the merges do not belong together")
        self._id_to_token = {i: t for t, i in vocab.items()}
        self._word_backend = None  # the engine for pre-split words, made on first use (encode_words)
        # As transformers builds it: no unknown token (every byte has a symbol), no word prefixes or suffixes.
        self.backend = Tokenizer(models.BPE(vocab=self._vocab, merges=self._merges, dropout=None,
                                            continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
        self.backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=self.add_prefix_space)
        self.backend.decoder = decoders.ByteLevel()
        # <mask> swallows the space before it ("a <mask>" -> "a", "<mask>"), so the model predicts "Ġword".
        self.backend.add_special_tokens([AddedToken(t, lstrip=t == "<mask>", rstrip=False, normalized=False)
                                         for t in SPECIAL_TOKENS])
        self.bos_id, self.pad_id, self.eos_id, self.unk_id, self.mask_id = (vocab[t] for t in SPECIAL_TOKENS)
        self.cls_id, self.sep_id = self.bos_id, self.eos_id
        self.special_ids = frozenset(vocab[t] for t in SPECIAL_TOKENS)
        # Used by the engine only to trim the whitespace out of offsets (and by transformers' tokenizer.json).
        self.backend.post_processor = processors.RobertaProcessing(
            ("</s>", self.sep_id), ("<s>", self.cls_id), trim_offsets=self.trim_offsets,
            add_prefix_space=self.add_prefix_space)

    # ---- construction ----------------------------------------------------------------------------------------
    @classmethod
    def from_files(cls, vocab_file: str | os.PathLike, merges_file: str | os.PathLike,
                   add_prefix_space: bool = False, trim_offsets: bool = True) -> "ByteLevelBPETokenizer":
        """Load `vocab.json` (token -> id) and `merges.txt` (one "a b" merge per line, rank = line order)."""
        vocab_file, merges_file = Path(vocab_file), Path(merges_file)
        for path in (vocab_file, merges_file):
            if not path.is_file():
                raise FileNotFoundError(f"{path}: tokenizer file not found")
        try:
            vocab = json.loads(vocab_file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{vocab_file}: not a valid JSON vocabulary ({err})") from None
        if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
            raise ValueError(f"{vocab_file}: a vocabulary must map tokens to integer ids")
        merges: list[tuple[str, str]] = []
        for number, line in enumerate(merges_file.read_text(encoding="utf-8").splitlines(), start=1):
            if not line or (number == 1 and line.startswith("#version")):
                continue
            parts = line.split(" ")
            if len(parts) != 2:
                raise ValueError(f"{merges_file}:{number}: a merge is two symbols separated by one space, got {line!r}")
            merges.append((parts[0], parts[1]))
        return cls(vocab, merges, add_prefix_space, trim_offsets, source=str(vocab_file))

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> "ByteLevelBPETokenizer":
        """Load from a model directory: `vocab.json` + `merges.txt`, options from `tokenizer_config.json`."""
        directory = Path(directory)
        options = {}
        config = directory / "tokenizer_config.json"
        if config.is_file():
            data = read_json_object(config)
            options = {k: bool(data[k]) for k in ("add_prefix_space", "trim_offsets") if k in data}
        return cls.from_files(directory / "vocab.json", directory / "merges.txt", **options)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 50265, min_frequency: int = 2, *,
              show_progress: bool = True) -> "ByteLevelBPETokenizer":
        """Learn merges until the vocabulary has `vocab_size` tokens: the 5 special tokens (ids 0-4), the 256 byte
        symbols, then one token per merge.

        texts: any iterable of strings (read lazily, once); to train from corpus files pass
        `bertkit.data.corpus.iter_lines(paths)`. Blank strings are skipped; ValueError when nothing is left.
        """
        floor = len(SPECIAL_TOKENS) + len(pre_tokenizers.ByteLevel.alphabet())
        if vocab_size < floor:
            raise ValueError(f"vocab_size {vocab_size} is too small: the special tokens and the 256 bytes take {floor}")
        engine = Tokenizer(models.BPE(continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
        engine.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                      special_tokens=list(SPECIAL_TOKENS), show_progress=show_progress,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        train_engine(engine, trainer, texts)
        model = json.loads(engine.to_str())["model"]
        merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
        return cls(engine.get_vocab(), merges, source="trained vocabulary")

    def save(self, directory: str | os.PathLike) -> None:
        """Write `vocab.json`, `merges.txt`, `tokenizer_config.json` and `tokenizer.json` into `directory`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        vocab = {self._id_to_token[i]: i for i in range(len(self._id_to_token))}
        atomic_write(directory / "vocab.json", json.dumps(vocab, ensure_ascii=False) + "\n")
        atomic_write(directory / "merges.txt",
                           "".join(f"{line}\n" for line in [MERGES_HEADER, *(f"{a} {b}" for a, b in self._merges)]))
        config = {"tokenizer_class": "RobertaTokenizer", "add_prefix_space": self.add_prefix_space,
                  "trim_offsets": self.trim_offsets, "errors": "replace", "bos_token": "<s>", "eos_token": "</s>",
                  "cls_token": "<s>", "sep_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
                  # roberta-base's <mask>, which swallows the space before it (transformers 5 defaults otherwise)
                  "mask_token": {"__type": "AddedToken", "content": "<mask>", "lstrip": True, "rstrip": False,
                                 "normalized": False, "single_word": False, "special": True},
                  "model_max_length": 512}
        atomic_write(directory / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")
        atomic_write(directory / "tokenizer.json", self.backend.to_str(pretty=True))

    # ---- vocabulary ------------------------------------------------------------------------------------------
    def word_start_flags(self) -> np.ndarray:
        """(V,) bool: True for the pieces that begin a word wherever they stand: those carrying the "Ġ" space.

        A text's first piece begins a word too, though it has no "Ġ" (nothing precedes it; texts are encoded
        without a prefix space, as fairseq encodes RoBERTa's corpus line by line). Pieces of punctuation glued to a
        word ("world" ".") continue it. Special tokens count as word starts.
        """
        flags = np.zeros(self.vocab_size, dtype=bool)
        flags[[i for t, i in self._vocab.items() if t.startswith("Ġ")]] = True
        flags[sorted(self.special_ids)] = True
        return flags

    def vocab_hash(self) -> str:
        """SHA-256 of the vocabulary, the merges and the options: shards and models record it to refuse a mismatch."""
        return self._vocab_digest(f"bpe;add_prefix_space={self.add_prefix_space}\n",
                                  (f"{a} {b}" for a, b in self._merges))

    # ---- encoding --------------------------------------------------------------------------------------------
    def encode_words(self, words: Sequence[Sequence[str]]):
        """Engine encodings (no special tokens) of pre-split words, one list of words per item.

        Each word is encoded with a space before it ("Ġword"), as transformers' RoBERTa tokenizer does with
        `add_prefix_space=True, is_split_into_words=True` (how RoBERTa is given CoNLL words), so a word's pieces
        are those it has inside a sentence. `word_ids` index the given words; offsets are within each word
        (the added space trimmed away).
        """
        if self._word_backend is None:
            # A copy of the engine that puts the space before every word; the tokenizer itself is unchanged.
            engine = Tokenizer.from_str(self.backend.to_str())
            engine.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
            engine.post_processor = processors.RobertaProcessing(
                ("</s>", self.sep_id), ("<s>", self.cls_id), trim_offsets=self.trim_offsets, add_prefix_space=True)
            self._word_backend = engine
        return self._word_backend.encode_batch(word_lists(words), is_pretokenized=True, add_special_tokens=False)

    def _truncate(self, n_a: int, n_b: int | None, budget: int) -> tuple[int, int]:
        return truncate_pair(n_a, n_b, budget)

    def __repr__(self) -> str:
        return f"ByteLevelBPETokenizer(vocab_size={self.vocab_size}, add_prefix_space={self.add_prefix_space})"
