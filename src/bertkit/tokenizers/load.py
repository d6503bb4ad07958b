"""`load_tokenizer(path)`: the tokenizer that a model or tokenizer directory (or a vocabulary file) holds.

    vocab.txt                   -> WordPieceTokenizer (BERT's; a bare vocab.txt: Google's tokenization.py rules and
                                   the casing its vocabulary shows; a directory: the rules and casing its files give)
    vocab.json + merges.txt     -> ByteLevelBPETokenizer (RoBERTa's)
    only a tokenizer.json       -> UnigramTokenizer for a Unigram model (T5's scheme), JsonTokenizer for any other
                                   (WordPiece, BPE, ... as transformers runs that file)
    options.json + weights.hdf5 -> WordTokenizer on UTF-8 bytes (a released ELMo in bilm-tf's layout; its vocab.txt
                                   is bilm-tf's word list, not a WordPiece vocabulary)

A directory with the files of the first two kinds is settled by its tokenizer_config.json's `tokenizer_class`;
a tokenizer.json beside vocab.txt or vocab.json + merges.txt is the copy those kinds save for transformers, so
they win. `kind=` insists on a kind (`"json"` reads any tokenizer.json as the file says, even beside vocab.txt).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from bertkit.tokenizers.bpe import ByteLevelBPETokenizer
from bertkit.tokenizers.tokenizer_json import TOKENIZER_FILE, JsonTokenizer, model_type
from bertkit.tokenizers.unigram import UnigramTokenizer
from bertkit.tokenizers.word import CHARS_FILE, WordTokenizer, is_bilm_directory
from bertkit.tokenizers.wordpiece import WordPieceTokenizer

TOKENIZER_KINDS = ("wordpiece", "bpe", "unigram", "json", "word")
# Every file a tokenizer directory may hold, all kinds together (what `save` writes, and the special_tokens_map.json
# of a directory transformers saved): what a model re-saved without its tokenizer keeps (bertkit.checkpoint) and
# what `prepare` clears before it writes another kind (bertkit.data.manifest).
TOKENIZER_FILES = ("vocab.txt", "vocab.json", "merges.txt", "tokenizer_config.json", "tokenizer.json",
                   "special_tokens_map.json", "word_chars.json")
CLASSES = {"wordpiece": WordPieceTokenizer, "bpe": ByteLevelBPETokenizer, "unigram": UnigramTokenizer,
           "json": JsonTokenizer, "word": WordTokenizer}
# tokenizer_config.json classes that settle which kind a directory holding both kinds of files is.
_CONFIG_CLASSES = {"BertTokenizer": "wordpiece", "BertTokenizerFast": "wordpiece",
                   "RobertaTokenizer": "bpe", "RobertaTokenizerFast": "bpe"}
_NEEDED = {"wordpiece": ["vocab.txt"], "bpe": ["vocab.json", "merges.txt"], "unigram": [TOKENIZER_FILE],
           "json": [TOKENIZER_FILE], "word": [TOKENIZER_FILE, CHARS_FILE]}


def _json_kind(file: Path) -> str:
    """"unigram" or "json" for a tokenizer.json; ValueError when the file is not one."""
    found = model_type(file)
    if found is None:
        raise ValueError(f"{file}: not a tokenizer.json (no \"model\" object)")
    if found == "WordLevel" and (file.parent / CHARS_FILE).is_file():  # ELMo's words + characters
        return "word"
    return "unigram" if found == "Unigram" else "json"


def detect_tokenizer_kind(path: str | os.PathLike) -> str:
    """The kind of tokenizer ("wordpiece", "bpe", "unigram" or "json") that the files at `path` hold.

    path: a directory holding `vocab.txt` (WordPiece), `vocab.json` + `merges.txt` (byte-level BPE) or only a
    `tokenizer.json` (Unigram, or any other model: "json"), or one of those files itself (a `.json` file is a
    tokenizer.json when it has a "model", else a BPE vocabulary with `merges.txt` beside it). A directory with both
    WordPiece and BPE files is settled by the `tokenizer_class` of its `tokenizer_config.json`. FileNotFoundError
    when there is nothing to load, ValueError when the files are incomplete (`vocab.json` without `merges.txt`) or
    ambiguous.
    """
    path = Path(path)
    if path.is_file():
        if path.suffix != ".json":
            return "wordpiece"
        return "bpe" if model_type(path) is None else _json_kind(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such tokenizer directory or vocabulary file")
    if is_bilm_directory(path):  # before vocab.txt: bilm-tf's word list has that name too
        return "word"
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
    if (path / TOKENIZER_FILE).is_file():
        return _json_kind(path / TOKENIZER_FILE)
    raise FileNotFoundError(f"{path}: no tokenizer files: expected vocab.txt (WordPiece), vocab.json + merges.txt "
                            f"(byte-level BPE) or tokenizer.json (Unigram or any transformers tokenizer)")


def load_tokenizer(path: str | os.PathLike, kind: str | None = None, *, compat: str | None = None,
                   lowercase: bool | None = None, force_casing: bool = False):
    """The tokenizer a directory or vocabulary file holds, as a `bertkit.tokenizers.base.PieceTokenizer`.

    kind: None detects it from the files (`detect_tokenizer_kind`); one of TOKENIZER_KINDS insists on that kind
    and raises ValueError naming the files found when they are another kind's.
    compat, lowercase, force_casing: WordPiece only (`WordPieceTokenizer.from_pretrained`): the rule set
    ("google" | "transformers") and casing instead of those the files give; a casing that contradicts the
    vocabulary is refused unless force_casing. ValueError when given for another kind, whose files decide.
    """

    if kind is not None and kind not in TOKENIZER_KINDS:
        raise ValueError(f"unknown tokenizer kind {kind!r}; choose one of {', '.join(TOKENIZER_KINDS)}")
    path = Path(path)
    if kind is None:
        kind = detect_tokenizer_kind(path)
    elif not path.exists():
        raise FileNotFoundError(f"{path}: no such tokenizer directory or vocabulary file")
    elif path.is_dir() and not (kind == "word" and is_bilm_directory(path)):
        needed = _NEEDED[kind]
        missing = [name for name in needed if not (path / name).is_file()]
        if missing:
            present = [n for n in ("vocab.txt", "vocab.json", "merges.txt") if (path / n).is_file()]
            what = (" (a WordPiece vocabulary)" if "vocab.txt" in present else
                    " (a byte-level BPE tokenizer)" if len(present) == 2 else "")
            found = f"it has {', '.join(present)}{what}" if present else ""
            if (path / TOKENIZER_FILE).is_file():
                found += f" and {TOKENIZER_FILE}" if found else f"it has only {TOKENIZER_FILE}"
            raise ValueError(f"{path}: a {kind} tokenizer needs {' + '.join(needed)}, but "
                             f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing; "
                             f"{found or 'it has no tokenizer files'}")
    else:
        is_tokenizer_json = path.suffix == ".json" and model_type(path) is not None
        expected = {"wordpiece": "vocab.txt", "bpe": "vocab.json + merges.txt"}.get(kind, TOKENIZER_FILE)
        if ((kind in ("unigram", "json")) != is_tokenizer_json or (kind == "wordpiece" and path.suffix == ".json")
                or (kind == "bpe" and path.suffix != ".json")):
            raise ValueError(f"{path}: a {kind} tokenizer is not read from this file ({expected} expected)")
    if kind == "wordpiece":
        return WordPieceTokenizer.from_pretrained(path, compat=compat, lowercase=lowercase, force_casing=force_casing)
    if compat is not None or lowercase is not None:
        raise ValueError(f"{path}: holds a {kind} tokenizer, whose files decide its rules and casing; compat and "
                         f"lowercase apply to a WordPiece vocabulary")
    if kind == "bpe":
        if path.is_file():
            return ByteLevelBPETokenizer.from_files(path, path.parent / "merges.txt")
        return ByteLevelBPETokenizer.from_pretrained(path)
    return CLASSES[kind].from_pretrained(path)
