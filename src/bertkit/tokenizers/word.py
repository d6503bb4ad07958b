"""Word-level tokenisation with characters: ELMo's input (a word vocabulary for the softmax, characters for the
token encoder).

Text is split on whitespace and around every punctuation character (BERT's pre-tokenizer, case kept; a released
ELMo's text on whitespace only, as bilm-tf and AllenNLP read it: `words`, `split_words`); each word
is one token, whose id is its rank in the vocabulary (`<pad>`=0, `<unk>`=1, `<s>`=2, `</s>`=3, then the words by
frequency, which is what a log-uniform sampled softmax assumes) or `<unk>`'s. A sentence is framed `<s> A </s>`
(a pair `<s> A </s> B </s>`). The pipeline is a transformers `tokenizer.json` (WordLevel model), so
`JsonTokenizer` runs it and `transformers.AutoTokenizer` reads it.

Characters: `word_chars.json` beside it holds the character vocabulary (ids from 6 on, most frequent first) and
`max_characters` W. `char_ids(words)` gives each word as W ids: <begin-of-word>, its characters, <end-of-word>,
then 0 (padding); `<s>` and `</s>` get a character of their own, a padding word all zeros. A word longer than
W - 2 characters is cut (and counted in `char_stats["truncated_words"]`), a character outside the vocabulary is
<unknown-char> (counted in `char_stats["unknown_chars"]`).

Released ELMo models (allenai/bilm-tf's `options.json` + `weights.hdf5`, which AllenNLP reads too) spell words in
UTF-8 bytes instead (`byte_chars`, "scheme": "utf-8 bytes" in word_chars.json): bilm-tf's `UnicodeCharsVocabulary`
ids shifted up by one so that 0 pads a word (as its `Batcher` and AllenNLP's `ELMoCharacterMapper` feed them): a
byte b is b + 1, begin/end-of-sentence 257/258, begin/end-of-word 259/260, and the rest of a word 261 (bilm-tf's
padding character), a word cut to W - 2 bytes. `from_bilm(directory)` makes that tokenizer from the directory's
options.json and bilm-tf's vocab.txt (one word a line, its `<S>`, `</S>`, `<UNK>` read as `<s>`, `</s>`, `<unk>`).

Open vocabulary: the ids a word-level vocabulary gives lose the spelling of unknown words, which the characters
need. With `open_vocabulary = True`, `encode*` give each unknown word an id of its own above the vocabulary
(vocab_size, vocab_size + 1, ... in order of first appearance, kept for the process per vocabulary), which `id_to_token`
and `char_ids_of` map back to the word. Only the character encoder may read such ids (ELMo's features and
frozen-encoder task models turn them on); corpus preparation always gives `<unk>`'s id.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors, trainers

from bertkit.io import atomic_write
from bertkit.tokenizers.base import Encoding, train_engine
from bertkit.tokenizers.tokenizer_json import TOKENIZER_FILE, JsonTokenizer, load_backend, read_configs
from bertkit.tokenizers.wordpiece import Pieces

SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>")
_OPEN_WORDS: dict[str, tuple[dict[str, int], list[str]]] = {}  # vocab_hash -> (word -> id, words)
CHARS_FILE = "word_chars.json"
# Character ids: 0 pads a word, then the marks; learned characters start at FIRST_CHAR.
PAD_CHAR, BOW, EOW, UNK_CHAR, BOS_CHAR, EOS_CHAR = range(6)
FIRST_CHAR = 6
DEFAULT_MAX_CHARACTERS = 50  # bilm-tf's
# bilm-tf's character ids (UnicodeCharsVocabulary: bytes 0-255, then these), each + 1 as its Batcher feeds them.
BYTES_SCHEME = "utf-8 bytes"
BILM_BOS, BILM_EOS, BILM_BOW, BILM_EOW, BILM_PAD = (c + 1 for c in range(256, 261))
BILM_CHAR_VOCAB = 262  # 0 (a padding word) + bilm-tf's 261 characters
BILM_OPTIONS, BILM_WEIGHTS, BILM_VOCAB = "options.json", "weights.hdf5", "vocab.txt"
_BILM_SPECIALS = {"<S>": "<s>", "</S>": "</s>", "<UNK>": "<unk>"}
# How text splits into words: "bert" (BERT's pre-tokenizer: whitespace, and around every punctuation character; what
# bertkit's own word tokenizers train and read with) or "whitespace" (on whitespace only: bilm-tf's and AllenNLP's
# reading of a released ELMo, whose text came tokenized, `U.S.` one word).
WORD_SPLITS = ("whitespace", "bert")


def is_bilm_directory(path: str | os.PathLike) -> bool:
    """Whether `path` is a released ELMo in bilm-tf's layout (options.json + weights.hdf5) without a tokenizer.json
    of bertkit's (a directory bertkit wrote reads as its own)."""
    path = Path(path)
    return ((path / BILM_OPTIONS).is_file() and (path / BILM_WEIGHTS).is_file()
            and not (path / TOKENIZER_FILE).is_file())


def read_bilm_vocab(path: str | os.PathLike) -> dict[str, int]:
    """bertkit's word vocabulary for bilm-tf's vocab.txt (one word a line, most frequent first): the four special
    tokens, then the file's words in order (`<S>`, `</S>`, `<UNK>` are the specials; a repeated word keeps its first
    id). Only the specials when the file does not exist (features read words by their characters anyway)."""
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    path = Path(path)
    if not path.is_file():
        return vocab
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err})") from None
    for line in lines:
        word = line.strip()
        if word and _BILM_SPECIALS.get(word, word) not in vocab:
            vocab[word] = len(vocab)
    return vocab


class WordTokenizer(JsonTokenizer):
    """Words (a WordLevel tokenizer.json) plus characters (word_chars.json); see the module docstring."""

    kind = "word"  # as `load_tokenizer` and shard manifests name it

    def __init__(self, backend: Tokenizer, chars: Sequence[str], max_characters: int = DEFAULT_MAX_CHARACTERS,
                 config: dict | None = None, source: str = TOKENIZER_FILE, byte_chars: bool = False) -> None:
        model = json.loads(backend.to_str()).get("model") or {}
        if model.get("type", "WordLevel") != "WordLevel":
            raise ValueError(f"{source}: a word tokenizer needs a WordLevel model, this one is {model.get('type')}")
        super().__init__(backend, config, source)
        missing = [t for t in SPECIAL_TOKENS if t not in self._vocab]
        if missing:
            raise ValueError(f"{source}: the vocabulary lacks the special tokens {missing}")
        if not isinstance(max_characters, int) or max_characters < 3:
            raise ValueError(f"{source}: max_characters must be an integer of at least 3 (the two word marks and a "
                             f"character), got {max_characters!r}")
        self.byte_chars = byte_chars  # bilm-tf's UTF-8 byte ids (a released ELMo) instead of learned characters
        self.chars = [] if byte_chars else list(chars)
        self.char_to_id = {c: FIRST_CHAR + i for i, c in enumerate(self.chars)}
        self.max_characters = max_characters
        self.char_stats = Counter()  # truncated_words, unknown_chars: what char_ids had to change
        self.open_vocabulary = False
        # unknown word -> its open-vocabulary id, and the words by id: shared by every tokenizer of this vocabulary in
        # the process, so that a model directory read back later (the best epoch's) reads the same ids
        self._extra, self._extra_words = _OPEN_WORDS.setdefault(self.vocab_hash(), ({}, []))

    @property
    def words(self) -> str:
        """How text splits into words: "whitespace" or "bert" (see WORD_SPLITS), as tokenizer.json's pre-tokenizer
        says."""
        kind = (json.loads(self.backend.to_str()).get("pre_tokenizer") or {}).get("type")
        return "whitespace" if kind == "WhitespaceSplit" else "bert"

    def split_words(self, words: str) -> "WordTokenizer":
        """Split text into words the `words` way from now on ("whitespace" or "bert"); returns self. ValueError
        naming the choices otherwise. Saved with the tokenizer (tokenizer.json's pre-tokenizer)."""
        if words not in WORD_SPLITS:
            raise ValueError(f"--words must be one of {', '.join(WORD_SPLITS)}, got {words!r}")
        if words != self.words:
            self.backend.pre_tokenizer = _pre_tokenizer(words)
            self._extra, self._extra_words = _OPEN_WORDS.setdefault(self.vocab_hash(), ({}, []))
            self.__dict__.pop("_table", None)
        return self

    @property
    def char_vocab_size(self) -> int:
        return BILM_CHAR_VOCAB if self.byte_chars else FIRST_CHAR + len(self.chars)

    # ---- construction ----------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> "WordTokenizer":
        """Read `tokenizer.json` and `word_chars.json` (and the configs) from a directory."""
        directory = Path(directory)
        if directory.is_file():
            directory = directory.parent
        if is_bilm_directory(directory):
            return cls.from_bilm(directory)
        file, chars_file = directory / TOKENIZER_FILE, directory / CHARS_FILE
        for path in (file, chars_file):
            if not path.is_file():
                raise FileNotFoundError(f"{directory}: no {path.name}; a word tokenizer needs {TOKENIZER_FILE} and "
                                        f"{CHARS_FILE}")
        try:
            data = json.loads(chars_file.read_text(encoding="utf-8"))
            chars, width, scheme = data["chars"], data["max_characters"], data.get("scheme", "learned")
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"{chars_file}: not a character vocabulary (chars, max_characters): {err}") from None
        if not isinstance(chars, list) or not all(isinstance(c, str) and len(c) == 1 for c in chars):
            raise ValueError(f"{chars_file}: chars must be a list of single characters")
        if scheme not in ("learned", BYTES_SCHEME):
            raise ValueError(f"{chars_file}: scheme must be 'learned' or {BYTES_SCHEME!r}, got {scheme!r}")
        return cls(load_backend(file), chars, width, read_configs(directory), source=str(file),
                   byte_chars=scheme == BYTES_SCHEME)

    @classmethod
    def from_bilm(cls, directory: str | os.PathLike, words: str = "whitespace") -> "WordTokenizer":
        """The tokenizer of a released ELMo in bilm-tf's layout: UTF-8 byte characters (see the module docstring),
        max_characters from options.json's char_cnn.max_characters_per_token, the words of vocab.txt if present,
        text split into words on whitespace as bilm-tf and AllenNLP read it (`words="bert"`: BERT's split)."""
        directory = Path(directory)
        options = directory / BILM_OPTIONS
        try:
            width = json.loads(options.read_text(encoding="utf-8"))["char_cnn"]["max_characters_per_token"]
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{options}: no char_cnn.max_characters_per_token ({err!r})") from None
        vocab = read_bilm_vocab(directory / BILM_VOCAB)
        return cls(word_backend(vocab, words), [], width, config=word_config(), source=str(options), byte_chars=True)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 30000, min_frequency: int = 1, *,
              max_characters: int = DEFAULT_MAX_CHARACTERS, char_min_frequency: int = 1,
              max_chars: int = 256, show_progress: bool = True) -> "WordTokenizer":
        """Count the words of `texts` (read once, lazily) and keep the `vocab_size` - 4 most frequent seen at least
        `min_frequency` times; the characters are those of the text seen at least `char_min_frequency` times, the
        `max_chars` most frequent."""
        if vocab_size < len(SPECIAL_TOKENS) + 1:
            raise ValueError(f"vocab_size {vocab_size} is too small: the special tokens take {len(SPECIAL_TOKENS)}")
        counts: Counter = Counter()

        def counted(stream: Iterable[str]) -> Iterator[str]:
            for text in stream:
                if isinstance(text, str):
                    counts.update(text)
                yield text

        engine = word_backend({t: i for i, t in enumerate(SPECIAL_TOKENS)})
        trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                            special_tokens=list(SPECIAL_TOKENS), show_progress=show_progress)
        train_engine(engine, trainer, counted(texts))
        vocab = engine.get_vocab(with_added_tokens=True)
        chars = [c for c, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
                 if n >= char_min_frequency and not c.isspace()][:max_chars]
        return cls(word_backend(vocab), chars, max_characters, config=word_config(), source="trained vocabulary")

    def save(self, directory: str | os.PathLike) -> None:
        """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json and word_chars.json."""
        super().save(directory)
        data = {"chars": self.chars, "max_characters": self.max_characters}
        if self.byte_chars:
            data["scheme"] = BYTES_SCHEME
        atomic_write(Path(directory) / CHARS_FILE, json.dumps(data, ensure_ascii=False) + "\n")

    def vocab_hash(self) -> str:
        import hashlib

        digest = hashlib.sha256(super().vocab_hash().encode())
        digest.update(json.dumps([self.chars, self.max_characters] + ([BYTES_SCHEME] if self.byte_chars else []),
                                 ensure_ascii=False).encode("utf-8"))
        return digest.hexdigest()

    # ---- characters ------------------------------------------------------------------------------------------
    def word_chars(self, word: str) -> list[int]:
        """One word as max_characters character ids (see the module docstring); counts into char_stats."""
        W = self.max_characters
        if word == self.pad_token:
            return [PAD_CHAR] * W
        if self.byte_chars:
            return self._byte_chars(word)
        if word in (self.cls_token, self.sep_token):
            return [BOW, BOS_CHAR if word == self.cls_token else EOS_CHAR, EOW] + [PAD_CHAR] * (W - 3)
        if len(word) > W - 2:
            self.char_stats["truncated_words"] += 1
            word = word[:W - 2]
        ids = []
        for c in word:
            i = self.char_to_id.get(c)
            if i is None:
                self.char_stats["unknown_chars"] += 1
                i = UNK_CHAR
            ids.append(i)
        return [BOW, *ids, EOW] + [PAD_CHAR] * (W - 2 - len(ids))

    def _byte_chars(self, word: str) -> list[int]:
        """bilm-tf's spelling of one word (bytes + 1, its marks; see the module docstring)."""
        W = self.max_characters
        if word in (self.cls_token, self.sep_token):
            inner = [BILM_BOS if word == self.cls_token else BILM_EOS]
        else:
            data = word.encode("utf-8", "ignore")
            if len(data) > W - 2:
                self.char_stats["truncated_words"] += 1
                data = data[:W - 2]
            inner = [b + 1 for b in data]
        return [BILM_BOW, *inner, BILM_EOW] + [BILM_PAD] * (W - 2 - len(inner))

    def char_ids(self, words: Sequence[str]) -> np.ndarray:
        """(N, max_characters) int64 character ids of N words."""
        out = np.zeros((len(words), self.max_characters), dtype=np.int64)
        for i, word in enumerate(words):
            out[i] = self.word_chars(word)
        return out

    def char_table(self) -> np.ndarray:
        """(vocab_size, max_characters): every vocabulary word's character ids (what a word id of the shards reads
        as; `<unk>` is spelled as itself)."""
        return self.char_ids([self._id_to_token[i] for i in range(self.vocab_size)])

    def char_ids_of(self, ids: np.ndarray) -> np.ndarray:
        """(..., max_characters) character ids of an array of word ids (open-vocabulary ids included)."""
        ids = np.asarray(ids)
        flat = ids.reshape(-1)
        table = self.__dict__.get("_table")
        if table is None:
            counted = Counter(self.char_stats)
            table = self._table = self.char_table()
            self.char_stats = counted  # the vocabulary's own spellings are not the input's: not counted
        out = np.zeros((len(flat), self.max_characters), dtype=np.int64)
        known = flat < len(table)
        out[known] = table[flat[known]]
        for k in np.flatnonzero(~known):
            out[k] = self.word_chars(self.id_to_token(int(flat[k])))
        return out.reshape(*ids.shape, self.max_characters)

    # ---- open vocabulary -------------------------------------------------------------------------------------
    def id_to_token(self, index: int) -> str:
        index = int(index)
        if index >= self.vocab_size and index - self.vocab_size < len(self._extra_words):
            return self._extra_words[index - self.vocab_size]
        return self._id_to_token[index]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.id_to_token(i) for i in ids]

    def _open_id(self, word: str) -> int:
        index = self._extra.get(word)
        if index is None:
            index = self._extra[word] = self.vocab_size + len(self._extra_words)
            self._extra_words.append(word)
        return index

    def _opened(self, ids: list[int], tokens: list[str], spans: list[str | None]) -> tuple[list[int], list[str]]:
        """ids and tokens with every unknown word (the text `spans[i]` read as `<unk>`) given its own id."""
        if not self.open_vocabulary:
            return ids, tokens
        ids, tokens = list(ids), list(tokens)
        for i, span in enumerate(spans):
            if ids[i] == self.unk_id and span is not None and span != self.unk_token:
                ids[i], tokens[i] = self._open_id(span), span
        return ids, tokens

    def _opened_pieces(self, encodings: list, spans: list[list[str | None]]) -> list:
        """The engine's encodings as Pieces with their unknown words opened (`_opened`; spans: each one's texts)."""
        return [Pieces(*self._opened(e.ids, e.tokens, s), [tuple(o) for o in e.offsets], list(e.word_ids))
                for e, s in zip(encodings, spans)]

    def encode_raw(self, texts: Sequence[str]):
        encodings = super().encode_raw(texts)
        if not self.open_vocabulary:
            return encodings
        return self._opened_pieces(encodings, [[text[a:b] for a, b in e.offsets] for text, e in zip(texts, encodings)])

    def encode_words(self, words: Sequence[Sequence[str]]):
        encodings = super().encode_words(words)
        if not self.open_vocabulary:
            return encodings
        return self._opened_pieces(encodings, [[item[w][a:b] if w is not None else None
                                                for w, (a, b) in zip(e.word_ids, e.offsets)]
                                               for item, e in zip(words, encodings)])

    def _encode_many(self, texts: list[str], pairs: list[str] | None, max_length: int | None,
                     truncation: bool) -> list[Encoding]:
        out = super()._encode_many(texts, pairs, max_length, truncation)
        if self.open_vocabulary:
            for i, enc in enumerate(out):
                sources = (texts[i], None if pairs is None else pairs[i])
                spans = [None if s is None else sources[s][a:b] for s, (a, b) in zip(enc.sequence_ids, enc.offsets)]
                enc.input_ids, enc.tokens = self._opened(enc.input_ids, enc.tokens, spans)
        return out

    def __repr__(self) -> str:
        chars = f"'{BYTES_SCHEME}'" if self.byte_chars else len(self.chars)
        return f"WordTokenizer(vocab_size={self.vocab_size}, chars={chars}, max_characters={self.max_characters})"


def apply_words(tokenizer, words: str | None):
    """`tokenizer` splitting its text into words the `words` way ("whitespace" or "bert"; None: as it is), for
    ELMo's word tokenizer; ValueError naming --words for any other kind of tokenizer. Returns the tokenizer."""
    if words is None:
        return tokenizer
    if getattr(tokenizer, "kind", None) != "word":
        raise ValueError(f"--words is ELMo's (how a word tokenizer splits text into words); this model's tokenizer "
                         f"is {getattr(tokenizer, 'kind', type(tokenizer).__name__)}")
    return tokenizer.split_words(words)


def _pre_tokenizer(words: str):
    return pre_tokenizers.WhitespaceSplit() if words == "whitespace" else pre_tokenizers.BertPreTokenizer()


def word_backend(vocab: dict[str, int], words: str = "bert") -> Tokenizer:
    """The tokenizer.json pipeline around a word vocabulary: BERT's whitespace-and-punctuation split (case kept; or
    with `words="whitespace"` a split on whitespace only), WordLevel with `<unk>`, framing `<s> A </s>` /
    `<s> A </s> B </s>`, the specials matched whole in text."""
    engine = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    engine.pre_tokenizer = _pre_tokenizer(words)
    engine.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    if "<s>" in vocab and "</s>" in vocab:
        engine.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> $B </s>",
            special_tokens=[("<s>", vocab["<s>"]), ("</s>", vocab["</s>"])])
    return engine


def word_config() -> dict:
    """tokenizer_config.json of a word tokenizer: the file runs as it stands (PreTrainedTokenizerFast)."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
            "cls_token": "<s>", "sep_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
            "model_max_length": 1000000}
