"""`prepare`: tokenise a corpus once into memory-mapped shards (the layout is in `bertkit.data.manifest`).

A BPE corpus is taken as raw text, each sentence encoded on its own without a prefix space (as fairseq prepares
RoBERTa's corpus line by line), and "<mask>" written in the text stays the characters "<", "mask", ">": decoding a
sentence's ids gives the sentence back exactly. Sentences that tokenise to nothing and documents left with no
sentence are dropped and counted. Shards hold whole documents and close at the first document that arrives once
they hold `shard_tokens` tokens, so the boundaries depend only on the inputs, the tokenizer and the options (not on
`batch_size`, timing or core count). That makes an interrupted run resumable: every finished shard leaves a
record saying where in the input it ended and what it was built from; a re-run verifies those checksums, keeps the
leading run of valid shards of each split, seeks to where they end and tokenises only the rest. A changed
tokenizer, option or input file invalidates the shards from the first one that depends on it.

The held-out split is either separate files (`eval_paths`) or a fraction of the documents chosen by a hash of
(seed, file number, document number in that file): deterministic, and decidable one document at a time while
streaming.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

import numpy as np

from bertkit.data.corpus import (COLUMNAR_FORMATS, FORMATS, ON_BAD_LINE, CorpusStats, Document, Position,
                                 detect_format, expand_paths, iter_positioned_documents)
from bertkit.data.manifest import (FORMAT_NAME, FORMAT_VERSION, MANIFEST, TOKENIZER_KIND_FILE,
                                   TOKENIZER_SUBDIR, Manifest, PathLike, Paths, check_shard_files, shard_entry,
                                   shard_index, shard_name)
from bertkit.data.readers import Table
from bertkit.errors import DataError
from bertkit.io import atomic_write, fsync_dir, lock_directory, remove_stale_temporaries
from bertkit.tokenizers import TOKENIZER_FILES, TOKENIZER_KINDS, load_tokenizer

log = logging.getLogger(__name__)


def prepare(corpus_paths: Paths, tokenizer_dir, out_dir: PathLike, *,
            eval_paths: Paths | None = None, eval_fraction: float = 0.0, format: str | None = None,
            on_bad_line: str = "error", split_sentences: bool | None = None, shard_tokens: int = 2 ** 24,
            batch_size: int = 1000, seed: int = 0, progress: bool = True,
            tokenizer_kind: str | None = None, text_column: str = "text",
            document_column: str | None = None) -> Manifest:
    """Tokenise `corpus_paths` into shards under `out_dir` (layout: `bertkit.data.manifest`); return the manifest.

    corpus_paths / eval_paths: files, directories or glob patterns (see `bertkit.data.corpus.expand_paths`).
    tokenizer_dir: a tokenizer of any kind (`bertkit.tokenizers`), or a directory or vocabulary file
        `bertkit.tokenizers.load_tokenizer` reads: vocab.txt (WordPiece), vocab.json + merges.txt (BPE) or a
        tokenizer.json (Unigram, or any other). It is copied to `out_dir/tokenizer/`.
    tokenizer_kind: None detects the kind from the files; one of TOKENIZER_KINDS insists on it (ValueError naming
        the files found when they are another kind's).
    eval_fraction: share of the corpus documents held out into the "eval" split (exclusive with `eval_paths`).
    format, on_bad_line, split_sentences, text_column, document_column: as in
        `bertkit.data.corpus.iter_documents` (Parquet, Arrow and datasets directories are read in record batches).
    shard_tokens: a shard closes at the first document that arrives once it holds this many tokens.
    batch_size: sentences per call to the tokenizer engine (which parallelises over all cores); speed only.
    seed: chooses the `eval_fraction` documents.
    progress: show a tqdm bar over input bytes and print what was reused.

    Documents stream through: memory stays around one shard plus one batch. Re-running with the same inputs,
    tokenizer and options verifies and reuses finished shards and tokenises only what is missing; the
    returned `Manifest.reused` / `.written` say which. Raises DataError (path:line) on bad input under
    on_bad_line="error", FileNotFoundError for missing inputs, ValueError for bad options.
    """
    format = _checked_options(eval_paths, eval_fraction, format, on_bad_line, split_sentences, shard_tokens,
                              batch_size, tokenizer_kind)
    tokenizer = _tokenizer(tokenizer_dir, tokenizer_kind)
    out_dir = Path(out_dir)
    train_files = expand_paths(corpus_paths)
    eval_files = expand_paths(eval_paths) if eval_paths is not None else []
    overlap = {f.resolve() for f in train_files} & {f.resolve() for f in eval_files}
    if overlap:
        raise ValueError(f"files are both corpus and eval input (the eval split would leak): "
                         f"{sorted(map(str, overlap))}")

    dtype = np.dtype("<u2") if tokenizer.vocab_size <= 2 ** 16 else np.dtype("<u4")
    # Everything that changes shard contents; batch_size and progress do not.
    key_options = {"format": format, "on_bad_line": on_bad_line, "split_sentences": split_sentences,
                   "shard_tokens": int(shard_tokens), "eval_fraction": float(eval_fraction),
                   "eval_from": "files" if eval_files else ("fraction" if eval_fraction > 0 else None),
                   "seed": int(seed) if eval_fraction > 0 else None, "dtype": dtype.name}
    if text_column != "text" or document_column is not None:  # recorded only when set: older directories still match
        key_options.update(text_column=text_column, document_column=document_column)
    streams = [_Stream("corpus", train_files, ["train", "eval"] if eval_fraction > 0 else ["train"])]
    if eval_files:
        streams.append(_Stream("eval", eval_files, ["eval"]))
    build = _Build(out_dir, tokenizer, dtype, key_options, streams, format, on_bad_line, split_sentences,
                   shard_tokens, batch_size, seed, eval_fraction, progress)
    # refused before anything in out_dir is touched
    _check_inputs(train_files, eval_files, format, text_column, document_column)
    # One writer per data directory (a second `prepare` on it fails at once, naming the holder's pid).
    with _engine_on_every_core(), lock_directory(out_dir):
        return build.run()


def _checked_options(eval_paths: Paths | None, eval_fraction: float, format: str | None, on_bad_line: str,
                     split_sentences: bool | None, shard_tokens: int, batch_size: int,
                     tokenizer_kind: str | None) -> str | None:
    """`prepare`'s options checked (ValueError or TypeError naming the option); the corpus format to read."""
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), not {eval_fraction}")
    if eval_paths is not None and eval_fraction > 0:
        raise ValueError("give either eval_paths or eval_fraction, not both")
    if shard_tokens < 1 or batch_size < 1:
        raise ValueError(f"shard_tokens ({shard_tokens}) and batch_size ({batch_size}) must be positive")
    format = "arrow" if format == "datasets" else format  # a save_to_disk directory's files are Arrow streams
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown corpus format {format!r}; expected one of {list(FORMATS)}")
    if on_bad_line not in ON_BAD_LINE:
        raise ValueError(f"on_bad_line must be one of {list(ON_BAD_LINE)}, not {on_bad_line!r}")
    if split_sentences is not None and not isinstance(split_sentences, bool):
        raise TypeError("prepare takes split_sentences as None/True/False (a custom splitter cannot be recorded)")
    if tokenizer_kind is not None and tokenizer_kind not in TOKENIZER_KINDS:
        raise ValueError(f"unknown tokenizer kind {tokenizer_kind!r}; choose one of {', '.join(TOKENIZER_KINDS)}")
    return format


def _tokenizer(tokenizer_dir, tokenizer_kind: str | None):
    """The tokenizer `prepare` was given, loaded from its directory or taken as it is, of `tokenizer_kind` if set."""
    if isinstance(tokenizer_dir, (str, os.PathLike)):
        return load_tokenizer(tokenizer_dir, kind=tokenizer_kind)
    tokenizer = tokenizer_dir
    if getattr(tokenizer, "kind", None) not in TOKENIZER_KINDS:
        raise TypeError(f"prepare needs a tokenizer directory or a bertkit tokenizer, not "
                        f"{type(tokenizer).__name__}")
    if tokenizer_kind is not None and tokenizer.kind != tokenizer_kind:
        raise ValueError(f"tokenizer_kind {tokenizer_kind!r} but the tokenizer given is {tokenizer.kind}")
    return tokenizer


def _check_inputs(train_files: list[Path], eval_files: list[Path], format: str | None, text_column: str,
                  document_column: str | None) -> None:
    """DataError for an input of 0 bytes, or a Parquet or Arrow file without the columns read."""
    for files, what in ((train_files, "corpus"), (eval_files, "eval corpus")):
        if files and all(f.stat().st_size == 0 for f in files):
            raise DataError(f"{', '.join(map(str, files))}: the {what} is empty (0 bytes); nothing to prepare")
        for file in files:
            fmt = format or detect_format(file)
            if fmt in COLUMNAR_FORMATS:
                Table(file, fmt).require(text_column, document_column)


@contextlib.contextmanager
def _engine_on_every_core() -> Iterator[None]:
    """TOKENIZERS_PARALLELISM=true while `prepare` runs, unless the user set it: the engine uses every core for
    encode_batch. Unset afterwards, so that a later fork (DataLoader workers) gets the engine's own fork-safety
    behaviour instead of a forced setting."""
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    if previous is None:
        os.environ["TOKENIZERS_PARALLELISM"] = "true"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)

def _fingerprint(path: Path) -> dict:
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


@dataclass
class _Stream:
    """One pass over input files feeding one or more splits (the corpus feeds train, and eval by fraction)."""

    name: str
    files: list[Path]
    splits: list[str]
    inputs: list[dict] = field(default_factory=list)


class _Build:
    """The state of one `prepare` call; `run` does it."""

    def __init__(self, out_dir, tokenizer, dtype, key_options, streams, format, on_bad_line, split_sentences,
                 shard_tokens, batch_size, seed, eval_fraction, progress) -> None:
        self.out_dir, self.tokenizer, self.dtype = out_dir, tokenizer, dtype
        self.key_options, self.streams = key_options, streams
        self.format, self.on_bad_line, self.split_sentences = format, on_bad_line, split_sentences
        self.shard_tokens, self.batch_size, self.seed = shard_tokens, batch_size, seed
        self.eval_fraction, self.progress = eval_fraction, progress
        self.vocab_hash = tokenizer.vocab_hash()
        for stream in streams:
            stream.inputs = [_fingerprint(f) for f in stream.files]
        self.splits = [s for stream in streams for s in stream.splits]
        self.word_starts = tokenizer.word_start_flags()  # (V,) bool: begins a word wherever it stands
        backend = tokenizer.backend
        if tokenizer.kind != "wordpiece":
            # A corpus is raw text: "<s>" or "<mask>" (or T5's "<extra_id_0>") written in it are characters, never
            # special ids (fairseq's GPT-2 encoder does not know them either). A copy of the engine, so the
            # tokenizer itself is unchanged.
            from tokenizers import Tokenizer

            backend = Tokenizer.from_str(backend.to_str())
            backend.encode_special_tokens = True
        # encode_batch_fast (tokenizers >= 0.21) is the same engine call without character offsets, which shards
        # do not store; about a quarter faster.
        self._engine_encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
        # WordPiece sends the few texts its engine's Unicode tables would get wrong through Google's rules in Python
        # (WordPieceTokenizer.encode_plain), so that shards hold the ids `tokenizer.encode` gives.
        self._encode_plain = tokenizer.encode_plain if tokenizer.kind == "wordpiece" else None

    def say(self, message: str) -> None:
        log.info(message)
        if self.progress:
            from tqdm.auto import tqdm

            tqdm.write(message, file=sys.stderr)  # above the progress bar, not through it

    # -- the whole job -----------------------------------------------------------------------------------------
    def run(self) -> Manifest:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        # Temporary files of a killed run (an 8 MB shard on a full disk, say) go first; the caller holds the lock.
        for path in remove_stale_temporaries(self.out_dir, *(self.out_dir / split for split in ("train", "eval")),
                                             self.out_dir / TOKENIZER_SUBDIR):
            self.say(f"removed {path}, left by an interrupted run")
        manifest = self._reuse_whole()
        if manifest is not None:
            return manifest
        # Something must be (re)built: take the old manifest away first so no reader trusts a half-updated dir.
        (self.out_dir / MANIFEST).unlink(missing_ok=True)
        for split in ("train", "eval"):
            if split not in self.splits:  # e.g. an eval split from an earlier run that had one
                for path in (self.out_dir / split).glob("shard_*"):
                    path.unlink()
        from tqdm.auto import tqdm

        total = sum(f["size"] for stream in self.streams for f in stream.inputs)
        bar = tqdm(total=total, unit="B", unit_scale=True, desc="prepare", disable=not self.progress)
        splits: dict[str, dict] = {}
        stream_stats: dict[str, dict] = {}
        reused: dict[str, list[str]] = {}
        written: dict[str, list[str]] = {}
        bar_base = 0
        try:
            for stream in self.streams:
                result = self._run_stream(stream, bar, bar_base)
                bar_base += sum(f["size"] for f in stream.inputs)
                stream_stats[stream.name] = result["stats"]
                for split, writer in result["writers"].items():
                    splits[split] = writer.summary()
                    reused[split] = writer.reused_names
                    written[split] = writer.written_names
        finally:
            bar.close()
        for stream in self.streams:
            # A corpus that yields no document would give a data directory nothing can train on: fail, naming it,
            # and write no manifest.
            for split in stream.splits:
                if splits[split]["documents"] == 0 and (split == "train" or stream.name == "eval"):
                    skipped = CorpusStats(skipped=stream_stats[stream.name]["skipped"])
                    note = f" ({skipped.summary()})" if skipped.skipped_total else ""
                    raise DataError(f"{', '.join(map(str, stream.files))}: no {split} document in the "
                                    f"{'eval corpus' if stream.name == 'eval' else 'corpus'}{note}; nothing to "
                                    f"prepare")
                if splits[split]["documents"] == 0:  # eval by fraction: a small corpus can give none (by chance)
                    raise DataError(self._none_held_out(stream, splits["train"]["documents"]))
        self._save_tokenizer()
        data = self._manifest(splits, stream_stats)
        atomic_write(self.out_dir / MANIFEST, (json.dumps(data, indent=2) + "\n").encode())
        fsync_dir(self.out_dir)
        for split in self.splits:
            self.say(f"{split}: {splits[split]['documents']} documents, {splits[split]['sentences']} sentences, "
                     f"{splits[split]['tokens']} tokens in {len(splits[split]['shards'])} shards "
                     f"({len(reused[split])} reused, {len(written[split])} written)")
            if splits[split]["documents"] == 0:
                self.say(f"warning: the {split} split is empty")
        skipped = CorpusStats(skipped=data["skipped"])
        if skipped.skipped_total:
            self.say(skipped.summary())
        return Manifest(self.out_dir, data, reused, written)

    def _none_held_out(self, stream: _Stream, documents: int) -> str:
        """The refusal when eval_fraction chose no document: the numbers, and a fraction that would hold out about
        five (each document is held out independently with probability eval_fraction, so a corpus of n documents
        gives none with probability (1 - fraction)^n)."""
        expected = documents * self.eval_fraction
        enough = min(0.5, max(self.eval_fraction * 2, 5 / max(documents, 1)))
        return (f"{', '.join(map(str, stream.files))}: --eval-fraction {self.eval_fraction:g} held out none of the "
                f"corpus's {documents} documents (about {expected:.1f} expected), so there would be no eval split; "
                f"use a larger fraction (--eval-fraction {enough:.2g}: about {documents * enough:.0f} documents) or "
                f"give held-out files (--eval-corpus)")

    def _save_tokenizer(self) -> None:
        directory = self.out_dir / TOKENIZER_SUBDIR
        for name in TOKENIZER_FILES:  # e.g. the vocab.txt of a WordPiece build this BPE build replaces
            (directory / name).unlink(missing_ok=True)
        self.tokenizer.save(directory)

    def _tokenizer_entry(self) -> dict:
        tok = self.tokenizer
        entry = {"dir": TOKENIZER_SUBDIR, "kind": tok.kind, "vocab_hash": self.vocab_hash,
                 "vocab_size": tok.vocab_size,
                 # The ids instances are built with: [CLS]/[SEP]/[PAD]/[MASK], or RoBERTa's <s>/</s>/<pad>/<mask>.
                 "special_ids": {"cls": tok.cls_id, "sep": tok.sep_id, "pad": tok.pad_id, "mask": tok.mask_id,
                                 "unk": tok.unk_id},
                 # None where the kind has no such token (T5-style: no cls, no mask).
                 "special_tokens": {name: None if i is None else tok.id_to_token(i) for name, i in
                                    (("cls", tok.cls_id), ("sep", tok.sep_id), ("pad", tok.pad_id),
                                     ("mask", tok.mask_id), ("unk", tok.unk_id))}}
        if tok.kind == "wordpiece":
            entry.update(lowercase=tok.lowercase, strip_accents=tok.strip_accents)
        elif tok.kind == "bpe":
            entry.update(add_prefix_space=tok.add_prefix_space)
        return entry

    def _manifest(self, splits: dict, stream_stats: dict) -> dict:
        skipped: dict[str, int] = {}
        for stats in stream_stats.values():
            for reason, n in stats["skipped"].items():
                skipped[reason] = skipped.get(reason, 0) + n
        return {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "tokenizer": self._tokenizer_entry(),
            "dtype": self.dtype.name,
            "options": {**self.key_options, "batch_size": self.batch_size},
            "streams": {s.name: {"splits": s.splits, "inputs": s.inputs, "read": stream_stats[s.name]}
                        for s in self.streams},
            "skipped": dict(sorted(skipped.items())),
            "splits": splits,
        }

    def _reuse_whole(self) -> Manifest | None:
        """The previous manifest, if it was built from exactly these inputs and options and its files verify."""
        try:
            old = Manifest.load(self.out_dir)
        except (FileNotFoundError, DataError):
            return None
        options = {k: v for k, v in old.data.get("options", {}).items() if k != "batch_size"}
        same = (old.vocab_hash == self.vocab_hash
                and options == self.key_options
                and {name: s.get("inputs") for name, s in old.data.get("streams", {}).items()}
                == {s.name: s.inputs for s in self.streams}
                and set(old.splits) == set(self.splits))
        if not same:
            return None
        for split in old.splits:
            for shard in old.split(split)["shards"]:
                if check_shard_files(self.out_dir / split, shard["name"], shard["files"]) is not None:
                    return None
        if not (self.out_dir / TOKENIZER_SUBDIR / TOKENIZER_KIND_FILE[self.tokenizer.kind]).is_file():
            self._save_tokenizer()
        names = {split: [s["name"] for s in old.split(split)["shards"]] for split in old.splits}
        self.say(f"{self.out_dir}: up to date, reused all {sum(map(len, names.values()))} shards "
                 f"(checksums verified)")
        return Manifest(self.out_dir, old.data, names, {split: [] for split in old.splits})

    # -- one stream --------------------------------------------------------------------------------------------
    def _run_stream(self, stream: _Stream, bar, bar_base: int) -> dict:
        writers = {split: _ShardWriter(self, stream, split) for split in stream.splits}
        for writer in writers.values():
            writer.resume()
        pending = [w for w in writers.values() if not w.complete]
        stats = CorpusStats()
        if not pending:
            stats = CorpusStats.from_dict(next(iter(writers.values())).last_record["stats_end"])
            return {"stats": stats.to_dict(), "writers": writers}
        # Read from the earliest point any split still needs; documents of splits already stored up to a later
        # point are passed over without tokenising.
        start = min((w.end for w in pending), default=None)
        if start is not None and start > Position(0, 0):
            stats = CorpusStats.from_dict(next(w for w in writers.values() if w.end == start).last_record["stats"])
            name = stream.files[start.file]
            self.say(f"{stream.name}: resuming after {name}:{start.line} (document {start.documents} of that file)")
        else:
            start = Position(0, 0)
        bar.update(max(0, bar_base + sum(f["size"] for f in stream.inputs[:start.file]) - bar.n))

        reader = iter_positioned_documents(stream.files, self.format, self.on_bad_line, self.split_sentences,
                                           stats, start, text_column=self.key_options.get("text_column", "text"),
                                           document_column=self.key_options.get("document_column"))

        def todo() -> Iterator[tuple[_ShardWriter, Document, Position, dict]]:
            for document, position in reader:
                writer = writers[self._route(stream, position)]
                if writer.complete or position <= writer.end:
                    continue  # already in a verified shard
                # The reader's counts as of this document: a shard ending here records them for resuming.
                yield writer, document, position, stats.to_dict()

        batch: list[tuple[_ShardWriter, Document, Position, dict]] = []
        batch_sentences = 0
        items = _Background(todo())
        try:
            for item in items:
                batch.append(item)
                batch_sentences += len(item[1].sentences)
                if batch_sentences >= self.batch_size:
                    self._encode(batch)
                    batch, batch_sentences = [], 0
                    bar.update(max(0, bar_base + stats.bytes_read - bar.n))
        finally:
            items.close()
        self._encode(batch)
        bar.update(max(0, bar_base + stats.bytes_read - bar.n))
        for writer in writers.values():
            writer.finish(stats.to_dict())
        return {"stats": stats.to_dict(), "writers": writers}

    def _route(self, stream: _Stream, position: Position) -> str:
        if len(stream.splits) == 1:
            return stream.splits[0]
        # Hash of (seed, file, document index): independent of what came before, so streaming and resuming agree.
        digest = hashlib.blake2b(f"{self.seed}/{position.file}/{position.documents - 1}".encode(),
                                 digest_size=8).digest()
        return "eval" if int.from_bytes(digest, "little") < self.eval_fraction * 2.0 ** 64 else "train"

    def _encode(self, batch: list) -> None:
        """Tokenise every sentence of the batch in one engine call and hand each document to its writer."""
        if not batch:
            return
        sentences = [s for _, document, _, _ in batch for s in document.sentences]
        if self._encode_plain is not None:
            ids = self._encode_plain(sentences)
        else:
            ids = [e.ids for e in self._engine_encode(sentences, add_special_tokens=False)]
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        total = int(lengths.sum())
        flat_ids = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=total)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # Word starts from the piece alone (`word_start_flags`: not a "##" continuation for WordPiece, a "Ġ" piece
        # for BPE), plus every sentence's first piece. For WordPiece this equals "word id differs from the previous
        # piece's" (tested); either way the engine can skip offset tracking.
        starts = self.word_starts[flat_ids]
        starts[offsets[:-1][lengths > 0]] = True
        flat_ids = flat_ids.astype(self.dtype)
        first = 0
        for writer, document, position, stats in batch:
            last = first + len(document.sentences)
            doc_lengths = lengths[first:last]
            kept = doc_lengths[doc_lengths > 0]
            lo, hi = offsets[first], offsets[last]
            writer.add(flat_ids[lo:hi], starts[lo:hi], kept, len(doc_lengths) - len(kept), position, stats)
            first = last


class _ShardWriter:
    """Collects one split's documents into shards, writes each finished shard and its resume record."""

    def __init__(self, build: _Build, stream: _Stream, split: str) -> None:
        self.build, self.stream, self.split = build, stream, split
        self.dir = build.out_dir / split
        self.shards: list[dict] = []  # manifest entries, reused then written
        self.reused_names: list[str] = []
        self.written_names: list[str] = []
        self.end = Position(0, 0)  # stored documents of this split come no later than here
        self.complete = False
        self.last_record: dict | None = None
        self.tail_dropped = [0, 0]  # dropped (documents, sentences) not attached to any shard
        self._reset()

    def _reset(self) -> None:
        self.tokens: list[np.ndarray] = []
        self.starts: list[np.ndarray] = []
        self.sentence_lengths: list[np.ndarray] = []
        self.doc_sentences: list[int] = []
        self.n_tokens = 0
        self.dropped = [0, 0]
        self.position: Position | None = None
        self.stats: dict | None = None

    def _record_base(self) -> dict:
        return {"format_version": FORMAT_VERSION, "split": self.split, "stream": self.stream.name,
                "vocab_hash": self.build.vocab_hash, "options": self.build.key_options}

    # -- resuming ----------------------------------------------------------------------------------------------
    def resume(self) -> None:
        """Keep the leading run of shards whose records match this build and whose files verify."""
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in self.dir.glob(".shard_*.tmp*"):
            stale.unlink(missing_ok=True)  # left by a crash mid-write
        base = self._record_base()
        reason = None
        index = 0
        while True:
            path = self.dir / f"{shard_name(index)}.json"
            if not path.is_file():
                break
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError):
                reason = f"{path} is unreadable"
                break
            reason = self._mismatch(record, base)
            if reason is None:
                reason = check_shard_files(self.dir, record["name"], record["files"])
            if reason is not None:
                break
            self.shards.append(shard_entry(record))
            self.reused_names.append(record["name"])
            self.last_record = record
            self.end = Position.from_dict(record["end"])
            self.complete = bool(record["final"])
            index += 1
        # Records past the kept run describe shards about to be rewritten: remove them before any data file is.
        for stale in sorted(self.dir.glob("shard_*.json")):
            if shard_index(stale.name) >= index:
                stale.unlink()
        if self.reused_names:
            note = f"; rebuilding the rest: {reason}" if reason and not self.complete else ""
            self.build.say(f"{self.split}: reusing {len(self.reused_names)} finished shards (checksums "
                           f"verified){note}")
        elif reason:
            self.build.say(f"{self.split}: rebuilding all shards: {reason}")

    def _mismatch(self, record: dict, base: dict) -> str | None:
        if record.get("format_version") != FORMAT_VERSION:
            return "the shard format changed"
        if record.get("vocab_hash") != base["vocab_hash"]:
            return "the tokenizer's vocabulary changed"
        if record.get("options") != base["options"]:
            changed = sorted(k for k in set(base["options"]) | set(record.get("options", {}))
                             if record.get("options", {}).get(k) != base["options"].get(k))
            return f"options changed ({', '.join(changed)})"
        if record.get("stream") != base["stream"] or record.get("split") != base["split"]:
            return "the split's inputs changed"
        used = record.get("inputs", [])
        now = self.stream.inputs[:len(used)]
        for old, new in zip(used, now):
            if old != new:
                return f"input {new['path']} changed" if old["path"] == new["path"] else \
                    f"input {old['path']} was replaced by {new['path']}"
        if len(now) < len(used):
            return f"input {used[len(now)]['path']} is no longer given"
        return None

    # -- writing -----------------------------------------------------------------------------------------------
    def add(self, tokens: np.ndarray, starts: np.ndarray, sentence_lengths: np.ndarray, dropped_sentences: int,
            position: Position, stats: dict) -> None:
        """Add one document (its pieces, word starts and non-zero sentence lengths) read up to `position`."""
        if len(sentence_lengths) == 0:
            # Nothing left after tokenising: count it against the open shard, whose range now reaches here.
            self.dropped[0] += 1
            self.dropped[1] += dropped_sentences
            self.position, self.stats = position, stats
            return
        if self.n_tokens >= self.build.shard_tokens:
            self._close(final=False)
        self.tokens.append(tokens)
        self.starts.append(starts)
        self.sentence_lengths.append(sentence_lengths)
        self.doc_sentences.append(len(sentence_lengths))
        self.n_tokens += len(tokens)
        self.dropped[1] += dropped_sentences
        self.position, self.stats = position, stats

    def finish(self, stats_end: dict) -> None:
        """End of the stream: write the open shard as the split's last."""
        if self.doc_sentences:
            self._close(final=True, stats_end=stats_end)
        else:
            self.tail_dropped = list(self.dropped)
            if self.last_record is not None and not self.last_record["final"]:
                # The inputs after the last kept shard turned out to hold nothing more for this split.
                self.last_record.update(final=True, stats_end=stats_end)
                atomic_write(self.dir / f"{self.last_record['name']}.json", _json_bytes(self.last_record))
        names = {s["name"] for s in self.shards}
        for path in self.dir.glob("shard_*"):  # files of shards a previous, longer build left behind
            if path.name.split(".")[0] not in names:
                path.unlink()

    def _close(self, final: bool, stats_end: dict | None = None) -> None:
        name = shard_name(len(self.shards))
        tokens = np.concatenate(self.tokens).astype(self.build.dtype, copy=False)
        lengths = np.concatenate(self.sentence_lengths)
        sentences = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=sentences[1:])
        documents = np.zeros(len(self.doc_sentences) + 1, dtype=np.int64)
        np.cumsum(self.doc_sentences, out=documents[1:])
        payloads = {"tokens.bin": memoryview(np.ascontiguousarray(tokens)).cast("B"),
                    "sentences.npy": _npy_bytes(sentences), "documents.npy": _npy_bytes(documents),
                    "wordstarts.bin": np.packbits(np.concatenate(self.starts)).tobytes()}
        files = {}
        for suffix, payload in payloads.items():
            atomic_write(self.dir / f"{name}.{suffix}", payload)
            files[suffix] = {"sha256": hashlib.sha256(payload).hexdigest(), "bytes": len(payload)}
        record = {**self._record_base(), "name": name,
                  "inputs": self.stream.inputs[:self.position.file + 1],
                  "end": self.position.to_dict(), "final": final, "stats": self.stats,
                  "documents": len(self.doc_sentences), "sentences": int(len(lengths)), "tokens": int(len(tokens)),
                  "dropped_documents": self.dropped[0], "dropped_sentences": self.dropped[1], "files": files}
        if final:
            record["stats_end"] = stats_end
        fsync_dir(self.dir)  # the data files' names are durable before the record that vouches for them
        atomic_write(self.dir / f"{name}.json", _json_bytes(record))
        self.shards.append(shard_entry(record))
        self.written_names.append(name)
        self.last_record = record
        self._reset()

    def summary(self) -> dict:
        """The split's manifest entry."""
        return {"documents": sum(s["documents"] for s in self.shards),
                "sentences": sum(s["sentences"] for s in self.shards),
                "tokens": sum(s["tokens"] for s in self.shards),
                "dropped_documents": sum(s["dropped_documents"] for s in self.shards) + self.tail_dropped[0],
                "dropped_sentences": sum(s["dropped_sentences"] for s in self.shards) + self.tail_dropped[1],
                "shards": self.shards}


class _Background:
    """Iterate `items` in a background thread, `chunk` at a time, at most `depth` chunks ahead.

    Reading and sentence splitting are Python; the engine's encode_batch runs in Rust without the GIL. Reading
    ahead in a thread lets the two overlap, which matters most on many cores, where the engine is fast and the
    single-threaded reader would otherwise be the bottleneck. Exceptions in the reader re-raise here.
    """

    _DONE = object()

    def __init__(self, items: Iterator, chunk: int = 64, depth: int = 8) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._chunk = chunk
        self._thread = threading.Thread(target=self._produce, args=(items,), name="bertkit-prepare-reader",
                                        daemon=True)
        self._thread.start()

    def _produce(self, items: Iterator) -> None:
        try:
            chunk = []
            for item in items:
                chunk.append(item)
                if len(chunk) >= self._chunk:
                    if not self._put(chunk):
                        return
                    chunk = []
            self._put(chunk)
            self._put(self._DONE)
        except BaseException as err:  # handed to the consuming thread, which raises it
            self._put(err)

    def _put(self, value) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(value, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator:
        while True:
            value = self._queue.get()
            if value is self._DONE:
                return
            if isinstance(value, BaseException):
                raise value
            yield from value

    def close(self) -> None:
        """Stop the reader (if still running) and wait for it."""
        self._stop.set()
        self._thread.join()


def _npy_bytes(array: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _json_bytes(data: dict) -> bytes:
    return (json.dumps(data, indent=1) + "\n").encode()
