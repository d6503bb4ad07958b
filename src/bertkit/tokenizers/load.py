"""`load_tokenizer(path)`: the tokenizer that a model or tokenizer directory (or a vocabulary file) holds."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bertkit.tokenizers.bpe import ByteLevelBPETokenizer
from bertkit.tokenizers.wordpiece import WordPieceTokenizer

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
    """A `WordPieceTokenizer` or a `ByteLevelBPETokenizer` from a directory or vocabulary file.

    kind: None detects it from the files (`detect_tokenizer_kind`); "wordpiece" or "bpe" insists on that kind
    and raises ValueError naming the files found when they are the other kind's.
    """

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
