"""BERT's `classifier_pooling: mean`: sequence classification from the mean of the real tokens' last hidden states,
the pooler left out; config.json carries the key only when it is not the paper's "cls"."""

from __future__ import annotations

import json

import pytest
import torch

from bertkit.config import BertConfig
from bertkit.models.heads import BertForSequenceClassification


def _config(pooling: str) -> BertConfig:
    return BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=32, classifier_pooling=pooling)


def test_mean_pooling_reads_the_mean_of_the_real_tokens():
    torch.manual_seed(0)
    model = BertForSequenceClassification(_config("mean"), num_labels=3).eval()
    ids = torch.randint(5, 50, (2, 7))
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    logits = model(ids, mask).logits
    hidden = model.bert(ids, mask).last_hidden_state
    expected = torch.stack([model.classifier(hidden[0].mean(0)), model.classifier(hidden[1, :4].mean(0))])
    torch.testing.assert_close(logits, expected)
    # Padding changes nothing: the second row alone, unpadded, gives the same logits.
    torch.testing.assert_close(model(ids[1:, :4], mask[1:, :4]).logits, logits[1:])
    cls = BertForSequenceClassification(_config("cls"), num_labels=3).eval()
    cls.load_state_dict(model.state_dict())
    assert not torch.allclose(cls(ids, mask).logits, logits)  # the paper's head reads the pooled [CLS] instead


def test_classifier_pooling_in_config_json(tmp_path):
    _config("mean").to_json_file(tmp_path / "mean.json")
    _config("cls").to_json_file(tmp_path / "cls.json")
    assert json.loads((tmp_path / "mean.json").read_text())["classifier_pooling"] == "mean"
    assert "classifier_pooling" not in json.loads((tmp_path / "cls.json").read_text())  # BERT's own config.json
    assert BertConfig.from_json_file(tmp_path / "mean.json").classifier_pooling == "mean"
    with pytest.raises(ValueError, match="classifier_pooling must be cls or mean"):
        _config("max")
