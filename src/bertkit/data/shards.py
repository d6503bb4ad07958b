"""`ShardedCorpus`: memory-mapped, random access by document to the shards `bertkit.data.prepare` wrote.

The layout and its checksums are in `bertkit.data.manifest`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from bertkit.data.manifest import MANIFEST, SHARD_FILES, Manifest, PathLike, check_shard_files, sha256_file
from bertkit.errors import DataError
from bertkit.tokenizers import load_tokenizer


class ShardedCorpus:
    """Memory-mapped, random access to one split of a prepared directory, by document.

    Implements `bertkit.data.instances.DocumentSource`: `len(corpus)` documents, `corpus.document(i)` ->
    (token ids per sentence as int64 arrays, word-start flags per sentence as bool arrays).

    tokenizer: a tokenizer (WordPiece or byte-level BPE, or a directory holding one) that will consume these ids;
        a vocabulary other than the one the shards were made with raises ValueError naming both hashes.
    verify: check the SHA-256 of every file of the split now (`verify()`), instead of each shard's token files
        just before its first use.

    What is checked, so that damaged data fails with one line naming the file (or the shard and the field) and
    never trains silently or ends in an IndexError:
      at open      every file exists with the size the manifest records; the index files (sentences.npy,
                   documents.npy: about a tenth of the bytes) match their SHA-256; the manifest's counts agree
                   with the split's shards and with what the files hold;
      first use    a shard's token files (tokens.bin, wordstarts.bin) match their SHA-256 the first time one of
                   its documents is read (`verify=True` or `verify()` checks them all up front instead).
    Missing files raise FileNotFoundError, the rest DataError. Safe to pickle (worker processes reopen the maps
    and keep what was already verified).
    """

    # Checked at open, always; the token files are checked at first use (see the class docstring).
    INDEX_FILES = ("sentences.npy", "documents.npy")
    TOKEN_FILES = ("tokens.bin", "wordstarts.bin")

    def __init__(self, data_dir: PathLike, split: str = "train", tokenizer=None, verify: bool = False) -> None:
        self.data_dir = Path(data_dir)
        self.split = split
        self.manifest = Manifest.load(self.data_dir)
        entry = self.manifest.split(split)
        if tokenizer is not None:
            if isinstance(tokenizer, (str, os.PathLike)):
                tokenizer = load_tokenizer(tokenizer)
            if tokenizer.vocab_hash() != self.manifest.vocab_hash:
                raise ValueError(f"{self.data_dir}: the shards were made with the {self.manifest.tokenizer_kind} "
                                 f"vocabulary {self.manifest.vocab_hash} but the tokenizer given is "
                                 f"{getattr(tokenizer, 'kind', type(tokenizer).__name__)} with "
                                 f"{tokenizer.vocab_hash()}; prepare the corpus again with this tokenizer, or use "
                                 f"the one in {self.tokenizer_dir}")
        self._shards = _checked_shards(self.data_dir / MANIFEST, split, entry)
        self.dtype = self.manifest.dtype
        self.num_documents = int(entry["documents"])
        self.num_sentences = int(entry["sentences"])
        self.num_tokens = int(entry["tokens"])
        counts = np.array([s["documents"] for s in self._shards], dtype=np.int64)
        self._doc_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._maps: list[tuple] | None = None
        self._verified: set[int] = set()  # shards whose token files matched their checksums
        self._open()
        if verify:
            self.verify()

    def require_documents(self) -> ShardedCorpus:
        """self, or DataError naming the directory and the split when the split holds no document (a stream
        over it could make nothing)."""
        if self.num_documents == 0:
            why = ("prepare held out none; prepare again with a larger --eval-fraction or with --eval-corpus "
                   "files" if self.split == "eval" else "prepare it again from a corpus with text")
            raise DataError(f"{self.data_dir}: the {self.split} split has no documents ({why})")
        return self

    @property
    def vocab_size(self) -> int:
        return self.manifest.vocab_size

    @property
    def tokenizer_dir(self) -> Path:
        return self.manifest.tokenizer_dir

    def __len__(self) -> int:
        return self.num_documents

    def __repr__(self) -> str:
        return (f"ShardedCorpus({str(self.data_dir)!r}, split={self.split!r}: {self.num_documents} documents, "
                f"{self.num_tokens} tokens, {len(self._shards)} shards)")

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_maps"] = None  # memory maps are reopened in the receiving process, not copied
        state["_token_bounds"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._open()

    def _open(self) -> None:
        maps = []
        directory = self.data_dir / self.split
        for shard in self._shards:
            name = shard["name"]
            for suffix in SHARD_FILES:
                path = directory / f"{name}.{suffix}"
                expected = shard["files"][suffix]["bytes"]
                try:
                    size = path.stat().st_size
                except FileNotFoundError:
                    raise FileNotFoundError(f"{path}: shard file missing (the manifest lists it)") from None
                if size != expected:
                    raise DataError(f"{path}: {size} bytes, the manifest says {expected} (truncated or "
                                    f"overwritten; prepare the corpus again)")
            for suffix in self.INDEX_FILES:
                self._check_sum(directory / f"{name}.{suffix}", shard["files"][suffix]["sha256"])
            tokens = np.memmap(directory / f"{name}.tokens.bin", dtype=self.dtype, mode="r")
            sentences = np.load(directory / f"{name}.sentences.npy", mmap_mode="r", allow_pickle=False)
            documents = np.load(directory / f"{name}.documents.npy", mmap_mode="r", allow_pickle=False)
            starts = np.memmap(directory / f"{name}.wordstarts.bin", dtype=np.uint8, mode="r")
            _check_indexes(directory / name, shard, tokens, sentences, documents, starts)
            # Plain ndarray views of the maps: numpy.memmap's slicing (a Python __getitem__ and __array_finalize__
            # per slice) costs more than a small document's read
            maps.append(tuple(x.view(np.ndarray) for x in (tokens, sentences, documents, starts)))
        self._maps = maps

    @staticmethod
    def _check_sum(path: Path, expected: str) -> None:
        if sha256_file(path) != expected:
            raise DataError(f"{path}: the file does not match its SHA-256 in the manifest (altered or damaged "
                            f"after `bertkit prepare` wrote it); prepare the corpus again")

    def _ensure_verified(self, shard: int) -> None:
        """Check shard `shard`'s token files against their checksums, once, before its first document is read."""
        if shard in self._verified:
            return
        entry = self._shards[shard]
        for suffix in self.TOKEN_FILES:
            self._check_sum(self.data_dir / self.split / f"{entry['name']}.{suffix}", entry["files"][suffix]["sha256"])
        self._verified.add(shard)

    def _locate(self, i: int) -> tuple[int, int]:
        """(shard, index within it) of document `i` (negative counts from the end); IndexError out of range."""
        if i < 0:
            i += self.num_documents
        if not 0 <= i < self.num_documents:
            raise IndexError(f"document {i} out of range for {self.num_documents} documents")
        shard = int(np.searchsorted(self._doc_offsets, i, side="right")) - 1
        return shard, i - int(self._doc_offsets[shard])

    def document(self, i: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Document `i` (0 <= i < len; negative counts from the end): (int64 ids, bool word starts) per sentence."""
        return self._document(*self._locate(i))

    def _document(self, shard: int, local: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        self._ensure_verified(shard)
        tokens, sentences, documents, packed = self._maps[shard]
        first, last = int(documents[local]), int(documents[local + 1])
        bounds = np.asarray(sentences[first:last + 1], dtype=np.int64)
        lo, hi = int(bounds[0]), int(bounds[-1])
        ids = np.asarray(tokens[lo:hi], dtype=np.int64)
        # Unpack only the bytes covering [lo, hi), then drop the bits before lo.
        bits = np.unpackbits(np.asarray(packed[lo // 8:(hi + 7) // 8]))[lo % 8:lo % 8 + (hi - lo)].astype(bool)
        # Views by slicing: np.split costs two array calls per piece, most of a document read
        edges = (bounds - lo).tolist()
        return ([ids[a:b] for a, b in zip(edges, edges[1:])], [bits[a:b] for a, b in zip(edges, edges[1:])])

    def flat_document(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Document `i` in one piece: (ids (L,) int64, word starts (L,) bool, sentence offsets (sentences + 1,)
        int64 from 0 to L): `document(i)` concatenated, read as one slice (a whole-corpus chunk reads documents
        whole, and splitting them into sentences costs more than reading them)."""
        shard, local = self._locate(i)
        self._ensure_verified(shard)
        tokens, sentences, documents, packed = self._maps[shard]
        bounds = np.asarray(sentences[int(documents[local]):int(documents[local + 1]) + 1], dtype=np.int64)
        lo, hi = int(bounds[0]), int(bounds[-1])
        ids = np.asarray(tokens[lo:hi], dtype=np.int64)
        bits = np.unpackbits(np.asarray(packed[lo // 8:(hi + 7) // 8]))[lo % 8:lo % 8 + (hi - lo)].astype(bool)
        return ids, bits, bounds - lo

    def document_sizes(self) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, sentences) of every document, two (documents,) int64 arrays, from the index files alone (no
        token is read): what places a document in a stream of documents laid end to end without reading it."""
        tokens, sentences = [], []
        for _, bounds, documents, _ in self._maps:
            first = np.asarray(documents, dtype=np.int64)  # each document's first sentence, and one past the last
            tokens.append(np.diff(np.asarray(bounds, dtype=np.int64)[first]))
            sentences.append(np.diff(first))
        if not tokens:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(tokens), np.concatenate(sentences)

    def token_range(self, i: int, lo: int, hi: int, word_starts: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
        """Tokens lo..hi-1 of document `i` (offsets within it, 0 <= lo <= hi <= its length): (ids int64, word starts
        bool, or None unless `word_starts`), `flat_document(i)`'s first two fields sliced, reading only those
        tokens (a stream that uses a piece of a long document pays for the piece)."""
        shard, local = self._locate(i)
        self._ensure_verified(shard)
        tokens, sentences, documents, packed = self._maps[shard]
        base, end = int(sentences[int(documents[local])]), int(sentences[int(documents[local + 1])])
        if not 0 <= lo <= hi <= end - base:
            raise IndexError(f"tokens {lo}..{hi} out of range for document {i} of {end - base} tokens")
        lo, hi = base + lo, base + hi
        ids = np.asarray(tokens[lo:hi], dtype=np.int64)
        if not word_starts:
            return ids, None
        bits = np.unpackbits(np.asarray(packed[lo // 8:(hi + 7) // 8]))[lo % 8:lo % 8 + (hi - lo)].astype(bool)
        return ids, bits

    def token_view(self, i: int) -> np.ndarray:
        """Document `i`'s token ids as stored (the manifest's dtype, read-only, no copy): a view of the memory map
        that a stream slices again and again (a T5 chunk's sequences) for the price of the slices."""
        shard, local = self._locate(i)
        self._ensure_verified(shard)
        tokens, sentences, documents, _ = self._maps[shard]
        return tokens[int(sentences[int(documents[local])]):int(sentences[int(documents[local + 1])])]

    def token_views(self, docs) -> list[np.ndarray]:
        """`token_view` of each of `docs` (document indices), placed at once from a per-shard table of the documents'
        token offsets (made at the first call): a whole-corpus chunk's documents for the price of the slices."""
        docs = np.asarray(docs, dtype=np.int64)
        if len(docs) and (docs.min() < 0 or docs.max() >= self.num_documents):
            raise IndexError(f"a document out of range for {self.num_documents} documents")
        if getattr(self, "_token_bounds", None) is None:  # per shard: each document's first token, and the end
            self._token_bounds = [np.asarray(sentences, dtype=np.int64)[np.asarray(documents, dtype=np.int64)]
                                  for _, sentences, documents, _ in self._maps]
        shards = np.searchsorted(self._doc_offsets, docs, side="right") - 1
        out: list[np.ndarray] = [None] * len(docs)  # type: ignore[list-item]
        for shard in np.unique(shards).tolist():
            self._ensure_verified(shard)
            at = np.flatnonzero(shards == shard)
            local = docs[at] - self._doc_offsets[shard]
            bounds, tokens = self._token_bounds[shard], self._maps[shard][0]
            for k, lo, hi in zip(at.tolist(), bounds[local].tolist(), bounds[local + 1].tolist()):
                out[k] = tokens[lo:hi]
        return out

    def sentence_offsets(self, i: int) -> np.ndarray:
        """Document `i`'s sentence offsets, (sentences + 1,) int64 from 0 to its length (`flat_document(i)[2]`),
        from the index alone."""
        shard, local = self._locate(i)
        _, sentences, documents, _ = self._maps[shard]
        bounds = np.asarray(sentences[int(documents[local]):int(documents[local + 1]) + 1], dtype=np.int64)
        return bounds - bounds[0]

    def documents_in_order(self, start: int = 0) -> Iterator[tuple[list[np.ndarray], list[np.ndarray]]]:
        """`document(i)` for i = start, start + 1, ... in storage order (shard by shard, sequential reads)."""
        for shard in range(len(self._shards)):
            first, last = int(self._doc_offsets[shard]), int(self._doc_offsets[shard + 1])
            for i in range(max(start, first), last):
                yield self._document(shard, i - first)

    def token_stream(self, start: int = 0) -> Iterator[np.ndarray]:
        """Each document's pieces as one int64 array (sentences concatenated), in order from document `start`.

        For RoBERTa-style packing, which fills rows across sentence boundaries and separates documents itself.
        """
        for shard in range(len(self._shards)):
            tokens, sentences, documents, _ = self._maps[shard]
            first, last = int(self._doc_offsets[shard]), int(self._doc_offsets[shard + 1])
            if max(start, first) < last:
                self._ensure_verified(shard)
            for local in range(max(start, first) - first, last - first):
                lo, hi = int(sentences[documents[local]]), int(sentences[documents[local + 1]])
                yield np.asarray(tokens[lo:hi], dtype=np.int64)

    def verify(self) -> int:
        """Check every file of this split against its SHA-256 in the manifest; DataError naming the first bad one.

        Returns the number of files checked.
        """
        directory = self.data_dir / self.split
        for index, shard in enumerate(self._shards):
            problem = check_shard_files(directory, shard["name"], shard["files"])
            if problem is not None:
                raise DataError(f"{problem} (prepare the corpus again)")
            self._verified.add(index)
        return len(self._shards) * len(SHARD_FILES)


_COUNTS = ("documents", "sentences", "tokens")


def _checked_shards(manifest: Path, split: str, entry: dict) -> list[dict]:
    """The split's shard entries, once the manifest's own numbers agree: every entry has its name, counts and
    files, and the split's totals are the sums of its shards'. DataError naming the manifest, shard and field."""
    shards = entry.get("shards")
    if not isinstance(shards, list):
        raise DataError(f"{manifest}: split {split!r} has no shard list")
    for number, shard in enumerate(shards):
        name = shard.get("name", f"#{number}") if isinstance(shard, dict) else f"#{number}"
        if not isinstance(shard, dict):
            raise DataError(f"{manifest}: split {split!r}, shard {name}: not an object")
        for field in ("name", *_COUNTS, "files"):
            if field not in shard:
                raise DataError(f"{manifest}: split {split!r}, shard {name}: no {field!r}")
        for field in _COUNTS:
            value = shard[field]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise DataError(f"{manifest}: split {split!r}, shard {name}: {field} {value!r} is not a count")
        for suffix in SHARD_FILES:
            record = shard["files"].get(suffix) if isinstance(shard["files"], dict) else None
            if not isinstance(record, dict) or "bytes" not in record or "sha256" not in record:
                raise DataError(f"{manifest}: split {split!r}, shard {name}: no size and SHA-256 for {suffix}")
    for field in _COUNTS:
        total = sum(shard[field] for shard in shards)
        if entry.get(field) != total:
            raise DataError(f"{manifest}: split {split!r}: {field} is {entry.get(field)!r} but its shards hold "
                            f"{total} (the manifest was altered; prepare the corpus again)")
    return shards


def _check_indexes(stem: Path, shard: dict, tokens, sentences, documents, starts) -> None:
    """The shard's files agree with its manifest entry and with each other; DataError naming shard and field."""
    def fail(field: str, detail: str) -> None:
        raise DataError(f"{stem}.*: {field}: {detail} (the manifest or the shard was altered; prepare the corpus "
                        f"again)")

    if len(tokens) != shard["tokens"]:
        fail("tokens", f"the manifest says {shard['tokens']}, {stem.name}.tokens.bin holds {len(tokens)}")
    if sentences.ndim != 1 or len(sentences) != shard["sentences"] + 1:
        fail("sentences", f"the manifest says {shard['sentences']}, {stem.name}.sentences.npy indexes "
                          f"{len(sentences) - 1}")
    if documents.ndim != 1 or len(documents) != shard["documents"] + 1:
        fail("documents", f"the manifest says {shard['documents']}, {stem.name}.documents.npy indexes "
                          f"{len(documents) - 1}")
    if len(starts) != (len(tokens) + 7) // 8:
        fail("wordstarts", f"{len(starts)} bytes for {len(tokens)} tokens")
    # The offsets must start at 0, never decrease and end at the last token / sentence (else documents would
    # read out of range or overlap).
    for field, offsets, end in (("sentences", sentences, len(tokens)), ("documents", documents, shard["sentences"])):
        if offsets[0] != 0 or offsets[-1] != end or (len(offsets) > 1 and np.any(np.diff(offsets) < 0)):
            fail(field, f"{stem.name}.{field}.npy does not run from 0 to {end} in order")
