"""NER: CoNLL reading, scheme conversion, first-sub-word alignment and entity-level metrics, pinned by hand."""

import re
import warnings

import pytest

from bertkit.errors import DataError
from bertkit.tasks.ner import (IGNORE_INDEX, TaggedSentence, align_labels, bio_to_iobes, decode_word_predictions,
                               iob1_to_bio, iobes_to_bio, ner_metrics, read_conll)

CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP I-ORG
rejects VBZ B-VP O
German JJ B-NP I-MISC
call NN I-NP O
. . O O

Peter NNP B-NP I-PER
Blackburn NNP I-NP I-PER


-DOCSTART- -X- -X- O
BRUSSELS NNP B-NP I-LOC
"""


def test_read_conll(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text(CONLL, encoding="utf-8")
    assert read_conll(path) == [
        TaggedSentence(["EU", "rejects", "German", "call", "."], ["I-ORG", "O", "I-MISC", "O", "O"], 3),
        TaggedSentence(["Peter", "Blackburn"], ["I-PER", "I-PER"], 9),
        TaggedSentence(["BRUSSELS"], ["I-LOC"], 14),
    ]
    # The chunk column instead of the NER column, by index.
    assert read_conll(path, tag_column=2)[1].tags == ["B-NP", "I-NP"]


def test_read_conll_malformed_lines_name_file_and_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("EU NNP B-NP B-ORG\nrejects\n", encoding="utf-8")
    with pytest.raises(DataError, match="^" + re.escape(f"{path}:2: ") + "expected a token and a tag"):
        read_conll(path)
    path.write_text("EU NNP B-NP B-ORG\n\nPeter NNP B-NP PERSON\n", encoding="utf-8")
    with pytest.raises(DataError, match="^" + re.escape(f"{path}:3: ") + "malformed tag 'PERSON'"):
        read_conll(path)


def test_iob1_to_bio():
    iob1 = ["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-LOC", "I-ORG"]
    assert iob1_to_bio(iob1) == ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC", "B-ORG"]


def test_bio_iobes_round_trip():
    bio = ["B-PER", "I-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC", "O", "B-ORG"]
    iobes = ["B-PER", "I-PER", "E-PER", "O", "S-LOC", "B-LOC", "E-LOC", "O", "S-ORG"]
    assert bio_to_iobes(bio) == iobes
    assert iobes_to_bio(iobes) == bio
    # An entity-initial I- (invalid BIO) is read as B-, as conlleval does.
    assert bio_to_iobes(["O", "I-MISC", "I-MISC", "I-PER"]) == ["O", "B-MISC", "E-MISC", "S-PER"]
    with pytest.raises(ValueError, match="not BIO"):
        bio_to_iobes(["S-PER"])


LABEL_TO_ID = {"O": 0, "B-PER": 1, "I-PER": 2}
# [CLS] Jim Hen ##son ##'s said [SEP] [PAD]  — word 1 ("Henson's") is three sub-words.
WORD_IDS = [None, 0, 1, 1, 1, 2, None, None]


def test_align_labels_first_sub_word_only():
    assert align_labels(WORD_IDS, ["B-PER", "I-PER", "O"], LABEL_TO_ID) == [
        IGNORE_INDEX, 1, 2, IGNORE_INDEX, IGNORE_INDEX, 0, IGNORE_INDEX, IGNORE_INDEX]
    assert IGNORE_INDEX == -100
    with pytest.raises(ValueError, match="'B-LOC' is not in label_to_id"):
        align_labels(WORD_IDS, ["B-LOC", "I-PER", "O"], LABEL_TO_ID)
    with pytest.raises(ValueError, match="word id 2 out of range"):
        align_labels(WORD_IDS, ["B-PER", "I-PER"], LABEL_TO_ID)


def test_decode_word_predictions_reads_first_sub_words():
    token_predictions = [9, 1, 2, 7, 7, 0, 9, 9]  # 7s on continuation sub-words and 9s on specials are ignored
    assert decode_word_predictions(WORD_IDS, token_predictions) == [1, 2, 0]
    # A fourth word lost to truncation gets the fill value.
    assert decode_word_predictions(WORD_IDS, token_predictions, num_words=4, fill="O") == [1, 2, 0, "O"]
    # align → decode is the identity on labelled words.
    labels = align_labels(WORD_IDS, ["B-PER", "I-PER", "O"], LABEL_TO_ID)
    assert decode_word_predictions(WORD_IDS, labels) == [1, 2, 0]


def test_ner_metrics_hand_computed():
    true = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O"]]
    # gold entities: PER, LOC, ORG; predicted: PER, ORG (wrong place), ORG; correct: PER, ORG → P = R = 2/3.
    m = ner_metrics(true, pred)
    assert m["precision"] == pytest.approx(2 / 3) and m["recall"] == pytest.approx(2 / 3)
    assert m["f1"] == pytest.approx(2 / 3)
    assert m["accuracy"] == pytest.approx(5 / 6)  # token level: only the last tag of sentence 1 differs
    assert m["per_type"]["PER"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1}
    assert m["per_type"]["LOC"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert m["per_type"]["ORG"]["precision"] == pytest.approx(1 / 2)
    assert m["per_type"]["ORG"]["recall"] == 1.0 and m["per_type"]["ORG"]["f1"] == pytest.approx(2 / 3)


def test_ner_metrics_default_is_lenient_strict_is_not():
    true = [["O", "B-PER", "I-PER"]]
    pred = [["O", "I-PER", "I-PER"]]  # conlleval reads the leading I-PER as the start of the same entity
    assert ner_metrics(true, pred)["f1"] == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ner_metrics(true, pred, scheme="BIO")["f1"] == 0.0  # strict: no valid predicted entity


def test_ner_metrics_strict_iobes():
    true = [["S-PER", "O", "B-LOC", "E-LOC"]]
    pred = [["S-PER", "O", "B-LOC", "I-LOC"]]  # LOC never closed with E-: not an entity in strict IOBES
    m = ner_metrics(true, pred, scheme="IOBES")
    assert (m["precision"], m["recall"]) == (1.0, 0.5) and m["f1"] == pytest.approx(2 / 3)


def test_ner_metrics_without_entities_is_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = ner_metrics([["O", "O"]], [["O", "O"]])
    assert m == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "accuracy": 1.0, "per_type": {}}


def test_ner_metrics_checks_lengths():
    with pytest.raises(ValueError, match="sentence 0: 2 gold tags for 1 predicted"):
        ner_metrics([["O", "O"]], [["O"]])
