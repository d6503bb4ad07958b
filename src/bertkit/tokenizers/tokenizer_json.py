"""Any transformers `tokenizer.json` (WordPiece, BPE or Unigram model), read as the file itself says.

The `tokenizers` engine runs the file's whole pipeline: normalizer, pre-tokenizer, model, and the file's own
post-processor for the framing (`[CLS] A [SEP]`, `<s> A </s></s> B </s>`, `A </s> B </s>`, ...), with the engine's
longest-first truncation; that is what transformers' fast tokenizers do with the same file, so ids, token types,
offsets and word ids are transformers' own. What the file does not say (which added token is the padding, the
mask, the separator) comes from `tokenizer_config.json` / `special_tokens_map.json` beside it, or else from the
usual names among the file's added tokens:

    cls: cls_token, bos_token, [CLS], <s>       sep: sep_token, eos_token, [SEP], </s>
    pad: pad_token, [PAD], <pad>                mask: mask_token, [MASK], <mask>
    unk: unk_token, the model's unknown token, [UNK], <unk>

A role with none of these is None (a T5 vocabulary has no cls and no mask). `JsonTokenizer` implements the whole
interface of `bertkit.tokenizers.base`; `UnigramTokenizer` (`unigram.py`) is this class plus training.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from bertkit.io import atomic_write, read_json, read_json_object
from bertkit.tokenizers.base import Encoding, Frame, PieceTokenizer, word_lists

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_MAP_FILE = "special_tokens_map.json"

# role -> (config keys in order of precedence, usual token names among the added tokens)
ROLES = {
    "cls": (("cls_token", "bos_token"), ("[CLS]", "<s>")),
    "sep": (("sep_token", "eos_token"), ("[SEP]", "</s>")),
    "pad": (("pad_token",), ("[PAD]", "<pad>")),
    "mask": (("mask_token",), ("[MASK]", "<mask>")),
    "unk": (("unk_token",), ("[UNK]", "<unk>")),
}
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
LIST_KEYS = ("additional_special_tokens", "extra_special_tokens")


def _content(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken dict with "content"."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def read_configs(directory: Path) -> dict[str, Any]:
    """tokenizer_config.json with special_tokens_map.json's entries under it (the config wins), or {}."""
    config: dict[str, Any] = {}
    for name in (SPECIAL_MAP_FILE, CONFIG_FILE):
        path = directory / name
        if path.is_file():
            config.update(read_json_object(path))
    return config


def _components(node: Any, list_key: str) -> list[dict]:
    """The parts of a normalizer / pre-tokenizer (a Sequence flattened), as JSON dicts."""
    if not isinstance(node, dict):
        return []
    if node.get("type") == "Sequence":
        return [part for child in node.get(list_key, []) for part in _components(child, list_key)]
    return [node]


class JsonTokenizer(PieceTokenizer):
    """A tokenizer read from a transformers `tokenizer.json`, framed by the file's own post-processor.

    Build one with `from_pretrained(dir)` (a directory holding tokenizer.json, or the file itself) or from a
    `tokenizers.Tokenizer` and a config dict; `save(dir)` writes tokenizer.json and the config back.
    """

    kind = "json"  # as `load_tokenizer` and shard manifests name it

    def __init__(self, backend: Tokenizer, config: dict[str, Any] | None = None, source: str = TOKENIZER_FILE):
        # The engine encodes whole texts; truncation and padding a file may carry are applied per call instead.
        backend.no_truncation()
        backend.no_padding()
        self.backend = backend
        self.config = dict(config or {})
        self.source = source
        self._vocab = backend.get_vocab(with_added_tokens=True)
        self._id_to_token = {i: t for t, i in self._vocab.items()}
        if not self._vocab:
            raise ValueError(f"{source}: the vocabulary is empty")
        self._model = json.loads(backend.to_str()).get("model") or {}  # its unknown token, its type
        added = backend.get_added_tokens_decoder()  # {id: AddedToken}
        added_names = {token.content: i for i, token in added.items()}
        for role, (keys, names) in ROLES.items():
            token = self._resolve(keys, names, added_names, role)
            setattr(self, f"{role}_token", token)
            setattr(self, f"{role}_id", None if token is None else self._vocab[token])
        listed = [_content(v) for key in LIST_KEYS for v in _as_list(self.config.get(key))]
        self._frames = {False: self._probe_frame(False), True: self._probe_frame(True)}
        frame_ids = {i for frame in self._frames.values() for part in (frame.prefix, frame.middle, frame.suffix)
                     for i, _ in part}
        self.special_ids = frozenset(
            {i for i, token in added.items() if token.special}
            | {getattr(self, f"{role}_id") for role in ROLES if getattr(self, f"{role}_id") is not None}
            | {self._vocab[t] for t in listed if t in self._vocab} | frame_ids)
        pair = self._frames[True]
        self.pair_separators, self.pair_type_id = len(pair.middle), pair.type_b
        self._truncating: Tokenizer | None = None  # a copy of the engine that truncates, made on first use
        self._lock = threading.Lock()

    def _resolve(self, keys, names, added_names: dict[str, int], role: str) -> str | None:
        for key in keys:
            token = _content(self.config.get(key))
            if token is not None and token in self._vocab:
                return token
        if role == "unk":
            # The model's own unknown token: WordPiece and BPE name it, Unigram gives its id.
            if isinstance(self._model.get("unk_token"), str) and self._model["unk_token"] in self._vocab:
                return self._model["unk_token"]
            if isinstance(self._model.get("unk_id"), int) and self._model["unk_id"] in self._id_to_token:
                return self._id_to_token[self._model["unk_id"]]
        for name in names:
            if name in added_names:
                return name
        return None

    def _probe_frame(self, pair: bool) -> Frame:
        """Where the file's post-processor puts its special tokens: found by framing one-piece probe texts."""
        probe = self._probe_text()
        out = self.backend.encode(probe, probe if pair else None, add_special_tokens=True)
        if not probe:  # nothing encodes to a piece: every special token of the frame goes in front
            return Frame(tuple(zip(out.ids, out.type_ids)), (), ())
        parts: list[list[tuple[int, int]]] = [[], [], []]
        types = [0, 0]
        state = 0  # 0 before A, 1 after A, 2 after B
        for seq, index, type_id in zip(out.sequence_ids, out.ids, out.type_ids):
            if seq is None:
                parts[state].append((index, type_id))
            else:
                state = 1 + seq
                types[seq] = type_id
        if not pair:
            return Frame(tuple(parts[0]), (), tuple(parts[1]), types[0], types[0])
        return Frame(tuple(parts[0]), tuple(parts[1]), tuple(parts[2]), types[0], types[1])

    def _probe_text(self) -> str:
        """A text of ordinary pieces (no added token): "a", or else the first vocabulary entry that encodes."""
        added = {t.content for t in self.backend.get_added_tokens_decoder().values()}
        ordinary = [t for _, t in sorted(self._id_to_token.items()) if t not in added][:100]
        for text in ("a", "the", "0", "x", *ordinary):
            if self.backend.encode(text, add_special_tokens=False).ids:
                return text
        return ""

    # ---- construction ----------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> "JsonTokenizer":
        """Read `tokenizer.json` (a directory holding it, or the file), with the configs beside it."""
        path = Path(directory)
        file = path if path.is_file() else path / TOKENIZER_FILE
        if not file.is_file():
            raise FileNotFoundError(f"{path}: no {TOKENIZER_FILE}")
        backend = load_backend(file)
        config = read_configs(file.parent) if file.name == TOKENIZER_FILE else {}
        return cls(backend, config, source=str(file))

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, **options) -> "JsonTokenizer":
        """A tokenizer.json of any kind has no training recipe of its own; train a kind that has one."""
        raise TypeError("a generic tokenizer.json cannot be trained; train a wordpiece, bpe or unigram tokenizer")

    def _config_to_save(self) -> dict[str, Any]:
        config = dict(self.config)
        config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
        for role, key in (("cls", "cls_token"), ("sep", "sep_token"), ("pad", "pad_token"), ("mask", "mask_token"),
                          ("unk", "unk_token")):
            token = getattr(self, f"{role}_token")
            if token is not None and not any(_content(config.get(k)) == token for k in ROLES[role][0]):
                config[key] = token
        return config

    def save(self, directory: str | os.PathLike) -> None:
        """Write `tokenizer.json`, `tokenizer_config.json` and `special_tokens_map.json` into `directory`.

        The config read with the file is written back (its `tokenizer_class` included), with the special tokens
        this tokenizer resolved; a tokenizer without a config gets `PreTrainedTokenizerFast`, the class that reads
        tokenizer.json as it stands.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = self._config_to_save()
        atomic_write(directory / TOKENIZER_FILE, self.backend.to_str(pretty=True))
        atomic_write(directory / CONFIG_FILE, json.dumps(config, indent=2, ensure_ascii=False) + "\n")
        specials = {k: config[k] for k in (*SPECIAL_KEYS, "additional_special_tokens") if k in config}
        atomic_write(directory / SPECIAL_MAP_FILE, json.dumps(specials, indent=2, ensure_ascii=False) + "\n")

    # ---- vocabulary ------------------------------------------------------------------------------------------
    def vocab_hash(self) -> str:
        """SHA-256 of the whole pipeline (the file, canonically written) and the special tokens resolved."""
        digest = hashlib.sha256()
        digest.update(f"{self.kind}\n".encode())
        digest.update(json.dumps(json.loads(self.backend.to_str()), sort_keys=True).encode("utf-8"))
        roles = {role: getattr(self, f"{role}_token") for role in ROLES}
        digest.update(json.dumps(roles, sort_keys=True).encode("utf-8"))
        return digest.hexdigest()

    def word_start_flags(self) -> np.ndarray:
        """(V,) bool: True for the pieces that begin a word wherever they stand, by the file's scheme.

        WordPiece: all but continuations ("##"); a Metaspace pre-tokenizer (SentencePiece style) or a normalizer
        writing "▁" for spaces: pieces starting with that mark; byte-level: pieces starting with "Ġ"; BPE with a
        continuation prefix: all but continuations. Special tokens count as word starts. A scheme that marks
        neither (e.g. end-of-word suffixes) gives True everywhere: every piece its own word.
        """
        start = self._word_start_rule()
        flags = np.ones(self.vocab_size, dtype=bool)
        if start is not None:
            for token, index in self._vocab.items():
                flags[index] = start(token)
        flags[sorted(self.special_ids)] = True
        return flags

    def _word_start_rule(self):
        data = json.loads(self.backend.to_str())
        model = data.get("model") or {}
        if model.get("type") == "WordPiece":
            prefix = model.get("continuing_subword_prefix") or "##"
            return lambda token: not token.startswith(prefix)
        pre = _components(data.get("pre_tokenizer"), "pretokenizers")
        norm = _components(data.get("normalizer"), "normalizers")
        for part in pre:
            if part.get("type") == "Metaspace":
                mark = part.get("replacement") or "▁"
                return lambda token: token.startswith(mark)
        if any(part.get("type") == "ByteLevel" for part in pre):
            return lambda token: token.startswith("Ġ")
        for part in norm:  # Llama-style: spaces written as "▁" by the normalizer
            if part.get("type") == "Prepend" and part.get("prepend"):
                mark = part["prepend"]
                return lambda token: token.startswith(mark)
        if model.get("type") == "BPE" and model.get("continuing_subword_prefix"):
            prefix = model["continuing_subword_prefix"]
            return lambda token: not token.startswith(prefix)
        return None

    # ---- encoding --------------------------------------------------------------------------------------------
    def frame(self, pair: bool = False) -> Frame:
        """The special tokens the file's post-processor puts around one text or a pair."""
        return self._frames[bool(pair)]

    def encode_words(self, words: Sequence[Sequence[str]]):
        """Engine encodings (no special tokens) of pre-split words, one list of words per item: what transformers
        gives with `is_split_into_words=True` (each word pre-tokenized on its own; `word_ids` index the words,
        offsets are within each word)."""
        return self.backend.encode_batch(word_lists(words), is_pretokenized=True, add_special_tokens=False)

    def _encode_many(self, texts: list[str], pairs: list[str] | None, max_length: int | None,
                     truncation: bool) -> list[Encoding]:
        """The engine frames (the file's post-processor) and truncates (longest first), as transformers does."""
        inputs = texts if pairs is None else list(zip(texts, pairs))
        if max_length is None or not truncation:
            encodings = self.backend.encode_batch(inputs, add_special_tokens=True)
        else:
            with self._lock:
                if self._truncating is None:
                    self._truncating = Tokenizer.from_str(self.backend.to_str())
                self._truncating.enable_truncation(max_length, stride=0, strategy="longest_first",
                                                   direction="right")
                try:
                    encodings = self._truncating.encode_batch(inputs, add_special_tokens=True)
                except Exception as err:  # the engine reports a budget it cannot meet as a bare Exception
                    raise ValueError(f"cannot truncate to max_length {max_length}: {err}") from None
        out = [Encoding(list(e.ids), list(e.type_ids), list(e.attention_mask), list(e.tokens),
                        [tuple(o) for o in e.offsets], list(e.word_ids), list(e.sequence_ids),
                        list(e.special_tokens_mask)) for e in encodings]
        if max_length is not None and not truncation:
            for enc in out:
                if len(enc) > max_length:
                    raise ValueError(f"input of {len(enc)} tokens is longer than max_length {max_length} and "
                                     f"truncation is off")
        return out

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_lock"] = None  # locks do not pickle (data loader workers get copies)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, model={self._model.get('type')})"


def _as_list(value: Any) -> list:
    if isinstance(value, list):
        return value
    if isinstance(value, dict):  # transformers 5 may write extra special tokens as {name: token}
        return list(value.values())
    return []


def load_backend(file: Path) -> Tokenizer:
    """The `tokenizers.Tokenizer` of a tokenizer.json; ValueError naming the file when the engine refuses it."""
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{file}: not UTF-8 text") from None
    try:
        return Tokenizer.from_str(text)
    except Exception as err:  # the engine raises a bare Exception for any file it cannot read
        reason = re.sub(r"\s+", " ", str(err)).strip()
        raise ValueError(f"{file}: not a tokenizer.json the tokenizers library reads ({reason})") from None


def model_type(file: Path) -> str | None:
    """The "type" of a tokenizer.json's model ("WordPiece", "BPE", "Unigram", ...), None when not a tokenizer.json.

    An older file without the field is recognised by its model's keys.
    """
    data = read_json(file, "tokenizer file")
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        return None
    model = data["model"]
    if isinstance(model.get("type"), str):
        return model["type"]
    if "merges" in model:
        return "BPE"
    if "unk_id" in model:
        return "Unigram"
    if "continuing_subword_prefix" in model or "max_input_chars_per_word" in model:
        return "WordPiece"
    return "WordLevel"
