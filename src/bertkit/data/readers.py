"""Tables from where users keep them: one record reader for every verb that reads rows of named columns.

A *table* is a file (or a directory of files) of records with named columns. Its format comes from the path
(`table_format`), or is forced:

* ``tsv`` / ``csv`` (`.tsv`, `.txt` / `.csv`): a header row names the columns (TSV unquoted, as GLUE; CSV with
  standard double-quote quoting). Records are located by the 1-based line where they start.
* ``jsonl`` (`.jsonl`, `.ndjson`): one JSON object per line, located by line.
* ``json`` (`.json`): a list of records (KLUE's NLI and STS files), or records under a key of a JSON object
  (``records="data"``; a dotted key walks nested objects). A `.json` file that is JSON Lines reads as JSON Lines.
  The file is parsed whole (JSON has no record boundaries to stream by); records are located by their index.
* ``parquet`` (`.parquet`, or a directory or glob of Parquet shards, read in sorted order).
* ``arrow`` (`.arrow`, `.feather`, `.ipc`): Arrow IPC, the file format or the stream format (told by the magic
  bytes).
* ``datasets``: a directory written by `datasets.Dataset.save_to_disk` (its `state.json` lists its Arrow files,
  which are Arrow *stream* files, and its `dataset_info.json` has the features). A `DatasetDict` directory is
  refused with its splits named: its split is its subdirectory (``DIR/train``).

Parquet, Arrow and `datasets` directories are read with pyarrow in record batches, so memory stays around one
batch whatever the file's size; `datasets` itself is never imported. Their records are located by their 0-based
row index, as `datasets`, pandas and pyarrow index rows, printed ``path:row N:``.

Column values come as Python objects (strings, numbers, lists, dicts for structs). Integer columns that
`datasets` declared as ``ClassLabel`` (in `dataset_info.json`, or in the ``huggingface`` schema metadata it writes
into Parquet and Arrow files) have their names available from `Table.class_names` (also for a list of ClassLabel,
conll2003's ``ner_tags``).

Errors are one line (`bertkit.errors.DataError`): a missing column names the columns the file has; a file pyarrow
cannot read says so; a path that is no table names what was expected.
"""

from __future__ import annotations

import csv
import glob
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc
import pyarrow.parquet

from bertkit.errors import DataError

TABLE_FORMATS = ("tsv", "csv", "jsonl", "json", "parquet", "arrow", "datasets")
COLUMNAR = ("parquet", "arrow", "datasets")  # read with pyarrow, records located by row index
_SUFFIXES = {".tsv": "tsv", ".txt": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json",
             ".parquet": "parquet", ".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow"}
_ARROW_FILE_MAGIC = b"ARROW1"
BATCH_ROWS = 1024  # rows per record batch read from a columnar file: the reader's memory bound

MISSING = object()  # `field`'s answer for a key a record does not have


class Row(int):
    """The 0-based row index of a record in a columnar file or a JSON list; an int that prints as "row N", so that
    "{path}:{line}: ..." messages (`DataError.at`) read "data.parquet:row 7: ..."."""

    def __str__(self) -> str:
        return f"row {int(self)}"

    __repr__ = __str__


def field(record: dict, name: str) -> Any:
    """record[name]; a dotted name absent as such walks nested objects ("labels.label" in KLUE's STS records).
    Returns `MISSING` when the record has no such field."""
    if name in record:
        return record[name]
    value: Any = record
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return MISSING
        value = value[part]
    return value


def _has_field(columns: Sequence[str], name: str) -> bool:
    return name in columns or name.split(".")[0] in columns and "." in name


# ---- formats ------------------------------------------------------------------------------------------------------
def table_format(path: str | os.PathLike, format: str | None = None) -> str:
    """The format of a table path: `format` when given (checked), else from the path: a `save_to_disk` directory
    (state.json or dataset_dict.json inside), a directory or glob of Parquet shards or Arrow files, or a file's suffix.
    ValueError naming the path when it says nothing."""
    if format is not None:
        if format not in TABLE_FORMATS:
            raise ValueError(f"unknown table format {format!r}; expected one of {list(TABLE_FORMATS)}")
        return format
    path = Path(path)
    if path.is_dir():
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            return "datasets"
        for fmt in ("parquet", "arrow"):
            if _shards(path, fmt):
                return fmt
        raise ValueError(f"{path}: a directory that is neither a datasets.save_to_disk directory nor a directory "
                         f"of .parquet or .arrow files")
    name = str(path)
    if glob.has_magic(name):
        name = next(iter(sorted(glob.glob(name, recursive=True))), name)
    suffix = Path(name).suffix.lower()
    if suffix not in _SUFFIXES:
        raise ValueError(f"cannot tell the format of {os.fspath(path)!r} from its name; pass --format (format= "
                         f"in Python): {', '.join(TABLE_FORMATS)}")
    return _SUFFIXES[suffix]


def table_or_own_format(path: str | os.PathLike, format: str | None, own: str,
                        own_formats: tuple[str, ...]) -> str | None:
    """The table format a task file is read in, or None for the task's own layout (`own`: "squad", "conll"):
    `format` when given (`own`: None); by path, `table_format`'s answer unless it is one of `own_formats` (the
    table formats whose files the task reads in its own layout) or the path says nothing."""
    if format is not None:
        return None if format == own else table_format(path, format)
    try:
        fmt = table_format(path)
    except ValueError:
        return None
    return None if fmt in own_formats else fmt


def _shards(directory: Path, fmt: str) -> list[Path]:
    suffixes = (".parquet",) if fmt == "parquet" else (".arrow", ".feather", ".ipc")
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.suffix.lower() in suffixes
                  and not any(part.startswith(".") for part in p.relative_to(directory).parts))


def columnar_files(path: str | os.PathLike, fmt: str) -> list[Path]:
    """The files of a columnar table in reading order: a file, a directory's shards (sorted), a glob's matches, or a
    `save_to_disk` directory's Arrow files in state.json's order. DataError for a DatasetDict directory (naming its
    splits) or a path with no such files."""
    path = Path(path)
    if fmt == "datasets":
        if (path / "dataset_dict.json").is_file() and not (path / "state.json").is_file():
            splits = sorted(p.name for p in path.iterdir() if (p / "state.json").is_file())
            raise DataError(f"{path}: a DatasetDict directory; name one of its splits, e.g. {path / splits[0]} "
                            f"(splits: {', '.join(splits)})" if splits else f"{path}: a DatasetDict directory "
                            "without splits")
        try:
            state = json.loads((path / "state.json").read_text(encoding="utf-8"))
            files = [path / entry["filename"] for entry in state["_data_files"]]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise DataError(f"{path}: not a datasets.save_to_disk directory (state.json: {err})") from None
    elif path.is_dir():
        files = _shards(path, fmt)
    elif glob.has_magic(str(path)):
        files = [Path(p) for p in sorted(glob.glob(str(path), recursive=True)) if Path(p).is_file()]
    else:
        files = [path]
    if not files:
        raise DataError(f"{path}: no {fmt} files there")
    for file in files:
        if not file.is_file():
            raise FileNotFoundError(f"{file}: no such {fmt} file")
    return files


# ---- one table ----------------------------------------------------------------------------------------------------
class Table:
    """One table on disk (see the module docstring): its columns, ClassLabel names, and its records streamed.

    path: the file, directory or glob; format: a TABLE_FORMATS name (None: from the path); records: for JSON, the
    key under which the records are (None: the file is a list of records).
    """

    def __init__(self, path: str | os.PathLike, format: str | None = None, records: str | None = None) -> None:
        self.path = Path(path)
        self.format = table_format(path, format)
        self.records = records
        if self.format not in COLUMNAR and not self.path.is_file():
            raise FileNotFoundError(f"{path}: no such file")
        self._files = columnar_files(path, self.format) if self.format in COLUMNAR else [self.path]
        self._schema = None
        self._features: dict | None = None

    # -- what the table holds --------------------------------------------------------------------------------------
    @property
    def files(self) -> list[Path]:
        return list(self._files)

    def schema(self):
        """The pyarrow schema of a columnar table (its first file's); None for the text formats."""
        if self.format not in COLUMNAR:
            return None
        if self._schema is None:
            reader = _open_columnar(self._files[0], self.format)
            self._schema = reader.schema_arrow if self.format == "parquet" else reader.schema
        return self._schema

    @property
    def columns(self) -> list[str] | None:
        """The column names where the file declares them (the header, the schema); None for JSON records."""
        if self.format in COLUMNAR:
            return list(self.schema().names)
        if self.format in ("tsv", "csv"):
            header = next(iter(self._delimited()), None)
            return [] if header is None else header[1]
        return None

    def num_rows(self) -> int | None:
        """How many rows a Parquet table has (its footers say); None for other formats."""
        if self.format != "parquet":
            return None
        return sum(_open_columnar(file, "parquet").metadata.num_rows for file in self._files)

    def require(self, *names: str | None) -> None:
        """DataError naming the columns the file has when one of `names` (None entries ignored) is not among them.
        Only where the file declares its columns; JSON records are checked row by row."""
        columns = self.columns
        if columns is None:
            return
        for name in names:
            if name is not None and not _has_field(columns, name):
                raise DataError(f"{self.path}: no column {name!r}; the file has columns {columns}")

    def features(self) -> dict:
        """The `datasets` features of a columnar table (dataset_info.json, else the ``huggingface`` schema
        metadata); {} where there are none."""
        if self._features is None:
            self._features = {}
            info = self.path / "dataset_info.json"
            if self.format == "datasets" and info.is_file():
                self._features = json.loads(info.read_text(encoding="utf-8")).get("features") or {}
            elif self.format in COLUMNAR:
                metadata = self.schema().metadata or {}
                raw = metadata.get(b"huggingface")
                if raw:
                    self._features = (json.loads(raw).get("info") or {}).get("features") or {}
        return self._features

    def class_names(self, column: str) -> list[str] | None:
        """The ClassLabel names of an integer column, or of the items of a list column (conll2003's ``ner_tags``);
        None when the column is no ClassLabel."""
        feature = self.features().get(column)
        while True:
            if isinstance(feature, list) and len(feature) == 1:  # datasets' older spelling of a list: [feature]
                feature = feature[0]
            elif isinstance(feature, dict) and feature.get("_type") in ("Sequence", "List", "LargeList"):
                feature = feature.get("feature")
            else:
                break
        if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" and feature.get("names"):
            return [str(name) for name in feature["names"]]
        return None

    # -- records ---------------------------------------------------------------------------------------------------
    def rows(self, columns: Iterable[str] | None = None) -> Iterator[tuple[int, dict]]:
        """(location, record) of every record in order. location: the 1-based line (TSV/CSV/JSONL) or a `Row`
        (0-based index: JSON, Parquet, Arrow, datasets). columns: read only these (columnar formats; the top-level
        part of a dotted name); every column when None. A TSV/CSV row of another width than the header's raises
        DataError at its line."""
        if self.format in ("tsv", "csv"):
            rows = self._delimited()
            first = next(rows, None)
            if first is None:
                return
            header = first[1]
            for line, values in rows:
                if len(values) != len(header):
                    raise DataError.at(self.path, line, f"expected {len(header)} fields, found {len(values)}")
                yield line, dict(zip(header, values))
        elif self.format == "jsonl":
            yield from _jsonl_records(self.path)
        elif self.format == "json":
            yield from self._json_records()
        else:
            wanted = None if columns is None else list(dict.fromkeys(c.split(".")[0] if c not in self.columns
                                                                      else c for c in columns))
            if wanted is not None:
                self.require(*wanted)
            index = 0
            for batch in self.batches(wanted):
                for record in batch.to_pylist():
                    yield Row(index), record
                    index += 1

    def batches(self, columns: list[str] | None = None, start: int = 0):
        """The pyarrow record batches of a columnar table from row `start` on (whole Parquet row groups before it
        are skipped unread), each at most BATCH_ROWS rows; DataError for a file pyarrow cannot read."""
        skip = start
        for file in self._files:
            reader = _open_columnar(file, self.format)
            try:
                if self.format == "parquet":
                    groups = list(range(reader.metadata.num_row_groups))
                    while groups and skip >= reader.metadata.row_group(groups[0]).num_rows:
                        skip -= reader.metadata.row_group(groups.pop(0)).num_rows  # leading groups, unread
                    if not groups:
                        continue
                    stream = reader.iter_batches(batch_size=BATCH_ROWS, row_groups=groups, columns=columns,
                                                 use_threads=False)
                else:
                    stream = _ipc_batches(reader, columns)
                for batch in stream:
                    if skip >= batch.num_rows:
                        skip -= batch.num_rows
                        continue
                    if skip:
                        batch, skip = batch.slice(skip), 0
                    for offset in range(0, batch.num_rows, BATCH_ROWS):
                        yield batch.slice(offset, BATCH_ROWS)
            except (OSError, pa.ArrowException) as err:
                raise DataError(f"{file}: pyarrow cannot read it as {self.format} ({_one_line(err)})") from None

    def _delimited(self) -> Iterator[tuple[int, list[str]]]:
        delimiter, quoting = (",", csv.QUOTE_MINIMAL) if self.format == "csv" else ("\t", csv.QUOTE_NONE)
        return delimited_rows(self.path, delimiter, quoting)

    def _json_records(self) -> Iterator[tuple[int, dict]]:
        text = _read_text(self.path)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            if err.msg == "Extra data":  # one object per line: a .json file that is JSON Lines
                yield from _jsonl_records(self.path)
                return
            raise DataError.at(self.path, err.lineno, f"invalid JSON: {err.msg} (column {err.colno})") from None
        if self.records is not None:
            if not isinstance(data, dict) or field(data, self.records) is MISSING:
                keys = sorted(data) if isinstance(data, dict) else type(data).__name__
                raise DataError(f"{self.path}: no key {self.records!r} holding the records (top level: {keys})")
            data = field(data, self.records)
        elif isinstance(data, dict):
            lists = sorted(k for k, v in data.items() if isinstance(v, list))
            raise DataError(f"{self.path}: a JSON object, not a list of records; name the key that holds them with "
                            f"--records (keys holding lists: {lists})")
        if not isinstance(data, list):
            raise DataError(f"{self.path}: the records must be a JSON list, not {type(data).__name__}")
        for index, record in enumerate(data):
            if not isinstance(record, dict):
                raise DataError.at(self.path, Row(index), f"expected a JSON object, got {type(record).__name__}")
            yield Row(index), record


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def _open_columnar(file: Path, fmt: str):
    """A pyarrow reader of one file: ParquetFile, or an IPC file/stream reader; DataError when pyarrow cannot."""
    try:
        if fmt == "parquet":
            # pre_buffer=False: pyarrow would otherwise read ahead the column chunks of every row group asked for,
            # which is the whole file (its memory grew with the file's size); this way it holds about one group
            return pa.parquet.ParquetFile(file, pre_buffer=False)
        with open(file, "rb") as handle:
            magic = handle.read(len(_ARROW_FILE_MAGIC))
        source = pa.memory_map(str(file), "r")
        return pa.ipc.open_file(source) if magic == _ARROW_FILE_MAGIC else pa.ipc.open_stream(source)
    except (OSError, pa.ArrowException) as err:
        raise DataError(f"{file}: pyarrow cannot read it as {'Parquet' if fmt == 'parquet' else 'Arrow IPC'} "
                        f"({_one_line(err)})") from None


def _ipc_batches(reader, columns: list[str] | None):
    if hasattr(reader, "num_record_batches"):  # the file format
        batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
    else:
        batches = iter(reader)
    for batch in batches:
        yield batch if columns is None else batch.select(columns)


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = path.read_bytes()[:err.start].count(b"\n") + 1
        raise DataError.at(path, line, "invalid UTF-8; save the file as UTF-8") from None


# ---- the text formats' rows ---------------------------------------------------------------------------------------
def delimited_rows(path: str | os.PathLike[str], delimiter: str, quoting: int) -> Iterator[tuple[int, list[str]]]:
    """(line where the row starts, fields) of every non-blank row of a CSV/TSV file (GLUE's readers use it too)."""
    # newline="" hands line endings to the csv module (required for quoted newlines in CSV, harmless in TSV);
    # utf-8-sig strips a byte-order mark that would otherwise stick to the first column name.
    with open(path, encoding="utf-8-sig", newline="") as f, _utf8_errors(path):
        reader = csv.reader(f, delimiter=delimiter, quoting=quoting)
        previous_end = 0
        while True:
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                raise DataError.at(path, reader.line_num, f"unreadable row: {e}") from e
            start, previous_end = previous_end + 1, reader.line_num
            if fields:  # csv gives [] for a blank line
                yield start, fields


def _jsonl_records(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict]]:
    with open(path, encoding="utf-8-sig") as f, _utf8_errors(path):
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError.at(path, line_no, f"invalid JSON: {e.msg}") from e
            if not isinstance(record, dict):
                raise DataError.at(path, line_no, f"expected a JSON object, got {type(record).__name__}")
            yield line_no, record


class _utf8_errors:
    """Around reading a text file: invalid UTF-8 raises DataError at its line instead of a UnicodeDecodeError."""

    def __init__(self, path) -> None:
        self.path = path

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if isinstance(err, UnicodeDecodeError):
            with open(self.path, "rb") as handle:
                for number, line in enumerate(handle, start=1):
                    try:
                        line.decode("utf-8")
                    except UnicodeDecodeError as bad:
                        raise DataError.at(self.path, number, f"invalid UTF-8 (byte 0x{line[bad.start]:02x} at "
                                                              f"byte {bad.start} of the line); save the file as "
                                                              f"UTF-8") from None
            raise DataError.at(self.path, None, f"invalid UTF-8 ({err.reason}); save the file as UTF-8") from None
        return False


# ---- cells --------------------------------------------------------------------------------------------------------
def text_cell(path, where: int, record: dict, column: str, what: str = "text", allow_empty: bool = True) -> str:
    """The string in `column` of a record; DataError naming the file, the row (line) and the column when it is
    missing, null or not a string (or empty with allow_empty=False)."""
    value = field(record, column)
    if value is MISSING:
        raise DataError.at(path, where, f"no {what} column {column!r}; the record has {sorted(record)}")
    if value is None:
        raise DataError.at(path, where, f"the {what} column {column!r} is null")
    if not isinstance(value, str):
        raise DataError.at(path, where, f"the {what} column {column!r} must be a string, got "
                                        f"{type(value).__name__}")
    if not allow_empty and not value.strip():  # a missing sentence: the model would see only special tokens
        raise DataError.at(path, where, f"empty {what} column {column!r}")
    return value


def column_texts(path: str | os.PathLike, column: str = "text", format: str | None = None,
                 records: str | None = None) -> list[str]:
    """The strings of one column of a table, in order (`bertkit features --input` on a table); DataError naming the
    file, the row and the column for a null or non-string cell, or the columns there are for a missing one."""
    table = Table(path, format, records)
    table.require(column)
    return [text_cell(path, where, record, column) for where, record in table.rows([column])]


def is_table_input(path: str | os.PathLike, format: str | None = None) -> bool:
    """Whether an --input file of `predict` / `features` is read as a table rather than as lines of text: a format
    given, or a path that names one other than the line formats (.txt, .tsv; JSON Lines keep their own reader)."""
    if format is not None:
        return True
    try:
        return table_format(path) not in ("tsv", "jsonl")
    except ValueError:
        return False
