"""Tests for bertkit.data.corpus: the three formats, gzip, bad lines, paths, sentence splitting, resumable reading."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertkit.data.corpus import (CorpusLines, CorpusStats, Document, Position, detect_format, expand_paths,
                                 iter_documents, iter_lines, iter_positioned_documents, split_sentences)
from bertkit.errors import DataError

WIKITEXT = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "wikitext-2" / "wiki.test.raw"


def sentences_of(docs: list[Document]) -> list[list[str]]:
    return [d.sentences for d in docs]


# ---- text --------------------------------------------------------------------------------------------------
def test_text_format_documents_lines_and_line_numbers(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(b"\n\nFirst sentence.\n  Second one.  \r\n\n \n\nOther doc.\nIts end. Not split.\n\n")
    docs = list(iter_documents(path))
    assert docs == [Document(str(path), 3, ["First sentence.", "Second one."]),
                    Document(str(path), 8, ["Other doc.", "Its end. Not split."])]


def test_text_format_can_split_sentences(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("A b. C d.\nE f!\n")
    assert sentences_of(list(iter_documents(path, split_sentences=True))) == [["A b.", "C d.", "E f!"]]


def test_unknown_extension_reads_as_text_and_format_overrides(tmp_path):
    path = tmp_path / "corpus.dat"
    path.write_text('{"text": "x"}\n')
    assert sentences_of(list(iter_documents(path))) == [['{"text": "x"}']]
    assert sentences_of(list(iter_documents(path, format="jsonl"))) == [["x"]]
    with pytest.raises(ValueError, match="unknown corpus format"):
        list(iter_documents(path, format="csv"))
    with pytest.raises(ValueError, match="on_bad_line"):
        list(iter_documents(path, on_bad_line="ignore"))


# ---- jsonl -------------------------------------------------------------------------------------------------
def test_jsonl_documents_are_split_into_sentences(tmp_path):
    path = tmp_path / "c.jsonl"
    lines = [json.dumps({"text": "One here. Two there!\n\nThree, in \"quotes.\" 4 is a digit.", "id": 7}), "",
             json.dumps({"text": "Single"})]
    path.write_text("\n".join(lines) + "\n")
    assert list(iter_documents(path)) == [
        Document(str(path), 1, ["One here.", "Two there!", "Three, in \"quotes.\"", "4 is a digit."]),
        Document(str(path), 3, ["Single"])]


@pytest.mark.parametrize("line, reason, message", [
    ("{not json", "invalid_json", "not valid JSON"),
    ('["text"]', "missing_text", 'string "text"'),
    ('{"title": "x"}', "missing_text", "no 'text' key"),
    ('{"text": 3}', "missing_text", "'text' is int"),
    ('{"text": " \\n "}', "empty_document", "empty"),
])
def test_jsonl_bad_lines_error_or_skip(tmp_path, line, reason, message):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"text": "Good."}) + "\n" + line + "\n" + json.dumps({"text": "Also good."}) + "\n")
    with pytest.raises(DataError, match=f"^{path}:2: .*{message}"):
        list(iter_documents(path))
    stats = CorpusStats()
    docs = list(iter_documents(path, on_bad_line="skip", stats=stats))
    assert sentences_of(docs) == [["Good."], ["Also good."]]
    assert stats.skipped == {reason: 1} and stats.documents == 2 and stats.sentences == 2


# ---- wikitext ----------------------------------------------------------------------------------------------
WIKI_SAMPLE = (
    " \n = Alpha Beta = \n \n Alpha is a thing . It has 1 @,@ 000 parts and a state @-@ of @-@ the @-@ art "
    "core of 0 @.@ 5 kg . \n \n = = History = = \n \n = = = Early = = = \n \n Built in 1900 . \n \n"
    " = Qualified for the next round \n \n = Gamma = \n \n Gamma is short . \n")


def test_wikitext_articles_headings_dropped_markers_joined(tmp_path):
    path = tmp_path / "wiki.valid.raw"
    path.write_text(WIKI_SAMPLE)
    assert detect_format(path) == "wikitext"
    assert list(iter_documents(path)) == [
        Document(str(path), 2, ["Alpha is a thing .", "It has 1,000 parts and a state-of-the-art core of 0.5 kg .",
                                "Built in 1900 .", "= Qualified for the next round"]),
        Document(str(path), 14, ["Gamma is short ."])]


def test_wikitext_prose_before_first_title_and_empty_article(tmp_path):
    path = tmp_path / "wiki.x.tokens"
    path.write_text(" Loose text . \n = Empty = \n \n = = Only a heading = = \n = Full = \n Body . \n")
    with pytest.raises(DataError, match=f"^{path}:2: the article 'Empty' has no text"):
        list(iter_documents(path))
    stats = CorpusStats()
    docs = list(iter_documents(path, on_bad_line="skip", stats=stats))
    assert [(d.line, d.sentences) for d in docs] == [(1, ["Loose text ."]), (5, ["Body ."])]
    assert stats.skipped == {"empty_document": 1}


@pytest.mark.skipif(not WIKITEXT.is_file(), reason="shared WikiText-2 data not present")
def test_real_wikitext_file():
    docs = list(iter_documents(WIKITEXT))
    assert len(docs) == 62  # 64 lines look like " = X = " titles, but two are table legends with one "="
    assert docs[0].line == 2
    assert docs[0].sentences[0] == "Robert Boulter is an English film , television and theatre actor ."
    assert all(d.sentences for d in docs)


# ---- gzip, bad bytes ---------------------------------------------------------------------------------------
def test_gzip_is_transparent(tmp_path):
    text = "One.\nTwo.\n\nThree.\n"
    (tmp_path / "a.txt").write_text(text)
    (tmp_path / "b.txt.gz").write_bytes(gzip.compress(text.encode()))
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(b'{"text": "One. Two."}\n'))
    plain = sentences_of(list(iter_documents(tmp_path / "a.txt")))
    assert sentences_of(list(iter_documents(tmp_path / "b.txt.gz"))) == plain == [["One.", "Two."], ["Three."]]
    assert detect_format(tmp_path / "c.jsonl.gz") == "jsonl"
    assert sentences_of(list(iter_documents(tmp_path / "c.jsonl.gz"))) == [["One.", "Two."]]


def test_truncated_gzip_names_the_file(tmp_path):
    path = tmp_path / "t.txt.gz"
    path.write_bytes(gzip.compress(("Some line.\n" * 2000).encode())[:-30])
    with pytest.raises(DataError, match=f"^{path}:\\d+: the gzip data is corrupt or truncated"):
        list(iter_documents(path))


def test_invalid_utf8_error_and_skip(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"Good one.\nBad \xff byte.\nStill doc one.\n\nDoc two.\n")
    gz = tmp_path / "bad.txt.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    for source in (path, gz):
        with pytest.raises(DataError, match=f"^{source}:2: invalid UTF-8 at byte 4"):
            list(iter_documents(source))
        stats = CorpusStats()
        docs = list(iter_documents(source, on_bad_line="skip", stats=stats))
        assert sentences_of(docs) == [["Good one.", "Still doc one."], ["Doc two."]]
        assert stats.skipped == {"invalid_utf8": 1}
        assert stats.summary() == "skipped 1 lines (1 invalid UTF-8)"
    with pytest.raises(DataError, match=f"^{path}:2: invalid UTF-8"):
        list(iter_lines([path]))


# ---- paths -------------------------------------------------------------------------------------------------
def test_expand_paths_directories_globs_and_errors(tmp_path):
    for name in ("b/2.txt", "b/1.jsonl.gz", "a.txt", "b/.hidden.txt", ".git/x.txt", "notes.md", "b/wiki.t.raw"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x\n")
    found = [p.relative_to(tmp_path).as_posix() for p in expand_paths(tmp_path)]
    assert found == ["a.txt", "b/1.jsonl.gz", "b/2.txt", "b/wiki.t.raw"]
    globbed = expand_paths([str(tmp_path / "b" / "*.txt"), tmp_path / "a.txt", str(tmp_path / "**" / "*.txt")])
    assert [p.relative_to(tmp_path).as_posix() for p in globbed] == ["b/2.txt", "a.txt"]  # duplicates dropped
    assert expand_paths(tmp_path / "notes.md") == [tmp_path / "notes.md"]  # an explicit file is always taken
    with pytest.raises(FileNotFoundError, match=r"no corpus files match the pattern '.*\*\.csv'"):
        expand_paths([str(tmp_path / "*.csv")])
    with pytest.raises(FileNotFoundError, match="missing.txt: no such corpus file"):
        expand_paths([tmp_path / "missing.txt"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no corpus files"):
        expand_paths(tmp_path / "empty")
    with pytest.raises(ValueError, match="no input paths"):
        expand_paths([])


def test_iter_lines_and_empty_corpus(tmp_path):
    (tmp_path / "a.txt").write_text("One.\nTwo.\n\nThree.\n")
    (tmp_path / "e.txt").write_text("\n \n\n")
    assert list(iter_lines([tmp_path / "a.txt"])) == ["One.", "Two.", "Three."]
    with pytest.raises(ValueError, match=r"corpus .*e\.txt.* is empty"):
        list(iter_lines([tmp_path / "e.txt"]))


def test_tokenizer_trains_from_corpus_files(tmp_path):
    from bertkit.tokenizers import WordPieceTokenizer

    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"text": f"The cat number {i} sat. It purred."})
                                                for i in range(20)) + "\n")
    tokenizer = WordPieceTokenizer.train(iter_lines([tmp_path / "a.jsonl"]), vocab_size=120, show_progress=False)
    assert "cat" in tokenizer.get_vocab()


# ---- sentence splitting ------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("It rained. Then it stopped! Mr. Smith left at 5. 3 dogs barked.",
     ["It rained.", "Then it stopped!", "Mr. Smith left at 5.", "3 dogs barked."]),
    ('He said "Go." Then (it ended.) "Next?" Yes.', ['He said "Go."', "Then (it ended.)", '"Next?"', "Yes."]),
    ("J. R. R. Tolkien wrote e.g. Books. Done", ["J. R. R. Tolkien wrote e.g. Books.", "Done"]),
    ("pi is 3.14 and e.g. not. lower case follows. Ünïcode Upper.", ["pi is 3.14 and e.g. not. lower case follows.",
                                                                  "Ünïcode Upper."]),
    ("Wait... What? Fine", ["Wait...", "What?", "Fine"]),
    ("  ", []),
])
def test_split_sentences_examples(text, expected):
    assert split_sentences(text) == expected


_word = st.text(alphabet="abcdefghijklmnopqrstuvwxyzé", min_size=3, max_size=8)
_sentence = st.builds(lambda first, rest, end: " ".join([first.capitalize(), *rest]) + end,
                      _word, st.lists(_word, max_size=6), st.sampled_from([".", "!", "?", ".\"", "!)"]))


@settings(max_examples=60, deadline=None)
@given(st.lists(_sentence, min_size=1, max_size=6), st.sampled_from([" ", "  ", "\t", " \u00a0"]))
def test_split_sentences_recovers_joined_sentences(sentences, gap):
    assert split_sentences(gap.join(sentences)) == sentences


_line = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\x0b\x0c\x1c\x1d"
                                       "\x1e\x85\u2028\u2029"), min_size=1, max_size=12).map(str.strip).filter(bool)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(_line, min_size=1, max_size=4), min_size=1, max_size=5), st.integers(1, 3))
def test_text_format_round_trip(tmp_path_factory, documents, blanks):
    path = tmp_path_factory.mktemp("rt") / "c.txt"
    path.write_text(("\n" * (blanks + 1)).join("\n".join(doc) for doc in documents) + "\n", encoding="utf-8")
    assert sentences_of(list(iter_documents(path))) == documents


# ---- resumable reading ---------------------------------------------------------------------------------------
def test_reading_resumes_from_every_position(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"A one.\nA two.\n\n\nB one.\n\xff\n\nC.\n")
    (tmp_path / "wiki.b.raw").write_text(WIKI_SAMPLE)
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(b'{"text": "X. Y."}\n{"text": ""}\n{"text": "Z."}\n'))
    files = expand_paths(tmp_path)
    stats = CorpusStats()
    full = list(iter_positioned_documents(files, on_bad_line="skip", stats=stats))
    assert len(full) == 3 + 2 + 2 and stats.skipped == {"invalid_utf8": 1, "empty_document": 1}
    for k, (_, position) in enumerate(full):
        rest = list(iter_positioned_documents(files, on_bad_line="skip", start=position))
        assert rest == full[k + 1:]
        assert [p.to_dict() for _, p in rest] == [p.to_dict() for _, p in full[k + 1:]]
        assert Position.from_dict(position.to_dict()) == position and position.line > 0


# ---- Parquet and Arrow --------------------------------------------------------------------------------------------
def test_parquet_and_arrow_rows_are_documents_as_in_the_text_format(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    docs = [["First line.", "Second  line."], ["Alone."], ["x", "y", "z"]]
    text = tmp_path / "c.txt"
    text.write_text("\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8")
    # Lines keep their inner spaces and lose outer ones, blank lines inside a row are dropped, as in the text format.
    rows = ["First line.\n  Second  line.  ", "Alone.\n\n", "x\ny\r\nz"]
    pq.write_table(pa.table({"text": rows}), tmp_path / "c.parquet")
    with pa.ipc.new_stream(tmp_path / "c.arrow", pa.schema([("text", pa.string())])) as writer:
        writer.write_table(pa.table({"text": rows}), max_chunksize=1)
    want = [d.sentences for d in iter_documents(text)]
    assert want == docs
    for path in (tmp_path / "c.parquet", tmp_path / "c.arrow"):
        got = list(iter_documents(path))
        assert [d.sentences for d in got] == want and [d.line for d in got] == [0, 1, 2]
    assert list(CorpusLines(tmp_path / "c.parquet")) == list(CorpusLines(text)) == [s for d in docs for s in d]
    # --format parquet reads a file whatever its name says
    (tmp_path / "renamed.bin").write_bytes((tmp_path / "c.parquet").read_bytes())
    assert [d.sentences for d in iter_documents(tmp_path / "renamed.bin", format="parquet")] == want


def test_document_column_groups_consecutive_rows_and_bad_rows_are_counted(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "lines.parquet"
    pq.write_table(pa.table({"t": ["a", "b", None, "c", "", "d"], "doc": ["x", "x", "y", "y", "z", "x"]}), path)
    stats = CorpusStats()
    got = list(iter_documents(path, text_column="t", document_column="doc", on_bad_line="skip", stats=stats))
    # "x" returns after "z": a new document (only consecutive rows group); "z" has no text.
    assert [(d.sentences, d.line) for d in got] == [(["a", "b"], 0), (["c"], 2), (["d"], 5)]
    assert stats.skipped == {"missing_text": 1, "empty_document": 1} and stats.documents == 3
    with pytest.raises(DataError, match=r"lines.parquet:row 2: the column 't' is null$"):
        list(iter_documents(path, text_column="t", document_column="doc"))
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"t": ["a", "", "b"], "doc": [1, 2, 3]}), empty)
    with pytest.raises(DataError, match=r"empty.parquet:row 1: the document 2 is empty \(column 't'\)$"):
        list(iter_documents(empty, text_column="t", document_column="doc"))
    with pytest.raises(DataError, match=r"empty.parquet:row 1: the row's text is empty \(column 't'\)$"):
        list(iter_documents(empty, text_column="t"))
    with pytest.raises(DataError, match=r"no column 'text'; the file has columns \['t', 'doc'\]"):
        list(iter_documents(path))


def test_a_datasets_directory_reads_as_its_arrow_files_and_a_dataset_dict_names_its_splits(tmp_path):
    datasets = pytest.importorskip("datasets", reason="datasets (the test extra) writes the save_to_disk fixture")
    ds = datasets.Dataset.from_dict({"text": ["a b\nc", "d", "e"]})
    ds.save_to_disk(str(tmp_path / "saved"), num_shards=2)
    assert [p.name for p in expand_paths(tmp_path / "saved")] == ["data-00000-of-00002.arrow",
                                                                  "data-00001-of-00002.arrow"]
    assert [d.sentences for d in iter_documents(tmp_path / "saved")] == [["a b", "c"], ["d"], ["e"]]
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError, match=r"dd: a DatasetDict directory; name one of its splits, e.g. .*dd/test "
                                        r"\(splits: test, train\)"):
        expand_paths(tmp_path / "dd")
    assert len(list(iter_documents(tmp_path / "dd" / "train"))) == 3
    # Inside a plain directory, a save_to_disk directory contributes its data files only (no state.json), and a
    # DatasetDict is refused as above.
    with pytest.raises(DataError, match=r"dd: a DatasetDict directory; name one of its splits"):
        expand_paths(tmp_path)
    (tmp_path / "dd" / "dataset_dict.json").unlink()  # two save_to_disk directories in a plain one
    assert [p.relative_to(tmp_path).as_posix() for p in expand_paths(tmp_path)] == [
        "dd/test/data-00000-of-00001.arrow", "dd/train/data-00000-of-00001.arrow",
        "saved/data-00000-of-00002.arrow", "saved/data-00001-of-00002.arrow"]


def test_a_parquet_corpus_streams_in_record_batches(tmp_path):
    """Reading holds about one row group, never the file: pyarrow's allocations while iterating do not grow with
    the file (measured peaks: 1.37 MB for 30,000 rows of 5,000-row groups, 1.41 MB for 120,000; with pyarrow's
    default read-ahead they were 2.0 and 3.8 MB, growing with the file)."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    peaks = []
    for rows in (30_000, 120_000):
        path = tmp_path / f"{rows}.parquet"
        pq.write_table(pa.table({"text": [f"document {i} " + "word " * 20 for i in range(rows)]}), path,
                       row_group_size=5000)
        base, peak, count = pa.total_allocated_bytes(), 0, 0
        for _ in iter_documents(path):
            count += 1
            if count % 500 == 0:
                peak = max(peak, pa.total_allocated_bytes() - base)
        assert count == rows
        peaks.append(peak)
    assert 0 < peaks[1] < 1.15 * peaks[0], peaks  # four times the rows, about the same memory
