"""GLUE and generic table readers on tiny fixtures in each task's real file layout."""

import csv
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertkit.errors import DataError
from bertkit.tasks.glue import TASKS, Example, get_task, glue_path, read_glue, read_table
from conftest import SHARED_DATA

SAMPLE = SHARED_DATA / "glue"


def write(tmp_path: Path, name: str, lines: list[str], bom: bool = False) -> Path:
    path = tmp_path / name
    path.write_text(("\ufeff" if bom else "") + "".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def error_at(path: Path, line: int) -> str:
    return "^" + re.escape(f"{path}:{line}: ")


# ---------------------------------------------------------------------------------------------------------------
# One fixture per task, in the layout of the GLUE download.


def test_cola_headerless_with_stray_quote(tmp_path):
    path = write(tmp_path, "train.tsv", [
        "gj04\t1\t\tThe sailors rode the breeze clear of the rocks.",
        'cj99\t0\t*\tHe said "hi.',  # unbalanced quote: must stay literal, not swallow the next line
        "cj99\t1\t\tThe weights made the rope stretch.",
    ])
    assert read_glue("CoLA", path) == [
        Example("The sailors rode the breeze clear of the rocks.", None, "1", 1),
        Example('He said "hi.', None, "0", 2),
        Example("The weights made the rope stretch.", None, "1", 3),
    ]


def test_cola_test_file_has_header_and_no_labels(tmp_path):
    path = write(tmp_path, "test.tsv", ["index\tsentence", "0\tBill whistled past the house."])
    assert read_glue("cola", path) == [Example("Bill whistled past the house.", None, None, 2)]


def test_sst2_train_and_test(tmp_path):
    train = write(tmp_path, "train.tsv", ["sentence\tlabel", "hide new secretions \t0", "a charming journey \t1"])
    assert read_glue("SST-2", train) == [Example("hide new secretions ", None, "0", 2),
                                         Example("a charming journey ", None, "1", 3)]
    test = write(tmp_path, "test.tsv", ["index\tsentence", "0\tuneasy mishmash of styles"])
    assert read_glue("sst2", test) == [Example("uneasy mishmash of styles", None, None, 2)]


def test_mrpc_header_with_byte_order_mark(tmp_path):
    path = write(tmp_path, "train.tsv", [
        "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
        '1\t702876\t702977\tAmrozi accused his brother , whom he called " the witness " .\tReferring to him as '
        'only " the witness " , Amrozi accused his brother .',
        "0\t2108705\t2108831\tYucaipa owned Dominick 's .\tYucaipa bought Dominick 's in 1995 .",
    ], bom=True)
    examples = read_glue("MRPC", path)
    assert [e.label for e in examples] == ["1", "0"]
    assert examples[0].text.startswith("Amrozi") and examples[0].pair.endswith("his brother .")
    assert examples[1] == Example("Yucaipa owned Dominick 's .", "Yucaipa bought Dominick 's in 1995 .", "0", 3)


STSB_HEADER = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"


def test_stsb_regression_labels_are_floats(tmp_path):
    path = write(tmp_path, "dev.tsv", [
        STSB_HEADER,
        "0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\tA man with a hard hat is dancing.\t"
        "A man wearing a hard hat is dancing.\t5.000",
        "1\tmain-captions\tMSRvid\t2012test\t0002\tnone\tnone\tA young child is riding a horse.\t"
        "A child is riding a horse.\t4.750",
    ])
    examples = read_glue("STS-B", path)
    assert [e.label for e in examples] == [5.0, 4.75]
    assert examples[1].pair == "A child is riding a horse."
    bad = write(tmp_path, "bad.tsv", [STSB_HEADER, "0\tg\tf\ty\to\ts\ts\tA.\tB.\tfive"])
    with pytest.raises(DataError, match=error_at(bad, 2) + "label 'five' is not a number"):
        read_glue("stsb", bad)


QQP_HEADER = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"


def test_qqp_malformed_row_raises_or_is_skipped_with_warning(tmp_path):
    path = write(tmp_path, "train.tsv", [
        QQP_HEADER,
        "133273\t213221\t213222\tHow is the life of a math student?\tWhich level of prepration is enough?\t0",
        "\tWas Muhammad a real historical figure?\t0",  # the truncated row of the original QQP release
        "402555\t536040\t536041\tHow do I control my horny emotions?\tHow do you control your horniness?\t1",
    ])
    with pytest.raises(DataError, match=error_at(path, 3) + "expected 6 fields, found 3"):
        read_glue("QQP", path)
    with pytest.warns(UserWarning, match=re.escape(f"skipped 1 malformed row(s) of {path}; first: {path}:3: ")):
        examples = read_glue("QQP", path, skip_malformed=True)
    assert [(e.line, e.label) for e in examples] == [(2, "0"), (4, "1")]


MNLI_TRAIN = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
              "sentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label")
MNLI_DEV = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
            "sentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label")
MNLI_TEST = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
             "sentence2_parse\tsentence1\tsentence2")


def test_mnli_train_dev_test_layouts(tmp_path):
    parses = "\t".join(["( a )", "( b )", "(ROOT a)", "(ROOT b)"])
    train = write(tmp_path, "train.tsv", [MNLI_TRAIN, f"0\t31193\t31193n\tgovernment\t{parses}\tP1.\tH1.\tneutral"
                                                      "\tneutral"])
    dev = write(tmp_path, "dev_matched.tsv", [
        MNLI_DEV, f"0\t63735\t63735n\tslate\t{parses}\tP2.\tH2.\tneutral\tentailment\tneutral\tneutral\tneutral"
                  "\tneutral",
        f"1\t91383\t91383c\tslate\t{parses}\tP3.\tH3.\tcontradiction\tcontradiction\tcontradiction\tcontradiction"
        "\tcontradiction\tcontradiction"])
    test = write(tmp_path, "test_matched.tsv", [MNLI_TEST, f"0\t31493\t31493\ttravel\t{parses}\tP4.\tH4."])
    assert read_glue("MNLI", train) == [Example("P1.", "H1.", "neutral", 2)]
    assert read_glue("MNLI-m", dev) == [Example("P2.", "H2.", "neutral", 2), Example("P3.", "H3.", "contradiction", 3)]
    assert read_glue("MNLI-mm", test) == [Example("P4.", "H4.", None, 2)]


def test_qnli_rte_wnli(tmp_path):
    qnli = write(tmp_path, "qnli.tsv", ["index\tquestion\tsentence\tlabel",
                                        "0\tWhen did it start?\tIt started in 1990.\tentailment"])
    rte = write(tmp_path, "rte.tsv", ["index\tsentence1\tsentence2\tlabel",
                                      "0\tNo weapons were found.\tWeapons were found.\tnot_entailment"])
    wnli = write(tmp_path, "wnli.tsv", ["index\tsentence1\tsentence2\tlabel",
                                        "0\tI stuck a pin through a carrot.\tThe carrot had a hole.\t1"])
    assert read_glue("QNLI", qnli) == [Example("When did it start?", "It started in 1990.", "entailment", 2)]
    assert read_glue("RTE", rte) == [Example("No weapons were found.", "Weapons were found.", "not_entailment", 2)]
    assert read_glue("WNLI", wnli) == [Example("I stuck a pin through a carrot.", "The carrot had a hole.", "1", 2)]


def test_unknown_label_names_file_and_line(tmp_path):
    path = write(tmp_path, "dev.tsv", ["index\tsentence1\tsentence2\tlabel", "0\tA.\tB.\tentailment",
                                       "1\tC.\tD.\tmaybe"])
    with pytest.raises(DataError, match=error_at(path, 3) + "unknown label 'maybe'"):
        read_glue("rte", path)


def test_missing_column_in_header(tmp_path):
    path = write(tmp_path, "dev.tsv", ["index\tquestion\tlabel", "0\tWhy?\tentailment"])
    with pytest.raises(DataError, match=error_at(path, 1) + "no column 'sentence'"):
        read_glue("qnli", path)


def test_tasks_table():
    assert set(TASKS) == {"cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"}
    assert TASKS["mnli"].labels == ("contradiction", "entailment", "neutral") and TASKS["mnli"].num_labels == 3
    assert TASKS["stsb"].labels is None and TASKS["stsb"].num_labels == 1 and TASKS["stsb"].is_regression
    assert TASKS["qnli"].label_to_id == {"entailment": 0, "not_entailment": 1}
    assert TASKS["mrpc"].metrics == ("accuracy", "f1") and TASKS["cola"].metrics == ("mcc",)
    assert all(spec.num_labels == len(spec.labels or [0]) for spec in TASKS.values())
    assert glue_path("/glue", "MNLI-mm", "dev_mismatched") == Path("/glue/MNLI/dev_mismatched.tsv")
    assert glue_path("/glue", "SST-2", "train") == Path("/glue/SST-2/train.tsv")
    assert get_task("STS-B").dirname == "STS-B"
    with pytest.raises(ValueError, match="no split 'dev'"):
        glue_path("/glue", "mnli", "dev")


@pytest.mark.skipif(not SAMPLE.exists(), reason="shared GLUE sample data not present")
def test_shared_sample_files():
    cola = read_glue("cola", SAMPLE / "CoLA" / "in_domain_dev.tsv")
    assert len(cola) == 527 and cola[4] == Example("As you eat the most, you want the least.", None, "0", 5)
    sst = read_glue("sst2", SAMPLE / "SST-2" / "dev.tsv")
    assert len(sst) == 872 and sst[0].line == 2 and {e.label for e in sst} == {"0", "1"}


# ---------------------------------------------------------------------------------------------------------------
# Generic tables.


def test_read_table_csv_with_quotes_and_multiline_field(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text('review,stars\n"Good, really ""good""",5\n"two\nlines",1\nplain,3\n', encoding="utf-8")
    assert read_table(path, "review", label_column="stars") == [
        Example('Good, really "good"', None, "5", 2), Example("two\nlines", None, "1", 3),
        Example("plain", None, "3", 5)]


def test_read_table_jsonl_pairs_and_regression(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"a": "x", "b": "y", "score": 0.5}\n\n{"a": "z", "b": "w", "score": "2"}\n', encoding="utf-8")
    assert read_table(path, "a", "b", "score", regression=True) == [Example("x", "y", 0.5, 1),
                                                                    Example("z", "w", 2.0, 3)]
    ints = tmp_path / "ints.jsonl"
    ints.write_text('{"t": "x", "y": 1}\n{"t": "z", "y": 0}\n', encoding="utf-8")
    assert [e.label for e in read_table(ints, "t", label_column="y")] == ["1", "0"]
    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"t": "x", "y": 1}\n{"y": 0}\n', encoding="utf-8")
    with pytest.raises(DataError, match=error_at(missing, 2) + "no text column 't'; the record has \\['y'\\]"):
        read_table(missing, "t", label_column="y")


def test_read_table_errors(tmp_path):
    tsv = write(tmp_path, "x.tsv", ["text\tlabel", "a\tpos", "b\tneg\textra"])
    with pytest.raises(DataError, match=error_at(tsv, 3) + "expected 2 fields, found 3"):
        read_table(tsv, "text", label_column="label")
    with pytest.raises(DataError, match=error_at(tsv, 1) + "no column 'sentence'"):
        read_table(tsv, "sentence")
    ok = write(tmp_path, "y.tsv", ["text\tlabel", "a\tpos", "b\tneutral"])
    with pytest.raises(DataError, match=error_at(ok, 3) + "unknown label 'neutral'"):
        read_table(ok, "text", label_column="label", labels=["neg", "pos"])
    with pytest.raises(ValueError, match=r"pass --format \(format= in Python\)"):
        read_table(tmp_path / "x.xyz", "text")


# Field text for TSV: anything but what the format cannot represent (tab, CR, LF); quotes included.
_tsv_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\t\n\r"), max_size=12)
_rows = st.lists(st.tuples(_tsv_text, _tsv_text, st.sampled_from(["neg", "pos"])), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=_rows)
def test_tsv_round_trip(tmp_path, rows):
    # A row whose every field is empty is a blank line, which readers skip; give it a label so it never is.
    path = tmp_path / "round.tsv"
    path.write_bytes(("a\tb\ty\n" + "".join(f"{a}\t{b}\t{y}\n" for a, b, y in rows)).encode("utf-8"))
    examples = read_table(path, "a", "b", "y")
    assert [(e.text, e.pair, e.label) for e in examples] == rows
    assert [e.line for e in examples] == list(range(2, len(rows) + 2))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r"),
                                       max_size=12), st.sampled_from(["0", "1"])), min_size=1, max_size=6))
def test_csv_round_trip(tmp_path, rows):
    path = tmp_path / "round.csv"
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    assert [(e.text, e.label) for e in read_table(path, "text", label_column="label")] == rows


def test_jsonl_round_trip_of_unicode(tmp_path):
    rows = [{"text": "naïve \"quoted\"\ttab", "label": "pos"}, {"text": "", "label": "neg"}]
    path = tmp_path / "u.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert [(e.text, e.label) for e in read_table(path, "text", label_column="label")] == [
        (r["text"], r["label"]) for r in rows]
