"""Reading raw corpora as documents: lists of sentences, each document remembering the file and line it came from.

Three formats, chosen by file name (a trailing `.gz` is ignored; gzip data is recognised by its magic bytes and
decompressed transparently) or forced with `format=`:

* ``text`` (`.txt`, and any unknown extension) — Google's BERT format: one sentence per line, a blank line
  between documents. Lines are taken as they are (stripped), not split further unless `split_sentences=True`.
* ``jsonl`` (`.jsonl`, `.json`) — one JSON object per line with a string ``"text"``; other keys are ignored. The
  text is cut into sentences on newlines, then by `split_sentences` (the light rule below).
* ``wikitext`` (`wiki.*.raw`, `wiki.*.tokens`) — WikiText: a line `` = Title = `` starts an article (one
  document); section headings `` = = Section = = `` (any depth) are dropped, and so is the title itself: only
  running prose becomes sentences, as in the Wikipedia dumps BERT was trained on. Each remaining line is a
  paragraph, split into sentences. WikiText's split-number markers are joined back (``1 @,@ 000`` -> ``1,000``,
  ``0 @.@ 5`` -> ``0.5``, ``state @-@ of`` -> ``state-of``): they are artefacts of its tokenisation, not text.

* ``parquet`` (`.parquet`) and ``arrow`` (`.arrow`, `.feather`, `.ipc`: Arrow IPC, file or stream format) — a
  column of strings (`text_column`, default ``"text"``), read with pyarrow in record batches
  (`bertkit.data.readers`), so memory stays around one batch. A row is a document and its newlines are its line
  boundaries, exactly as in the text format (one sentence per line, not split further by default); with
  `document_column`, consecutive rows with the same value there form one document instead (a row per line or
  paragraph). A `datasets.save_to_disk` directory is read as its Arrow files (state.json's list), and a directory
  of Parquet shards as its shards, sorted. Positions are rows (0-based), and errors say ``path:row N:``.

Bad input never passes silently. With ``on_bad_line="error"`` (the default) a line that is not valid UTF-8, a
JSONL line that is not an object with a string "text", a null or non-string cell of a Parquet or Arrow text column,
or a document with no text raises
`bertkit.errors.DataError` whose message starts with ``path:line:``. With ``"skip"`` the line (or document) is
dropped and counted, per reason, in a `CorpusStats` the caller passes in.

Sentence splitting (`split_sentences`) is deliberately small and dependency-free: a sentence ends after ``.``,
``!`` or ``?`` (optionally followed by closing quotes or brackets) when whitespace and then an upper-case letter
or a digit (optionally behind an opening quote or bracket) follow, except after a single capital letter (an
initial, "J. Smith") or a few common abbreviations ("Mr.", "Dr.", "e.g."). It will sometimes cut after other
abbreviations; for BERT's sentence-pair tasks an occasional wrong cut is harmless.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bertkit.data.readers import COLUMNAR, Row, Table, columnar_files
from bertkit.errors import DataError

FORMATS = ("text", "jsonl", "wikitext", "parquet", "arrow")
COLUMNAR_FORMATS = ("parquet", "arrow")  # read in record batches; a Position's byte and line are rows
ON_BAD_LINE = ("error", "skip")

# Reasons a line or document can be skipped, with the words `CorpusStats.summary` prints for them.
SKIP_REASONS = {
    "invalid_utf8": "invalid UTF-8",
    "invalid_json": "invalid JSON",
    "missing_text": 'no string "text"',
    "empty_document": "empty document",
}

_GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class Document:
    """One document: `sentences` (non-empty, stripped strings) read from `source` starting at 1-based `line`."""

    source: str
    line: int
    sentences: list[str]


@dataclass
class CorpusStats:
    """What a reader saw; pass one to `iter_documents` and read it while or after iterating.

    documents / sentences: how many were yielded.
    skipped: lines (or documents) dropped under ``on_bad_line="skip"``, per reason (keys of `SKIP_REASONS`).
    bytes_read: bytes of the input files consumed so far (compressed bytes for gzip files); for progress bars.
    """

    documents: int = 0
    sentences: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    bytes_read: int = 0

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    def count_skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def summary(self) -> str:
        """``"skipped 5 lines (3 invalid UTF-8, 2 empty document)"``, or ``"skipped 0 lines"``."""
        parts = [f"{n} {SKIP_REASONS.get(reason, reason)}" for reason, n in sorted(self.skipped.items()) if n]
        return f"skipped {self.skipped_total} lines" + (f" ({', '.join(parts)})" if parts else "")

    def to_dict(self) -> dict:
        return {"documents": self.documents, "sentences": self.sentences, "skipped": dict(sorted(self.skipped.items()))}

    @classmethod
    def from_dict(cls, data: dict) -> "CorpusStats":
        return cls(documents=int(data["documents"]), sentences=int(data["sentences"]),
                   skipped={str(k): int(v) for k, v in data["skipped"].items()})


# ---- sentence splitting ------------------------------------------------------------------------------------
# A candidate end: terminal punctuation plus closing quotes/brackets, then whitespace (checked by lookahead so the
# whitespace stays out of the sentence).
_CANDIDATE_END = re.compile(r"[.!?]+[\"'\u201d\u2019\u00bb)\]}]*(?=\s)")
_OPENERS = "\"'\u201c\u2018\u00ab([{"
# Words after which a full stop rarely ends a sentence. Compared case-sensitively.
_ABBREVIATIONS = frozenset(
    "Mr Mrs Ms Dr Prof St Jr Sr Mt Gen Col Lt Sgt Capt Rev Gov Sen Rep Fig Vol vs cf e.g i.e".split())


def split_sentences(text: str) -> list[str]:
    """Cut `text` into sentences with the rule in the module docstring; returns stripped, non-empty pieces.

    >>> split_sentences("It rained. Then it stopped! Mr. Smith left at 5. 3 dogs barked.")
    ['It rained.', 'Then it stopped!', 'Mr. Smith left at 5.', '3 dogs barked.']
    """
    pieces: list[str] = []
    start = 0
    n = len(text)
    for match in _CANDIDATE_END.finditer(text):
        nxt = match.end()
        while nxt < n and text[nxt].isspace():
            nxt += 1
        while nxt < n and text[nxt] in _OPENERS:
            nxt += 1
        if nxt >= n or not (text[nxt].isupper() or text[nxt].isdigit()):
            continue
        if text[match.start()] == ".":
            # The word before the full stop; walk back instead of slicing the whole prefix (quadratic otherwise).
            back = match.start()
            while back > start and not text[back - 1].isspace():
                back -= 1
            word = text[back:match.start()].lstrip(_OPENERS)
            if word in _ABBREVIATIONS or (len(word) == 1 and word.isupper()):
                continue
        piece = text[start:match.end()].strip()
        if piece:
            pieces.append(piece)
        start = match.end()
    tail = text[start:].strip()
    if tail:
        pieces.append(tail)
    return pieces


def _split_paragraphs(text: str, splitter: Callable[[str], list[str]] | None) -> list[str]:
    """Newlines always end a sentence; within a line, `splitter` (if any) cuts further."""
    out: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if splitter is None:
            out.append(line)
        else:
            out.extend(s for s in (p.strip() for p in splitter(line)) if s)
    return out


# ---- paths and formats ---------------------------------------------------------------------------------------
def detect_format(path: str | os.PathLike) -> str | None:
    """The format a file name implies (``.gz`` stripped), or None when the name says nothing."""
    name = Path(path).name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    if re.fullmatch(r"wiki\..+\.(raw|tokens)", name):
        return "wikitext"
    if name.endswith((".jsonl", ".json")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith((".arrow", ".feather", ".ipc")):
        return "arrow"
    if name.endswith((".txt", ".text")):
        return "text"
    return None


def expand_paths(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """Turn files, directories and glob patterns into a sorted-per-entry, duplicate-free list of files.

    A directory contributes, recursively and sorted, every non-hidden file whose name `detect_format` recognises.
    A pattern (``*``, ``?``, ``[``; ``**`` recurses) contributes its sorted matches. Entries keep the order given.
    Raises FileNotFoundError naming the entry when a file is missing, a pattern matches nothing or a directory
    holds no corpus file; PermissionError naming the file when it cannot be read; ValueError when `paths` is empty.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    entries = [os.fspath(p) for p in paths]
    if not entries:
        raise ValueError("corpus is empty: no input paths were given")
    out: list[Path] = []
    seen: set[Path] = set()
    for entry in entries:
        path = Path(entry).expanduser()
        if _is_datasets_dir(path) or (path / "dataset_dict.json").is_file():
            # its Arrow files, in state.json's order; a DatasetDict is refused, naming its splits (a corpus that
            # took them all would train on the test split)
            files = columnar_files(path, "datasets")
        elif path.is_dir():
            files = _corpus_files_in(path)
            if not files:
                raise FileNotFoundError(f"{path}: the directory holds no corpus files (*.txt, *.jsonl, *.json, "
                                        f"wiki.*.raw, wiki.*.tokens, optionally .gz; *.parquet, *.arrow)")
        elif path.exists():
            files = [path]
        elif glob.has_magic(entry):
            files = []
            for match in sorted(glob.glob(os.path.expanduser(entry), recursive=True)):
                match = Path(match)
                files.extend(_corpus_files_in(match) if match.is_dir() else [match])
            if not files:
                raise FileNotFoundError(f"no corpus files match the pattern {entry!r}")
        else:
            raise FileNotFoundError(f"{entry}: no such corpus file or directory")
        for file in files:
            if not os.access(file, os.R_OK):
                raise PermissionError(f"{file}: cannot read the corpus file (permission denied)")
            key = file.resolve()
            if key not in seen:  # the same file named twice would count its documents twice
                seen.add(key)
                out.append(file)
    return out


def _is_datasets_dir(path: Path) -> bool:
    """A `datasets.save_to_disk` directory of one split (a DatasetDict's split is its subdirectory)."""
    return (path / "state.json").is_file() and (path / "dataset_info.json").is_file()


def _corpus_files_in(directory: Path) -> list[Path]:
    for marker in directory.rglob("dataset_dict.json"):
        columnar_files(marker.parent, "datasets")  # a DatasetDict inside: refused too, naming its splits
    found = []
    datasets_dirs: dict[Path, set[Path]] = {}  # a save_to_disk directory inside -> its data files
    for file in directory.rglob("*"):
        relative = file.relative_to(directory).parts
        if any(part.startswith(".") for part in relative) or not file.is_file():
            continue
        if file.parent not in datasets_dirs:
            datasets_dirs[file.parent] = (set(columnar_files(file.parent, "datasets"))
                                          if _is_datasets_dir(file.parent) else set())
        if datasets_dirs[file.parent] or (file.parent / "dataset_dict.json").is_file():
            if file not in datasets_dirs[file.parent]:
                continue  # state.json, dataset_info.json, caches: a datasets directory's own files
        elif detect_format(file) is None:
            continue
        found.append((relative, file))
    return [file for _, file in sorted(found)]


# ---- reading -------------------------------------------------------------------------------------------------
@dataclass(frozen=True, order=True)
class Position:
    """A point in a list of files where reading can resume: after `documents` documents of file number `file`.

    byte: offset in the file's (decompressed) bytes; line: how many lines lie before it. Positions compare in
    reading order, so `(file, documents)` also names the document *before* the position.
    """

    file: int
    documents: int
    byte: int = field(compare=False, default=0)
    line: int = field(compare=False, default=0)

    def to_dict(self) -> dict:
        return {"file": self.file, "documents": self.documents, "byte": self.byte, "line": self.line}

    @classmethod
    def from_dict(cls, data: dict) -> "Position":
        return cls(int(data["file"]), int(data["documents"]), int(data["byte"]), int(data["line"]))


def _check_options(format: str | None, on_bad_line: str) -> None:
    if format == "datasets":
        format = "arrow"  # a save_to_disk directory's files
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown corpus format {format!r}; expected one of {list(FORMATS)}")
    if on_bad_line not in ON_BAD_LINE:
        raise ValueError(f"on_bad_line must be one of {list(ON_BAD_LINE)}, not {on_bad_line!r}")


def _splitter_for(fmt: str, split_sentences_: bool | Callable[[str], list[str]] | None):
    if callable(split_sentences_):
        return split_sentences_
    if split_sentences_ is None:
        # Google's text format already has one sentence per line; a Parquet or Arrow row's lines are its sentences
        split_sentences_ = fmt in ("jsonl", "wikitext")
    return split_sentences if split_sentences_ else None


def iter_documents(paths: str | os.PathLike | Iterable[str | os.PathLike], format: str | None = None,
                   on_bad_line: str = "error", split_sentences: bool | Callable[[str], list[str]] | None = None,
                   stats: CorpusStats | None = None, text_column: str = "text",
                   document_column: str | None = None) -> Iterator[Document]:
    """Every document of every file in `paths` (see `expand_paths`), in order.

    format: one of `FORMATS` for all files, or None to choose per file by name (unknown names read as text).
    on_bad_line: "error" raises DataError("path:line: ..."); "skip" drops the line or document and counts it
        in `stats.skipped`.
    split_sentences: None = the format's default (text: one sentence per line; jsonl and wikitext: split with
        `split_sentences`); True / False to force; or a callable str -> list[str] to split lines yourself.
    stats: a `CorpusStats` to update while reading (counts and bytes read).
    text_column: the key (JSONL) or column (Parquet, Arrow) of the text.
    document_column: Parquet and Arrow: consecutive rows with the same value in this column form one document
        (None: each row is one).
    """
    _check_options(format, on_bad_line)
    files = expand_paths(paths)
    for document, _ in iter_positioned_documents(files, format, on_bad_line, split_sentences, stats,
                                                 text_column=text_column, document_column=document_column):
        yield document


def iter_positioned_documents(files: list[Path], format: str | None = None, on_bad_line: str = "error",
                              split_sentences: bool | Callable[[str], list[str]] | None = None,
                              stats: CorpusStats | None = None, start: Position | None = None,
                              text_column: str = "text",
                              document_column: str | None = None) -> Iterator[tuple[Document, Position]]:
    """`iter_documents` over already expanded `files`, also giving the position just after each document.

    Reading can resume from any such position (`start`) with the same files and options and yields exactly the
    documents that followed it; `prepare` uses this to redo only unfinished shards after a crash. Document
    indices in positions count yielded documents, so they depend on `on_bad_line` and the file contents.
    """
    _check_options(format, on_bad_line)
    format = "arrow" if format == "datasets" else format
    stats = stats if stats is not None else CorpusStats()
    start = start or Position(0, 0)
    done_bytes = sum(_size(f) for f in files[:start.file])
    for ordinal in range(start.file, len(files)):
        path = files[ordinal]
        fmt = format or detect_format(path) or "text"
        here = start if ordinal == start.file else Position(ordinal, 0)
        index = here.documents
        if fmt in COLUMNAR_FORMATS:
            items = _read_columnar(path, fmt, _splitter_for(fmt, split_sentences), on_bad_line, stats, here.line,
                                   text_column, document_column)
        else:
            items = _read_file(path, fmt, _splitter_for(fmt, split_sentences), on_bad_line, stats, here.byte,
                               here.line, text_column)
        for sentences, first_line, end_byte, end_line, consumed in items:
            index += 1
            stats.documents += 1
            stats.sentences += len(sentences)
            stats.bytes_read = done_bytes + consumed
            yield Document(str(path), first_line, sentences), Position(ordinal, index, end_byte, end_line)
        done_bytes += _size(path)
        stats.bytes_read = done_bytes


def iter_lines(paths: str | os.PathLike | Iterable[str | os.PathLike], format: str | None = None,
               text_column: str = "text", document_column: str | None = None) -> Iterator[str]:
    """Every sentence of every document, for vocabulary training. Invalid input raises DataError (path:line).
    format, text_column, document_column: as in `iter_documents`.

    Raises ValueError("corpus ... is empty") when the files hold no text at all.
    """
    count = 0
    names = [os.fspath(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
    if not names:
        raise ValueError("corpus [] is empty: no input paths were given")
    for document in iter_documents(names, format=format, text_column=text_column, document_column=document_column):
        for sentence in document.sentences:
            count += 1
            yield sentence
    if count == 0:
        raise ValueError(f"corpus {names} is empty: no text was read from it")


class CorpusLines:
    """The sentences of corpus files (`iter_lines`) as an iterable that reads the files afresh each time it is
    iterated: vocabulary training, which reads its text twice, re-reads the files rather than copying them."""

    rereadable = True  # `bertkit.tokenizers.base.replayable` reads such an iterable again instead of copying it

    def __init__(self, paths: str | os.PathLike | Iterable[str | os.PathLike], format: str | None = None,
                 text_column: str = "text", document_column: str | None = None):
        self.paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
        self.format = format
        self.text_column, self.document_column = text_column, document_column

    def __iter__(self) -> Iterator[str]:
        return iter_lines(self.paths, format=self.format, text_column=self.text_column,
                          document_column=self.document_column)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


# ---- one file ------------------------------------------------------------------------------------------------
# Each reader yields (sentences, first line, end byte, end line, bytes consumed). "End" is where reading may resume:
# just before the line that ended the document (blank line, next title, or EOF), or just after a JSONL line.
_Item = tuple[list[str], int, int, int, int]


class _Lines:
    """Decoded lines of one file with their numbers and byte offsets; invalid UTF-8 raised or counted here."""

    def __init__(self, path: Path, on_bad_line: str, stats: CorpusStats, byte: int, line: int) -> None:
        self.path, self.on_bad_line, self.stats = path, on_bad_line, stats
        self.start_byte, self.start_line = byte, line
        self.offset = byte  # decompressed offset after the last line read
        self.before = byte  # decompressed offset before the last line read
        self.number = line  # 1-based number of the last line read
        self._raw = None
        self._gzip = False
        self._eof_consumed: int | None = None

    def consumed(self) -> int:
        """Bytes of the file on disk consumed so far (compressed bytes for gzip)."""
        if self._eof_consumed is not None:
            return self._eof_consumed
        return self._raw.tell() if self._gzip else self.offset

    def __iter__(self) -> Iterator[tuple[int, str]]:
        try:
            raw = open(self.path, "rb")
        except OSError as err:
            raise OSError(f"{self.path}: cannot open the corpus file ({err.strerror})") from None
        with raw:
            self._raw = raw
            self._gzip = raw.read(2) == _GZIP_MAGIC
            raw.seek(0)
            handle = gzip.GzipFile(fileobj=raw, mode="rb") if self._gzip else raw
            try:
                if self.start_byte:
                    handle.seek(self.start_byte)  # gzip seeks forward by decompressing; still no parsing
                for data in handle:
                    self.before = self.offset
                    self.offset += len(data)
                    self.number += 1
                    try:
                        text = data.decode("utf-8")
                    except UnicodeDecodeError as err:
                        if self.on_bad_line == "error":
                            raise DataError.at(self.path, self.number,
                                               f"invalid UTF-8 at byte {err.start} of the line") from None
                        self.stats.count_skip("invalid_utf8")
                        continue
                    yield self.number, text
                self._eof_consumed = raw.tell()  # the file is closed when readers ask at the end
            except (gzip.BadGzipFile, EOFError, zlib.error) as err:
                raise DataError.at(self.path, self.number + 1, f"the gzip data is corrupt or truncated ({err})") \
                    from None
            except OSError as err:
                raise OSError(f"{self.path}:{self.number + 1}: cannot read the corpus file ({err})") from None


def _read_file(path: Path, fmt: str, splitter, on_bad_line: str, stats: CorpusStats, byte: int,
               line: int, text_column: str = "text") -> Iterator[_Item]:
    lines = _Lines(path, on_bad_line, stats, byte, line)
    if fmt == "text":
        return _read_text(lines, splitter)
    if fmt == "jsonl":
        return _read_jsonl(lines, splitter, text_column)
    return _read_wikitext(lines, splitter)


def _read_text(lines: _Lines, splitter) -> Iterator[_Item]:
    sentences: list[str] = []
    first = 0
    for number, text in lines:
        text = text.strip()
        if not text:
            if sentences:
                yield sentences, first, lines.before, lines.number - 1, lines.consumed()
                sentences = []
            continue
        if not sentences:
            first = number
        sentences.extend([text] if splitter is None else _split_paragraphs(text, splitter))
    if sentences:
        yield sentences, first, lines.offset, lines.number, lines.consumed()


def _read_jsonl(lines: _Lines, splitter, key: str = "text") -> Iterator[_Item]:
    for number, text in lines:
        if not text.strip():
            continue  # blank lines (a trailing newline, say) are not documents
        reason, message = None, ""
        try:
            record = json.loads(text)
        except json.JSONDecodeError as err:
            reason, message = "invalid_json", f"not valid JSON ({err.msg} at column {err.colno})"
        else:
            if not isinstance(record, dict) or not isinstance(record.get(key), str):
                got = type(record).__name__ if not isinstance(record, dict) else \
                    (f"no {key!r} key" if key not in record else f"{key!r} is {type(record[key]).__name__}")
                reason, message = "missing_text", f'expected a JSON object with a string "{key}" ({got})'
            else:
                sentences = _split_paragraphs(record[key], splitter)
                if sentences:
                    yield sentences, number, lines.offset, number, lines.consumed()
                    continue
                reason, message = "empty_document", "the document's text is empty"
        if lines.on_bad_line == "error":
            raise DataError.at(lines.path, number, message)
        lines.stats.count_skip(reason)


_TITLE = re.compile(r"= (?!=)(.*?)(?<!=) =")
_HEADING = re.compile(r"(?:= ){2,}.*?(?: =){2,}")
_WIKITEXT_MARKERS = re.compile(r" @([-.,])@ ")


def _read_wikitext(lines: _Lines, splitter) -> Iterator[_Item]:
    sentences: list[str] = []
    title: str | None = None
    first = 0  # line of the current article's title (0: no article open)

    def finish(end_byte: int, end_line: int) -> Iterator[_Item]:
        if sentences:
            yield sentences, first, end_byte, end_line, lines.consumed()
        elif first:
            if lines.on_bad_line == "error":
                raise DataError.at(lines.path, first, f"the article {title!r} has no text")
            lines.stats.count_skip("empty_document")

    for number, text in lines:
        text = text.strip()
        if not text:
            continue
        title_match = _TITLE.fullmatch(text)
        if title_match:
            yield from finish(lines.before, number - 1)
            sentences, title, first = [], title_match.group(1), number
            continue
        if _HEADING.fullmatch(text):
            continue
        if not first:
            first = number  # prose before any title still forms a document
        text = _WIKITEXT_MARKERS.sub(r"\1", text)
        sentences.extend([text] if splitter is None else _split_paragraphs(text, splitter))
    yield from finish(lines.offset, lines.number)


def _read_columnar(path: Path, fmt: str, splitter, on_bad_line: str, stats: CorpusStats, start_row: int,
                   text_column: str, document_column: str | None) -> Iterator[_Item]:
    """Documents of a Parquet or Arrow file from row `start_row` on: a row each, or (`document_column`) runs of
    consecutive rows with the same value there. Positions are rows: a document's "line" is its first row, its end
    the row after its last. Bytes consumed are the file's size times the share of rows read (Parquet), or all of it
    at the end (Arrow streams do not say how many rows they hold)."""
    table = Table(path, fmt)
    table.require(text_column, document_column)
    size = _size(path)
    total = table.num_rows()
    columns = [text_column] + ([document_column] if document_column is not None else [])
    row = start_row
    sentences: list[str] = []
    first = row
    key: object = None
    open_document = False

    def consumed(done: int) -> int:
        return size if not total else size * done // total

    def finish(end: int) -> Iterator[_Item]:
        if sentences:
            yield list(sentences), Row(first), end, end, consumed(end)
            return
        if on_bad_line == "error":
            what = "row's text" if document_column is None else f"document {key!r}"
            raise DataError.at(path, Row(first), f"the {what} is empty (column {text_column!r})")
        stats.count_skip("empty_document")

    for batch in table.batches(columns, start=start_row):
        texts = batch.column(0).to_pylist()
        keys = batch.column(1).to_pylist() if document_column is not None else None
        for i, text in enumerate(texts):
            if document_column is None or not open_document or keys[i] != key:
                if open_document:
                    yield from finish(row)
                sentences.clear()
                first, key, open_document = row, (keys[i] if keys is not None else None), True
            row += 1
            if not isinstance(text, str):
                got = "null" if text is None else f"a {type(text).__name__}, not a string"
                if on_bad_line == "error":
                    raise DataError.at(path, Row(row - 1), f"the column {text_column!r} is {got}")
                stats.count_skip("missing_text")
                if document_column is None:
                    open_document = False  # the row is dropped (counted once, not also as an empty document)
                continue
            sentences.extend(_split_paragraphs(text, splitter))
            if document_column is None:
                yield from finish(row)
                open_document = False
    if open_document:
        yield from finish(row)
