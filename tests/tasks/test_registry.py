"""The task registry (one file per family, one line per kind), task files that import no torch, and the pure pieces
the families frame with: SQuAD windows in RoBERTa's framing and Google's answer-text recovery for WordPiece."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bertkit.models.modeldir import HEAD_SUFFIXES, architecture_role
from bertkit.tasks import KINDS, TASK_MODULES, TaskFamily, family_for, register
from bertkit.tasks.base import kind_of_architectures, prediction_kind
from bertkit.tasks.squad_windows import (basic_tokenize, get_final_text, google_answer_text, make_windows,
                                         whitespace_words)


def test_every_kind_finds_its_family_in_its_own_file():
    assert KINDS == ("glue", "classify", "ner", "squad", "swag", "embed", "rerank")
    expected = {"glue": "GlueFamily", "classify": "ClassificationFamily", "ner": "TaggingFamily",
                "squad": "SquadFamily", "swag": "SwagFamily", "embed": "EmbedFamily", "rerank": "RerankFamily"}
    for kind in KINDS:
        family = family_for(kind)
        assert issubclass(family, TaskFamily) and family.__name__ == expected[kind]
        assert family.__module__ == TASK_MODULES[kind] and kind in family.kinds
    assert {family_for(k).model_class_name for k in KINDS} == {
        "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering",
        "BertForMultipleChoice", "SentenceEncoder"}
    with pytest.raises(ValueError, match="unknown task kind 'pos'; choose one of glue, classify, ner, squad, swag, "
                                         "embed, rerank"):
        family_for("pos")


# The kinds whose family matches an architecture, by the architecture's suffix (the rest match none).
MATCHING_KINDS = {"ForSequenceClassification": {"glue", "classify", "rerank"}, "ForTokenClassification": {"ner"},
                  "ForQuestionAnswering": {"squad"}, "ForMultipleChoice": {"swag"}}


def test_families_and_model_directories_share_one_suffix_matcher():
    for kind in KINDS:  # the family's model class is a head of the family's role (an embedding model is bare)
        family = family_for(kind)
        assert architecture_role(family.model_class_name) == (None if kind == "embed" else family.model_role)
    for prefix in ("Bert", "Roberta", "Albert", "Electra", "DistilBert", "ModernBert", "XLNet", "T5"):
        assert architecture_role(f"{prefix}Model") is None
        assert not any(family_for(k).matches_architecture(f"{prefix}Model") for k in KINDS)
        for suffix, role in HEAD_SUFFIXES:
            for name in (prefix + suffix, prefix + suffix + "Simple"):  # XLNet's span model ends in Simple
                assert architecture_role(name) == role, name
                assert {k for k in KINDS if family_for(k).matches_architecture(name)} == \
                    MATCHING_KINDS.get(suffix, set()), name
    assert kind_of_architectures(["XLNetForQuestionAnsweringSimple"]) == "squad"


def test_register_refuses_a_kind_without_its_registry_line():
    with pytest.raises(ValueError, match=r"'pos' is not in TASK_MODULES .*add the line 'pos': "):
        @register("pos")
        class PosFamily(TaskFamily):
            pass
    with pytest.raises(ValueError, match="unknown task kind 'pos'"):
        family_for("pos")  # nothing was registered


def test_architectures_of_any_family_name_the_prediction_kind():
    assert kind_of_architectures(["BertForSequenceClassification"]) == "classify"  # glue models predict as classify
    assert kind_of_architectures(["RobertaForTokenClassification"]) == "ner"
    assert kind_of_architectures(["RobertaForQuestionAnswering"]) == "squad"
    assert kind_of_architectures(["ElectraForMultipleChoice"]) == "swag"
    assert kind_of_architectures(["BertForPreTraining"]) is None and kind_of_architectures([]) is None
    assert prediction_kind("glue") == "classify" and prediction_kind("ner") == "ner"
    # a reranker is a one-output sequence classifier: told apart by its finetune.json, not its architecture
    assert prediction_kind("rerank") == "rerank" and prediction_kind("embed") == "embed"


@pytest.mark.parametrize("module", ["bertkit.tasks", *sorted(set(TASK_MODULES.values())), "bertkit.tasks.base",
                                    "bertkit.tasks.metrics"])
def test_task_files_import_without_torch(module):
    code = f"import {module}, sys; assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_families_take_logits_as_numpy_and_never_import_torch():
    code = ("import sys, numpy as np\n"
            "from bertkit.tasks import family_for\n"
            "class C: kind, task, seq_length, regression, pair_column = 'classify', None, 16, False, None\n"
            "f = family_for('classify')(C())\n"
            "f.labels = ['neg', 'pos']\n"
            "m, out = f.evaluate(None, [{'label': 1}, {'label': 0}], [np.array([0., 2.]), np.array([1., 0.])])\n"
            "assert m['accuracy'] == 1.0 and out.shape == (2, 2)\n"
            "assert 'torch' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------------------------------------------------------
# SQuAD windows framed as RoBERTa frames a pair
# ------------------------------------------------------------------------------------------------------------------
def test_windows_in_robertas_pair_framing():
    context = "aa bb cc dd ee ff"
    ids = [10, 11, 12, 13, 14, 15]
    offsets = [(0, 2), (3, 5), (6, 8), (9, 11), (12, 14), (15, 17)]
    windows = make_windows([5, 6], ids, offsets, qid="q", context=context, cls_id=0, sep_id=2, pad_id=1,
                           max_seq_length=10, doc_stride=2, answer=("dd", 9), pad_to_max_length=False,
                           pair_separators=2, pair_type_id=0)
    # <s> q </s></s> passage </s>: 10 - 2 question tokens - 4 specials leaves 4 passage tokens per window.
    assert [w.input_ids for w in windows] == [[0, 5, 6, 2, 2, 10, 11, 12, 13, 2], [0, 5, 6, 2, 2, 12, 13, 14, 15, 2]]
    assert all(w.token_type_ids == [0] * 10 for w in windows)
    assert windows[0].offsets[:5] == [None] * 5 and windows[0].offsets[5] == (0, 2) and windows[0].offsets[-1] is None
    assert [(w.start_position, w.end_position) for w in windows] == [(8, 8), (6, 6)]
    bert = make_windows([5, 6], ids, offsets, qid="q", context=context, cls_id=101, sep_id=102, max_seq_length=10,
                        doc_stride=2, pad_to_max_length=False)
    assert bert[0].input_ids == [101, 5, 6, 102, 10, 11, 12, 13, 14, 102]
    assert bert[0].token_type_ids == [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]


# ------------------------------------------------------------------------------------------------------------------
# Google's get_final_text (WordPiece answer text)
# ------------------------------------------------------------------------------------------------------------------
def test_basic_tokenize_is_berts_basic_tokenizer():
    assert basic_tokenize("Héllo, World!  (1990)") == ["hello", ",", "world", "!", "(", "1990", ")"]
    assert basic_tokenize("Héllo, 中文", lowercase=False) == ["Héllo", ",", "中", "文"]
    assert basic_tokenize("a$b") == ["a", "$", "b"]  # ASCII symbols count as punctuation, as in BERT


def test_get_final_text_projects_the_pieces_onto_the_original_words():
    assert get_final_text("1990", "(1990)") == "1990"
    assert get_final_text("steve smith", "Steve Smith's") == "Steve Smith"
    assert get_final_text("hello", "Héllo!") == "Héllo"  # accents and case come back from the original
    assert get_final_text("[UNK]", "☃ snow") == "☃ snow"  # not found: the whole words
    assert get_final_text("ab", "a b") == "a b"  # spaces do not count in the alignment


def test_google_answer_text_joins_whitespace_words_with_single_spaces():
    context = "He lived in  New\n York (USA)."
    words, char_to_word = whitespace_words(context)
    assert words == ["He", "lived", "in", "New", "York", "(USA)."]
    assert char_to_word[context.index("York")] == 4 and char_to_word[context.index(" ")] == 0
    vocab = {1: "new", 2: "york", 3: "usa", 4: "##a"}
    starts = {1: context.index("New"), 2: context.index("York"), 3: context.index("USA")}

    class Window:  # what google_answer_text reads of a SquadWindow
        def __init__(self, ids):
            self.context, self.input_ids = context, ids
            self.offsets = [(starts[i], starts[i] + 3) for i in ids]

    text = google_answer_text(vocab.__getitem__)
    assert text(Window([1, 2]), 0, 1) == "New York"  # the newline and double space become one space
    assert text(Window([3]), 0, 0) == "USA"  # cut out of "(USA)." by the basic tokenizer's alignment
