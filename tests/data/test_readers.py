"""Tests for bertkit.data.readers: every table format gives the same records; ClassLabel names; one-line errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc
import pyarrow.parquet as pq
import pytest

from bertkit.data import readers
from bertkit.data.readers import Row, Table, field, table_format
from bertkit.errors import DataError

datasets = pytest.importorskip("datasets", reason="datasets (the test extra) writes the save_to_disk fixtures")

RECORDS = [{"text": "a b", "label": "pos", "n": 1}, {"text": "c\td", "label": "neg", "n": 2},
           {"text": "e, \"f\"", "label": "pos", "n": 3}]


def write_all(root: Path, records: list[dict]) -> dict[str, Path]:
    """The same records in every format: TSV, CSV, JSONL, JSON list, JSON under a key, Parquet (two row groups),
    Arrow file and stream format, a save_to_disk directory, a directory of Parquet shards."""
    root.mkdir(parents=True, exist_ok=True)
    names = list(records[0])
    paths = {}
    with open(root / "t.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(names)
        writer.writerows([[r[k] for k in names] for r in records])
    paths["csv"] = root / "t.csv"
    paths["jsonl"] = root / "t.jsonl"
    paths["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    paths["json"] = root / "t.json"
    paths["json"].write_text(json.dumps(records, indent=1), encoding="utf-8")
    paths["json-key"] = root / "keyed.json"
    paths["json-key"].write_text(json.dumps({"version": 1, "data": {"rows": records}}), encoding="utf-8")
    table = pa.Table.from_pylist(records)
    paths["parquet"] = root / "t.parquet"
    pq.write_table(table, paths["parquet"], row_group_size=2)
    paths["arrow-file"] = root / "file.arrow"
    with pa.ipc.new_file(paths["arrow-file"], table.schema) as writer:
        writer.write_table(table, max_chunksize=2)
    paths["arrow-stream"] = root / "stream.arrow"
    with pa.ipc.new_stream(paths["arrow-stream"], table.schema) as writer:
        writer.write_table(table, max_chunksize=1)
    paths["datasets"] = root / "saved"
    datasets.Dataset.from_list(records).save_to_disk(str(paths["datasets"]), num_shards=2)
    shards = root / "shards"
    shards.mkdir()
    pq.write_table(table.slice(0, 2), shards / "part-0.parquet")
    pq.write_table(table.slice(2), shards / "part-1.parquet")
    paths["shards"] = shards
    return paths


def records_of(path: Path, **options) -> list[dict]:
    return [{k: (int(v) if k == "n" else v) for k, v in record.items()} for _, record in Table(path, **options).rows()]


def test_every_format_reads_the_same_records(tmp_path):
    paths = write_all(tmp_path, RECORDS)
    for name, path in paths.items():
        options = {"records": "data.rows"} if name == "json-key" else {}
        assert records_of(path, **options) == RECORDS, name
    assert [table_format(paths[k]) for k in ("csv", "jsonl", "json", "parquet", "arrow-file", "datasets", "shards")] \
        == ["csv", "jsonl", "json", "parquet", "arrow", "datasets", "parquet"]
    assert table_format(tmp_path / "x.txt") == "tsv" and table_format(paths["csv"], "tsv") == "tsv"
    # Locations: lines for the text formats (the CSV header is line 1), 0-based rows for the rest.
    assert [w for w, _ in Table(paths["csv"]).rows()] == [2, 3, 4]
    rows = [w for w, _ in Table(paths["parquet"]).rows()]
    assert rows == [0, 1, 2] and all(isinstance(w, Row) for w in rows) and str(rows[2]) == "row 2"
    # Only the columns asked for are read.
    assert [r for _, r in Table(paths["datasets"]).rows(["n"])] == [{"n": 1}, {"n": 2}, {"n": 3}]


def test_a_json_file_of_json_lines_reads_as_json_lines(tmp_path):
    path = tmp_path / "lines.json"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
    assert records_of(path) == RECORDS
    assert [w for w, _ in Table(path).rows()] == [1, 2, 3]


def test_batches_start_at_any_row_skipping_whole_row_groups(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "BATCH_ROWS", 3)
    path = tmp_path / "n.parquet"
    pq.write_table(pa.table({"n": list(range(23))}), path, row_group_size=5)
    table = Table(path)
    for start in range(25):
        batches = list(table.batches(["n"], start=start))
        assert [n for b in batches for n in b.column(0).to_pylist()] == list(range(start, 23))
        assert all(b.num_rows <= 3 for b in batches)
    assert table.num_rows() == 23


def test_class_label_names_from_dataset_info_and_schema_metadata(tmp_path):
    features = datasets.Features({
        "tokens": datasets.Sequence(datasets.Value("string")),
        "ner_tags": datasets.Sequence(datasets.ClassLabel(names=["O", "B-PER", "I-PER"])),
        "label": datasets.ClassLabel(names=["neg", "pos"]), "text": datasets.Value("string")})
    ds = datasets.Dataset.from_dict({"tokens": [["a"]], "ner_tags": [[1]], "label": [1], "text": ["a"]},
                                    features=features)
    ds.save_to_disk(str(tmp_path / "saved"))
    ds.to_parquet(str(tmp_path / "t.parquet"))
    for path in (tmp_path / "saved", tmp_path / "t.parquet", tmp_path / "saved" / "data-00000-of-00001.arrow"):
        table = Table(path)
        assert table.class_names("label") == ["neg", "pos"]
        assert table.class_names("ner_tags") == ["O", "B-PER", "I-PER"]
        assert table.class_names("text") is None and table.class_names("tokens") is None
    # datasets' older spelling of a list feature: [feature]
    info = json.loads((tmp_path / "saved" / "dataset_info.json").read_text())
    info["features"]["ner_tags"] = [{"names": ["O", "B-X"], "_type": "ClassLabel"}]
    (tmp_path / "saved" / "dataset_info.json").write_text(json.dumps(info))
    assert Table(tmp_path / "saved").class_names("ner_tags") == ["O", "B-X"]


def test_dotted_names_reach_into_nested_records():
    record = {"labels": {"label": 3.2, "binary-label": 1}, "a.b": "literal"}
    assert field(record, "labels.label") == 3.2 and field(record, "a.b") == "literal"
    assert field(record, "labels.nope") is readers.MISSING and field(record, "x") is readers.MISSING


def test_errors_are_one_line_naming_what_is_there(tmp_path):
    paths = write_all(tmp_path, RECORDS)
    for name in ("parquet", "datasets", "csv"):
        with pytest.raises(DataError, match=r"no column 'sentence'; the file has columns \['text', 'label', 'n'\]"):
            Table(paths[name]).require("text", "sentence")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not parquet PAR1")
    with pytest.raises(DataError) as err:
        list(Table(bad).rows())
    assert str(err.value).startswith(f"{bad}: pyarrow cannot read it as Parquet (") and "\n" not in str(err.value)
    arrow = tmp_path / "bad.arrow"
    arrow.write_bytes(b"nonsense")
    with pytest.raises(DataError, match=r"bad.arrow: pyarrow cannot read it as Arrow IPC \("):
        Table(arrow).columns
    dd = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(RECORDS),
                          "validation": datasets.Dataset.from_list(RECORDS)}).save_to_disk(str(dd))
    with pytest.raises(DataError, match=r"a DatasetDict directory; name one of its splits, e.g. .*dd/train "
                                        r"\(splits: train, validation\)"):
        Table(dd)
    assert records_of(dd / "validation") == RECORDS
    with pytest.raises(DataError, match=r"keyed.json: a JSON object, not a list of records; name the key that holds "
                                        r"them with --records \(keys holding lists: \[\]\)"):
        list(Table(paths["json-key"]).rows())
    with pytest.raises(DataError, match=r"no key 'rows' holding the records \(top level: \['data', 'version'\]\)"):
        list(Table(paths["json-key"], records="rows").rows())
    with pytest.raises(ValueError, match=r"cannot tell the format of .*x.xyz.* pass --format"):
        Table(tmp_path / "x.xyz")
    with pytest.raises(ValueError, match="unknown table format 'xlsx'"):
        Table(paths["csv"], format="xlsx")


def test_column_texts_and_which_inputs_are_tables(tmp_path):
    paths = write_all(tmp_path, RECORDS)
    for name in ("parquet", "datasets", "json", "csv"):
        assert readers.column_texts(paths[name]) == [r["text"] for r in RECORDS], name
    pq.write_table(pa.table({"text": ["a", None]}), tmp_path / "null.parquet")
    with pytest.raises(DataError, match=r"null.parquet:row 1: the text column 'text' is null$"):
        readers.column_texts(tmp_path / "null.parquet")
    # Lines of text (.txt, .tsv) and JSON Lines keep their own readers; a format given makes any path a table.
    assert [readers.is_table_input(p) for p in ("a.txt", "a.tsv", "a.jsonl", "a.unknown")] == [False] * 4
    assert [readers.is_table_input(paths[k]) for k in ("parquet", "datasets", "json", "csv")] == [True] * 4
    assert readers.is_table_input("a.txt", "tsv")
