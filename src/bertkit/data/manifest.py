"""The on-disk format of a prepared corpus: `Manifest`, the format constants, and shard naming and checksums.

Layout of a prepared directory::

    out_dir/
      manifest.json                     written last; what ShardedCorpus reads first
      tokenizer/                        the tokenizer used: vocab.txt (WordPiece) or vocab.json + merges.txt
                                        (byte-level BPE), with tokenizer_config.json and tokenizer.json
      train/shard_00000.tokens.bin      token ids, raw little-endian uint16 (vocab <= 65536) or uint32
      train/shard_00000.sentences.npy   int64 (S + 1,) offsets into tokens: sentence k = tokens[s[k]:s[k+1]]
      train/shard_00000.documents.npy   int64 (D + 1,) offsets into sentences: document j = sentences d[j]..d[j+1]
      train/shard_00000.wordstarts.bin  np.packbits (big bit order) of one bool per token: True when the piece
                                        starts a word: the sentence's first piece, then for WordPiece every piece
                                        but "##" continuations, for BPE every piece carrying the "Ġ" space
      train/shard_00000.json            resume record of the finished shard (counts, checksums, where it ended)
      eval/...                          the held-out split, same layout

Tokens are the vocabulary's ids without special tokens: WordPiece (BERT) or byte-level BPE (RoBERTa), recorded in
the manifest with the vocabulary hash and the special-token ids instances are built with.

`bertkit.data.prepare` writes this layout; `bertkit.data.shards.ShardedCorpus` reads it. Both share what is here.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bertkit.errors import DataError
from bertkit.tokenizers import load_tokenizer

FORMAT_NAME = "bertkit-shards"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TOKENIZER_SUBDIR = "tokenizer"
# The four data files of a shard, by suffix; each is listed with its SHA-256 in the manifest.
SHARD_FILES = ("tokens.bin", "sentences.npy", "documents.npy", "wordstarts.bin")
# The vocabulary file each tokenizer kind cannot do without.
TOKENIZER_KIND_FILE = {"wordpiece": "vocab.txt", "bpe": "vocab.json", "unigram": "tokenizer.json",
                       "json": "tokenizer.json", "word": "word_chars.json"}

PathLike = str | os.PathLike
Paths = PathLike | Iterable[PathLike]


# ---- manifest ------------------------------------------------------------------------------------------------
@dataclass
class Manifest:
    """A prepared directory's `manifest.json` (`data`), plus what the `prepare` call that returned it did.

    reused / written: shard names per split that this run kept as they were / (re)wrote; empty when loaded.
    """

    data_dir: Path
    data: dict
    reused: dict[str, list[str]] = field(default_factory=dict)
    written: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def load(cls, data_dir: PathLike) -> "Manifest":
        """Read `data_dir/manifest.json`; FileNotFoundError / DataError naming the file when absent or invalid."""
        data_dir = Path(data_dir)
        path = data_dir / MANIFEST
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"{path} not found: {data_dir} is not a prepared corpus (run `bertkit prepare`"
                                    f" first, or it was interrupted before finishing)") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise DataError(f"{path}: not a valid manifest ({err})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
            raise DataError(f"{path}: not a bertkit shard manifest (format {data.get('format')!r})"
                            if isinstance(data, dict) else f"{path}: not a bertkit shard manifest")
        if data.get("format_version") != FORMAT_VERSION:
            raise DataError(f"{path}: shard format version {data.get('format_version')} is not supported (this "
                            f"bertkit reads version {FORMAT_VERSION}); prepare the corpus again")
        return cls(data_dir, data)

    @property
    def vocab_hash(self) -> str:
        return self.data["tokenizer"]["vocab_hash"]

    @property
    def vocab_size(self) -> int:
        return int(self.data["tokenizer"]["vocab_size"])

    @property
    def tokenizer_kind(self) -> str:
        """One of `bertkit.tokenizers.TOKENIZER_KINDS` (manifests written before BPE support are WordPiece)."""
        return self.data["tokenizer"].get("kind", "wordpiece")

    def load_tokenizer(self):
        """The tokenizer stored with the shards (`tokenizer_dir`), of the recorded kind, checked against the hash."""
        tokenizer = load_tokenizer(self.tokenizer_dir, kind=self.tokenizer_kind)
        if tokenizer.vocab_hash() != self.vocab_hash:
            raise ValueError(f"{self.data_dir}: the tokenizer in {self.tokenizer_dir} has vocabulary "
                             f"{tokenizer.vocab_hash()}, not the shards' {self.vocab_hash}; prepare the corpus again")
        return tokenizer

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.data["dtype"]).newbyteorder("<")

    @property
    def tokenizer_dir(self) -> Path:
        return self.data_dir / self.data["tokenizer"]["dir"]

    @property
    def splits(self) -> list[str]:
        return list(self.data["splits"])

    def summary(self) -> dict:
        """A short JSON-able account: directory, counts per split, shards this run reused / wrote, skipped lines."""
        splits = {name: {"documents": e["documents"], "sentences": e["sentences"], "tokens": e["tokens"],
                         "shards": len(e["shards"]), "reused": len(self.reused.get(name, [])),
                         "written": len(self.written.get(name, []))}
                  for name, e in self.data["splits"].items()}
        return {"out": str(self.data_dir), "tokenizer_kind": self.tokenizer_kind, "vocab_hash": self.vocab_hash,
                "dtype": self.data["dtype"],
                "splits": splits, "skipped": self.data["skipped"]}

    def split(self, name: str) -> dict:
        """The manifest entry of split `name` (counts and shard list); KeyError listing the splits there are."""
        if name not in self.data["splits"]:
            raise KeyError(f"{self.data_dir}: no split {name!r} (it has {self.splits})")
        return self.data["splits"][name]


# ---- shard names and checksums -------------------------------------------------------------------------------
def shard_name(index: int) -> str:
    """The file stem of shard number `index` in a split folder: "shard_00042"."""
    return f"shard_{index:05d}"


def shard_index(filename: str) -> int:
    """The shard number in a file name such as "shard_00042.json"; -1 when the name is not a shard's."""
    try:
        return int(filename.split(".")[0].split("_")[1])
    except (IndexError, ValueError):
        return -1


def shard_entry(record: dict) -> dict:
    """A shard's manifest entry (name, counts, per-file size and SHA-256), taken from its resume record."""
    keys = ("name", "documents", "sentences", "tokens", "dropped_documents", "dropped_sentences", "files")
    return {k: record[k] for k in keys}


def check_shard_files(directory: Path, name: str, files: dict) -> str | None:
    """None when every file of shard `name` exists with the recorded size and SHA-256, else what is wrong."""
    for suffix in SHARD_FILES:
        path = directory / f"{name}.{suffix}"
        if suffix not in files:
            return f"{path} is not in the record"
        if not path.is_file():
            return f"{path} is missing"
        if path.stat().st_size != files[suffix]["bytes"]:
            return f"{path} has {path.stat().st_size} bytes, expected {files[suffix]['bytes']}"
        if sha256_file(path) != files[suffix]["sha256"]:
            return f"{path} does not match its checksum"
    return None


def sha256_file(path: Path) -> str:
    """The hex SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
