import json

import pytest

from bertkit import BertConfig
from bertkit.config import PRESETS

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_follow_the_paper(name):
    c = BertConfig.preset(name)
    layers, hidden = PRESETS[name]
    assert (c.num_hidden_layers, c.hidden_size) == (layers, hidden)
    assert c.num_attention_heads == hidden // 64 and c.intermediate_size == 4 * hidden


def test_base_preset_is_bert_base():
    assert BertConfig.preset("base") == BertConfig()
    assert BertConfig.preset("large").num_attention_heads == 16


def test_config_json_round_trips_through_transformers(tmp_path):
    c = BertConfig.preset("mini", vocab_size=1000, hidden_act="gelu_new", layer_norm_eps=1e-6)
    c.to_json_file(tmp_path / "config.json")
    hf = transformers.BertConfig.from_json_file(str(tmp_path / "config.json"))
    for field, value in c.to_dict().items():
        assert getattr(hf, field) == value, field
    hf.save_pretrained(tmp_path / "hf")
    assert BertConfig.from_json_file(tmp_path / "hf" / "config.json") == c


@pytest.mark.parametrize("bad, message", [
    (dict(hidden_size=100, num_attention_heads=3), "must divide"),
    (dict(hidden_dropout_prob=1.5), "hidden_dropout_prob"),
    (dict(hidden_act="tanh"), "hidden_act"),
    (dict(vocab_size=0), "vocab_size"),
])
def test_invalid_configs_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        BertConfig(**bad)


def test_unknown_and_unsupported_keys(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 2, "hiden_layers": 3}))
    with pytest.raises(ValueError, match=r"config.json: unknown config keys \['hiden_layers'\]"):
        BertConfig.from_json_file(path)
    path.write_text(json.dumps({"position_embedding_type": "relative_key"}))
    with pytest.raises(ValueError, match="relative_key"):
        BertConfig.from_json_file(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match=rf"^{path}: not valid JSON at line 1, column 2 "):
        BertConfig.from_json_file(path)
    with pytest.raises(FileNotFoundError, match=rf"^{tmp_path / 'nope.json'}: no such config file$"):
        BertConfig.from_json_file(tmp_path / "nope.json")
