"""Every task family reads tables (bertkit.data.readers): the Hub's layouts in Parquet and save_to_disk directories,
KLUE's and KorQuAD's JSON files as they are, each giving exactly what the family's own format gives."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertkit.errors import DataError
from bertkit.tasks.run import FinetuneConfig
from bertkit.tasks import family_for
from bertkit.tasks.classify import Example, read_table
from bertkit.tasks.embed import read_pairs
from bertkit.tasks.glue import read_glue
from bertkit.tasks.ner import read_conll, read_tagged_table
from bertkit.tasks.squad import read_squad, read_squad_with_stats
from bertkit.tasks.swag import read_swag

datasets = pytest.importorskip("datasets", reason="datasets (the test extra) writes the ClassLabel fixtures")

CONLL_TAGS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]  # conll2003's names


def conll_dataset(sentences: list[list[tuple[str, str]]]):
    """Sentences in conll2003's Hub layout: tokens, and ner_tags as integers named by a ClassLabel."""
    features = datasets.Features({"id": datasets.Value("string"),
                                  "tokens": datasets.Sequence(datasets.Value("string")),
                                  "ner_tags": datasets.Sequence(datasets.ClassLabel(names=CONLL_TAGS))})
    return datasets.Dataset.from_dict({"id": [str(i) for i in range(len(sentences))],
                                       "tokens": [[w for w, _ in s] for s in sentences],
                                       "ner_tags": [[CONLL_TAGS.index(t) for _, t in s] for s in sentences]},
                                      features=features)


SENTENCES = [[("John", "B-PER"), ("lives", "O"), ("in", "O"), ("New", "B-LOC"), ("York", "I-LOC")],
             [("EU", "B-ORG"), ("rejects", "O"), ("German", "B-MISC"), ("call", "O")]]


def test_ner_parquet_and_datasets_directory_with_class_label_tags_read_as_conll(tmp_path):
    (tmp_path / "s.conll").write_text("\n\n".join("\n".join(f"{w} {t}" for w, t in s) for s in SENTENCES) + "\n")
    ds = conll_dataset(SENTENCES)
    ds.to_parquet(str(tmp_path / "s.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    want = [(s.tokens, s.tags) for s in read_conll(tmp_path / "s.conll")]
    for path in (tmp_path / "s.parquet", tmp_path / "saved"):
        got = read_tagged_table(path)
        assert [(s.tokens, s.tags) for s in got] == want and [s.line for s in got] == [0, 1]
    family = family_for("ner")(FinetuneConfig(kind="ner"))
    assert family.read(tmp_path / "s.parquet", training=True) == family.read(tmp_path / "s.conll", training=True)
    # String tags under other column names, as JSON Lines
    lines = tmp_path / "s.jsonl"
    lines.write_text("".join(json.dumps({"words": [w for w, _ in s], "labels": [t for _, t in s]}) + "\n"
                             for s in SENTENCES))
    assert [(s.tokens, s.tags) for s in read_tagged_table(lines, "words", "labels")] == want


def test_ner_table_errors_name_the_file_the_row_and_the_column(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"tokens": [["a", "b"], ["c"]], "ner_tags": [[0, 1], [5]]}), path)
    with pytest.raises(DataError, match=r"t.parquet:row 0: integer tags in 'ner_tags' but the file names no "
                                        r"ClassLabel"):
        read_tagged_table(path)
    with pytest.raises(DataError, match=r"t.parquet: no column 'tags'; the file has columns \['tokens', 'ner_tags'\]"):
        read_tagged_table(path, tags_column="tags")
    pq.write_table(pa.table({"tokens": [["a", "b"], None], "ner_tags": [["O", "O"], ["O"]]}), path)
    with pytest.raises(DataError, match=r"t.parquet:row 1: the tokens column 'tokens' must be a list, got null"):
        read_tagged_table(path)
    pq.write_table(pa.table({"tokens": [["a", "b"]], "ner_tags": [["O"]]}), path)
    with pytest.raises(DataError, match=r"t.parquet:row 0: 2 tokens \('tokens'\) but 1 tags \('ner_tags'\)"):
        read_tagged_table(path)
    # A dev tag the training file never had names the labels there are.
    conll_dataset(SENTENCES[:1]).to_parquet(str(tmp_path / "train.parquet"))
    conll_dataset(SENTENCES[1:]).to_parquet(str(tmp_path / "dev.parquet"))
    family = family_for("ner")(FinetuneConfig(kind="ner"))
    family.read(tmp_path / "train.parquet", training=True)
    with pytest.raises(DataError, match=r"dev.parquet:row 0: unknown label 'B-ORG'; the training file has "
                                        r"\['O', 'B-LOC', 'I-LOC', 'B-PER', 'I-PER'\]"):
        family.read(tmp_path / "dev.parquet", training=False)


def test_klue_nli_and_sts_json_files_read_as_they_are(tmp_path):
    # KLUE's own files: a JSON list of records (klue-nli-v1.1_dev.json, klue-sts-v1.1_dev.json).
    nli = [{"guid": "klue-nli-v1_dev_00000", "source": "airbnb", "premise": "흡연자분들은 발코니가 있는 방이면 발코니에서 "
            "흡연이 가능합니다.", "hypothesis": "어떤 방에서도 흡연은 금지됩니다.", "gold_label": "contradiction",
            "author": "contradiction", "label2": "contradiction", "label3": "contradiction", "label4": "contradiction",
            "label5": "contradiction"},
           {"guid": "klue-nli-v1_dev_00001", "source": "airbnb", "premise": "10명이 함께 사용하기 불편함없이 만족했다.",
            "hypothesis": "10명이 함께 사용하기 불편했다.", "gold_label": "contradiction", "author": "contradiction"},
           {"guid": "klue-nli-v1_dev_00002", "source": "policy", "premise": "그렇지만 좋은 경관을 바라보며 걸을 수 있다.",
            "hypothesis": "경관이 좋다.", "gold_label": "entailment", "author": "entailment"}]
    (tmp_path / "klue-nli.json").write_text(json.dumps(nli, ensure_ascii=False, indent=4), encoding="utf-8")
    examples = read_table(tmp_path / "klue-nli.json", "premise", "hypothesis", "gold_label")
    assert examples == [Example(r["premise"], r["hypothesis"], r["gold_label"], i) for i, r in enumerate(nli)]
    assert str(examples[2].line) == "row 2"
    sts = [{"guid": "klue-sts-v1_dev_00000", "source": "airbnb-rtt", "sentence1": "무엇보다도 호스트분들이 너무 친절하셨습니다.",
            "sentence2": "무엇보다도, 호스트들은 매우 친절했습니다.",
            "labels": {"label": 4.9, "real-label": 4.857142857142857, "binary-label": 1}},
           {"guid": "klue-sts-v1_dev_00001", "source": "airbnb-sampled", "sentence1": "주요 관광지 모두 걸어서 이동가능합니다.",
            "sentence2": "위치는 피렌체 중심가까지 걸어서 이동 가능합니다.",
            "labels": {"label": 1.4, "real-label": 1.428571428571429, "binary-label": 0}}]
    (tmp_path / "klue-sts.json").write_text(json.dumps(sts, ensure_ascii=False), encoding="utf-8")
    scores = read_table(tmp_path / "klue-sts.json", "sentence1", "sentence2", "labels.label", regression=True)
    assert [(e.text, e.pair, e.label) for e in scores] == [(r["sentence1"], r["sentence2"], r["labels"]["label"])
                                                           for r in sts]
    binary = read_table(tmp_path / "klue-sts.json", "sentence1", "sentence2", "labels.binary-label")
    assert [e.label for e in binary] == ["1", "0"]
    # The same records under a key (--records)
    (tmp_path / "keyed.json").write_text(json.dumps({"data": sts}, ensure_ascii=False), encoding="utf-8")
    assert read_table(tmp_path / "keyed.json", "sentence1", "sentence2", "labels.label", regression=True,
                      records="data") == scores


def korquad_file(path: Path) -> Path:
    """KorQuAD 1.0's layout: SQuAD v1.1's ({"version", "data": [{"title", "paragraphs": [{"qas", "context"}]}]})."""
    context = "1989년 2월 15일 여의도 농민 폭력 시위를 주도한 혐의로 지명수배되었다."
    data = {"version": "KorQuAD_v1.0_dev", "data": [{"title": "임종석", "paragraphs": [{"qas": [
        {"answers": [{"text": "1989년 2월 15일", "answer_start": 0}], "id": "6548850-0-0",
         "question": "임종석이 여의도 농민 폭력 시위를 주도한 혐의로 지명수배 된 날은?"},
        {"answers": [{"text": "여의도", "answer_start": context.index("여의도")}], "id": "6548850-0-1",
         "question": "시위가 일어난 곳은?"}], "context": context}]}]}
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


def test_korquad_json_and_the_hubs_squad_tables_read_as_squad(tmp_path):
    korquad = korquad_file(tmp_path / "KorQuAD_v1.0_dev.json")
    examples, stats = read_squad_with_stats(korquad)
    assert [(e.id, e.answers, e.is_impossible, e.title) for e in examples] == [
        ("6548850-0-0", [("1989년 2월 15일", 0)], False, "임종석"), ("6548850-0-1", [("여의도", 13)], False, "임종석")]
    assert not stats.mismatches
    # The Hub's squad / squad_v2 layout: one row per question, answers a struct of two lists (v2: empty lists).
    rows = [{"id": e.id, "title": e.title, "context": e.context, "question": e.question,
             "answers": {"text": [t for t, _ in e.answers], "answer_start": [s for _, s in e.answers]}}
            for e in examples]
    rows.append({**rows[0], "id": "v2-none", "answers": {"text": [], "answer_start": []}})
    features = datasets.Features({"id": datasets.Value("string"), "title": datasets.Value("string"),
                                  "context": datasets.Value("string"), "question": datasets.Value("string"),
                                  "answers": datasets.Sequence({"text": datasets.Value("string"),
                                                                "answer_start": datasets.Value("int32")})})
    ds = datasets.Dataset.from_list(rows, features=features)
    ds.to_parquet(str(tmp_path / "squad.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    for path in (tmp_path / "squad.parquet", tmp_path / "saved"):
        got = read_squad(path)
        assert got[:2] == examples
        assert got[2].id == "v2-none" and got[2].is_impossible and got[2].answers == []
    squad = family_for("squad")(FinetuneConfig(kind="squad"))
    squad.read(tmp_path / "saved", training=True)
    assert squad.version_2
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in rows[0].items() if k != "answers"}]),
                   tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=r"bad.parquet: no column 'answers'; the file has columns "
                                        r"\['id', 'title', 'context', 'question'\]"):
        read_squad(tmp_path / "bad.parquet")


def test_swag_glue_and_embed_tables_read_as_their_own_files(tmp_path):
    header = ["video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source", "ending0", "ending1",
              "ending2", "ending3", "label"]
    values = [["v0", "7", "x", "Anna sits .", "She", "gold", "runs .", "eats .", "sings .", "sleeps .", 2],
              ["v1", "8", "x", "Carl stands .", "He", "gen", "walks .", "a, b .", "jumps .", "waits .", 0]]
    (tmp_path / "swag.csv").write_text("\n".join(",".join(f'"{v}"' if "," in str(v) else str(v) for v in row)
                                                for row in [header, *values]) + "\n")
    pq.write_table(pa.Table.from_pylist([dict(zip(header, row)) for row in values]), tmp_path / "swag.parquet")
    assert read_swag(tmp_path / "swag.parquet") == [
        type(e)(e.id, e.context, e.choices, e.label, i) for i, e in enumerate(read_swag(tmp_path / "swag.csv"))]
    # GLUE: the Hub's nyu-mll/glue columns, ClassLabel integers -> the TSV's labels (MNLI's names, SST-2's 0/1).
    mnli = datasets.Dataset.from_dict(
        {"premise": ["p0", "p1", "p2"], "hypothesis": ["h0", "h1", "h2"], "label": [0, 1, 2], "idx": [0, 1, 2]},
        features=datasets.Features({"premise": datasets.Value("string"), "hypothesis": datasets.Value("string"),
                                    "label": datasets.ClassLabel(names=["entailment", "neutral", "contradiction"]),
                                    "idx": datasets.Value("int32")}))
    mnli.to_parquet(str(tmp_path / "mnli.parquet"))
    assert [(e.text, e.pair, e.label) for e in read_glue("mnli", tmp_path / "mnli.parquet")] == [
        ("p0", "h0", "entailment"), ("p1", "h1", "neutral"), ("p2", "h2", "contradiction")]
    sst2 = datasets.Dataset.from_dict(
        {"sentence": ["bad", "good"], "label": [0, 1], "idx": [0, 1]},
        features=datasets.Features({"sentence": datasets.Value("string"), "idx": datasets.Value("int32"),
                                    "label": datasets.ClassLabel(names=["negative", "positive"])}))
    sst2.save_to_disk(str(tmp_path / "sst2"))
    (tmp_path / "sst2.tsv").write_text("sentence\tlabel\nbad\t0\ngood\t1\n")
    assert [(e.text, e.label) for e in read_glue("sst2", tmp_path / "sst2")] == \
        [(e.text, e.label) for e in read_glue("sst2", tmp_path / "sst2.tsv")] == [("bad", "0"), ("good", "1")]
    # embed: anchor / positive / negative columns, --negative-column
    (tmp_path / "pairs.tsv").write_text("q\tpos\thard\nwho\tanna\tcarl\nwhere\tparis\trome\n")
    pq.write_table(pa.table({"q": ["who", "where"], "pos": ["anna", "paris"], "hard": ["carl", "rome"]}),
                   tmp_path / "pairs.parquet")
    want = [(p.anchor, p.positive, p.negatives) for p in read_pairs(tmp_path / "pairs.tsv", "q", "pos", "hard")]
    assert [(p.anchor, p.positive, p.negatives) for p in read_pairs(tmp_path / "pairs.parquet", "q", "pos", "hard")] \
        == want == [("who", "anna", ("carl",)), ("where", "paris", ("rome",))]
    pq.write_table(pa.table({"q": ["who", "where"], "pos": ["anna", None]}), tmp_path / "null.parquet")
    with pytest.raises(DataError, match=r"null.parquet:row 1: the column 'pos' is null"):
        read_pairs(tmp_path / "null.parquet", "q", "pos")


def test_classify_table_errors_name_the_file_the_row_and_the_column(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": ["a", None], "label": ["x", "y"]}), path)
    with pytest.raises(DataError, match=r"t.parquet:row 1: the text column 'text' is null$"):
        read_table(path, "text", label_column="label")
    pq.write_table(pa.table({"text": ["a", "b"], "label": ["x", None]}), path)
    with pytest.raises(DataError, match=r"t.parquet:row 1: the label column 'label' is null$"):
        read_table(path, "text", label_column="label")
    pq.write_table(pa.table({"text": ["a", "b"], "label": [1.5, 2.5]}), path)
    with pytest.raises(DataError, match=r"t.parquet:row 0: label 1.5 must be a string or an integer"):
        read_table(path, "text", label_column="label")
    with pytest.raises(DataError, match=r"t.parquet: no column 'sentence'; the file has columns \['text', 'label'\]"):
        read_table(path, "sentence", label_column="label")
    pq.write_table(pa.table({"text": ["a", "b"], "label": ["x", "z"]}), path)
    with pytest.raises(DataError, match=r"t.parquet:row 1: unknown label 'z'; expected one of \['x', 'y'\]"):
        read_table(path, "text", label_column="label", labels=["x", "y"])
    records = tmp_path / "r.json"
    records.write_text(json.dumps([{"text": "a", "label": "x"}, {"txt": "b", "label": "x"}]))
    with pytest.raises(DataError, match=r"r.json:row 1: no text column 'text'; the record has \['label', 'txt'\]"):
        read_table(records, "text", label_column="label")


def test_predict_inputs_from_a_table(tmp_path):
    pq.write_table(pa.table({"sentence": ["a b", "c"], "other": ["x", "y"]}), tmp_path / "in.parquet")
    classify = family_for("classify")
    assert classify.inputs_from_table(tmp_path / "in.parquet", columns={"text": "sentence"}) == ["a b", "c"]
    assert classify.inputs_from_table(tmp_path / "in.parquet", columns={"text": "sentence", "pair": "other"}) == [
        ("a b", "x"), ("c", "y")]
    with pytest.raises(DataError, match=r"in.parquet: no column 'text'; the file has columns \['sentence', 'other'\]"):
        classify.inputs_from_table(tmp_path / "in.parquet")
    pq.write_table(pa.table({"question": ["q"], "context": [None]}), tmp_path / "qa.parquet")
    with pytest.raises(DataError, match=r"qa.parquet:row 0: field 'context' is missing"):
        family_for("squad").inputs_from_table(tmp_path / "qa.parquet")


def test_rerank_from_a_datasets_directory_reads_as_from_tsv(tmp_path):
    rows = {"query": ["who lives in paris", "who lives in paris", "capital of italy"],
            "document": ["anna lives in paris", "carl lives in rome", "rome is the capital"], "label": [1, 0, 2]}
    (tmp_path / "r.tsv").write_text("query\tdocument\tlabel\n" + "".join(
        f"{q}\t{d}\t{l}\n" for q, d, l in zip(*rows.values())))
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "saved"))
    family = family_for("rerank")
    from_tsv = family(FinetuneConfig(kind="rerank")).read(tmp_path / "r.tsv", training=True)
    from_saved = family(FinetuneConfig(kind="rerank")).read(tmp_path / "saved", training=True)
    assert [(e.text, e.pair, e.label) for e in from_saved] == [(e.text, e.pair, e.label) for e in from_tsv]
    assert [e.label for e in from_tsv] == [1.0, 0.0, 2.0]
