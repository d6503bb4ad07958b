"""Task models of every family against transformers' matching classes, both directions, on identical weights.

BERT and ALBERT classify sequences on the pooler; RoBERTa and ELECTRA have a dense head of their own on the first
token (`classifier.dense`, `classifier.out_proj`), which bertkit builds as `SentenceHead`; ELECTRA's multiple
choice summarises the first token (`sequence_summary.summary`) and DistilBERT's classifiers have a
`pre_classifier` (bertkit.models.heads.SENTENCE_HEADS).
"""

from __future__ import annotations

import json

import pytest
import torch

import bertkit.models
from bertkit.models.heads import SentenceHead
from test_family import batch, close, family_config, no_loading_problems, randomize

transformers = pytest.importorskip("transformers")

CASES = [
    ("bert", "BertForSequenceClassification", "BertForSequenceClassification"),
    ("roberta", "BertForSequenceClassification", "RobertaForSequenceClassification"),
    ("electra", "BertForSequenceClassification", "ElectraForSequenceClassification"),
    ("roberta", "BertForMultipleChoice", "RobertaForMultipleChoice"),
    ("roberta", "BertForTokenClassification", "RobertaForTokenClassification"),
    ("electra", "BertForQuestionAnswering", "ElectraForQuestionAnswering"),
    # the families without a pooler: their own heads (ELECTRA's sequence summary, DistilBERT's pre_classifier)
    ("electra", "BertForMultipleChoice", "ElectraForMultipleChoice"),
    ("distilbert", "BertForSequenceClassification", "DistilBertForSequenceClassification"),
    ("distilbert", "BertForMultipleChoice", "DistilBertForMultipleChoice"),
    ("distilbert", "BertForTokenClassification", "DistilBertForTokenClassification"),
    ("distilbert", "BertForQuestionAnswering", "DistilBertForQuestionAnswering"),
    ("albert", "BertForMultipleChoice", "AlbertForMultipleChoice"),
]


def their_logits(theirs, name, ids, mask, types):
    if "MultipleChoice" in name:  # (B, C, T): the batch's rows as two choices of one example... and of another
        ids, mask, types = (t[:2].unsqueeze(0) for t in (ids, mask, types))
    types = {} if "DistilBert" in name else {"token_type_ids": types}  # DistilBERT takes no token types
    out = theirs(input_ids=ids, attention_mask=mask, **types)
    if "Question" in name:
        return torch.stack([out.start_logits, out.end_logits], -1)
    return out.logits


def our_logits(ours, name, ids, mask, types):
    if "MultipleChoice" in name:
        ids, mask, types = (t[:2].unsqueeze(0) for t in (ids, mask, types))
    return ours(ids, mask, types).logits


def compare(ours, theirs, name, config):
    ids, mask, types, _ = batch(config)
    with torch.no_grad():
        a = our_logits(ours.eval(), name, ids, mask, types)
        b = their_logits(theirs.eval(), name, ids, mask, types)
    close(a, b, mask if b.shape[:2] == mask.shape else None)


@pytest.mark.parametrize("model_type, ours_name, theirs_name", CASES)
def test_bertkit_task_model_loads_in_transformers(model_type, ours_name, theirs_name, tmp_path):
    config = family_config(model_type)
    cls = getattr(bertkit.models, ours_name)
    kwargs = {} if "MultipleChoice" in ours_name or "Question" in ours_name else {"num_labels": 3}
    ours = randomize(cls(config, **kwargs), 21)
    ours.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [theirs_name]
    theirs, info = getattr(transformers, theirs_name).from_pretrained(str(tmp_path), output_loading_info=True)
    no_loading_problems(info)
    compare(ours, theirs, theirs_name, config)
    again = cls.from_pretrained(tmp_path)
    assert type(again) is cls
    compare(again, theirs, theirs_name, config)


@pytest.mark.parametrize("model_type, ours_name, theirs_name", CASES)
def test_transformers_task_model_loads_in_bertkit(model_type, ours_name, theirs_name, tmp_path):
    config = family_config(model_type)
    # transformers' own config class from the config.json bertkit writes for this family
    BertCls = getattr(bertkit.models, "BertModel")
    BertCls(config).save_pretrained(tmp_path / "encoder")
    hf_config = transformers.AutoConfig.from_pretrained(str(tmp_path / "encoder"))
    if "MultipleChoice" not in theirs_name and "Question" not in theirs_name:
        hf_config.num_labels = 3
    torch.manual_seed(0)
    theirs = randomize(getattr(transformers, theirs_name)(hf_config), 22)
    theirs.save_pretrained(str(tmp_path / "theirs"))
    ours = getattr(bertkit.models, ours_name).from_pretrained(tmp_path / "theirs")
    compare(ours, theirs, theirs_name, config)


@pytest.mark.parametrize("model_type, has_sentence_head", [("bert", False), ("albert", False), ("roberta", True),
                                                            ("electra", True), ("distilbert", False)])
def test_sequence_classifier_head_kind_follows_the_family(model_type, has_sentence_head):
    model = bertkit.models.BertForSequenceClassification(family_config(model_type), num_labels=2)
    assert isinstance(model.classifier, SentenceHead) is has_sentence_head
    assert (model.bert.pooler is None) is (has_sentence_head or model_type == "distilbert")


def test_electra_summary_settings_other_than_the_built_one_are_refused(tmp_path):
    """ElectraForMultipleChoice's summary follows config.json's summary_* keys; bertkit builds transformers'
    defaults (first token, a projection, gelu), so a config.json asking for another summary is refused by name."""
    from bertkit.config import BertConfig

    raw = {**family_config("electra").json_dict(), "summary_type": "first", "summary_use_proj": True,
           "summary_activation": "gelu", "summary_last_dropout": 0.3}
    assert BertConfig.from_dict(raw) == family_config("electra")
    for key, value in (("summary_type", "last"), ("summary_use_proj", False), ("summary_activation", "tanh")):
        with pytest.raises(ValueError, match=f"{key}={value!r} is not supported by bertkit"):
            BertConfig.from_dict({**raw, key: value}, source="config.json")


def test_roberta_regression_head_round_trips_through_transformers(tmp_path):
    config = family_config("roberta")
    ours = randomize(bertkit.models.BertForSequenceClassification(config, num_labels=1, regression=True), 23)
    ours.save_pretrained(tmp_path)
    theirs, info = transformers.RobertaForSequenceClassification.from_pretrained(str(tmp_path),
                                                                                 output_loading_info=True)
    no_loading_problems(info)
    assert theirs.config.problem_type == "regression"
    compare(ours, theirs, "RobertaForSequenceClassification", config)
    ids, mask, types, _ = batch(config)
    target = torch.tensor([0.5, -1.0, 2.0])
    with torch.no_grad():
        ours_loss = ours.eval()(ids, mask, types, labels=target).loss
        theirs_loss = theirs.eval()(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=target).loss
    torch.testing.assert_close(ours_loss, theirs_loss, atol=1e-5, rtol=0)


def test_roberta_classifier_fine_tunes_from_a_pretrained_masked_lm(tmp_path):
    """A RoBERTa MLM directory (no pooler, no classifier) starts the sentence head fresh, as transformers does."""
    config = family_config("roberta")
    randomize(bertkit.models.BertForMaskedLM(config), 24).save_pretrained(tmp_path / "mlm")
    ours = bertkit.models.BertForSequenceClassification.from_pretrained(tmp_path / "mlm", num_labels=2)
    theirs = transformers.RobertaModel.from_pretrained(str(tmp_path / "mlm"), add_pooling_layer=False).eval()
    ids, mask, types, _ = batch(config)
    with torch.no_grad():
        close(ours.eval().bert(ids, mask, types).last_hidden_state, theirs(input_ids=ids, attention_mask=mask).last_hidden_state,
              mask)
