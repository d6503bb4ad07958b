"""Feature-based BERT: the chosen hidden layers, combined exactly as asked, and files that round-trip."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import bertkit.models as models
from bertkit import BertConfig, BertForPreTraining, BertModel, WordPieceTokenizer
from bertkit.cli import main
from bertkit.features import combine_layers, encoder_hidden_states, extract_features, read_features, write_features
from bertkit.models.registry import ARCHITECTURES

TEXTS = ["the quick brown fox jumps over the lazy dog .", "a dog", "", "pack my box with five dozen jugs !"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is fastest


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("features")
    tokenizer = WordPieceTokenizer.train(texts=TEXTS * 3, vocab_size=80, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32)
    BertForPreTraining(config).save_pretrained(root / "model", tokenizer=tokenizer)
    return root / "model"


def reference(model_dir, text: str) -> tuple[torch.Tensor, ...]:
    """Every hidden state of one text, run alone (no padding) through the plain encoder."""
    model = BertModel.from_pretrained(model_dir).eval()
    enc = WordPieceTokenizer.from_pretrained(model_dir).encode(text)
    ids = torch.tensor([enc.input_ids])
    with torch.no_grad():
        return model(ids, torch.ones_like(ids), torch.zeros_like(ids), output_hidden_states=True).hidden_states


def test_concat_of_the_last_four_layers_is_exact(model_dir):
    features, tokens = extract_features(model_dir, TEXTS, batch_size=1)
    for text, feature, toks in zip(TEXTS, features, tokens):
        hidden = reference(model_dir, text)
        assert len(hidden) == 5  # embeddings + 4 layers
        expected = torch.cat([hidden[-1], hidden[-2], hidden[-3], hidden[-4]], dim=-1)[0].numpy()
        assert feature.dtype == np.float32 and feature.shape == (len(toks), 4 * 32)
        assert np.array_equal(feature, expected)
        assert toks[0] == "[CLS]" and toks[-1] == "[SEP]"


def test_batched_padding_changes_nothing_and_other_combinations(model_dir):
    single, _ = extract_features(model_dir, TEXTS, layers=(0, -1), combine="sum", batch_size=1)
    batched, _ = extract_features(model_dir, TEXTS, layers=(0, -1), combine="sum", batch_size=4)
    for a, b in zip(single, batched):
        assert a.shape[1] == 32 and np.allclose(a, b, atol=1e-5)
    kept, _ = extract_features(model_dir, TEXTS[:1], layers=(-1, 2), combine="none")
    hidden = reference(model_dir, TEXTS[0])
    assert kept[0].shape == (hidden[0].shape[1], 2, 32)
    assert np.allclose(kept[0][:, 1], hidden[2][0].numpy(), atol=1e-6)
    with pytest.raises(ValueError, match="layer 5 does not exist"):
        combine_layers(hidden, [5], "concat")
    with pytest.raises(ValueError, match="combine must be one of"):
        combine_layers(hidden, [-1], "mean")


@pytest.mark.parametrize("suffix", [".safetensors", ".npz", ".npy"])
def test_files_round_trip_through_the_cli(model_dir, tmp_path, suffix, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / f"feats{suffix}"
    assert main(["features", "--model", str(model_dir), "--input", str(texts), "--layers=-1,-2",
                 "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["lines"] == len(TEXTS) and summary["feature_shape"] == ["T", 64]
    features, tokens = read_features(out)
    expected, expected_tokens = extract_features(model_dir, TEXTS, layers=(-1, -2))
    assert tokens == expected_tokens
    assert len(features) == len(TEXTS)
    for a, b in zip(features, expected):
        assert a.shape == b.shape and np.array_equal(a, b)
    if suffix == ".npy":
        assert np.load(out).shape == (len(TEXTS), max(map(len, tokens)), 64)
        assert (tmp_path / "feats.lengths.npy").is_file() and (tmp_path / "feats.tokens.json").is_file()
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # readable like any file the user writes


def test_write_features_refuses_other_suffixes(tmp_path):
    with pytest.raises(ValueError, match="safetensors, .npz or .npy"):
        write_features(tmp_path / "x.pt", [np.zeros((2, 3), np.float32)], [["a", "b"]])


@pytest.mark.parametrize("name", [n for n, row in ARCHITECTURES.items() if "encoder" in row.roles and n != "elmo"])
def test_every_encoder_gives_its_embeddings_and_each_layer(name):
    """encoder_hidden_states passes token types to the encoders whose registry row reads them (T5's reads none): each
    architecture's encoder gives L + 1 states, and with token types it reads they change its output."""
    row = ARCHITECTURES[name]

    class Ids:  # the framing ids a fresh model of the row takes (registry tokenizer_fields)
        pad_id, cls_id, sep_id = 0, 1, 2

    sizes = dict(vocab_size=100, **row.tokenizer_ids(Ids()), **row.config_fields)
    if row.config_class is BertConfig:
        config = BertConfig.for_family(row.model_type, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=64, **sizes)
    else:
        config = row.config_class.preset("tiny", **sizes)
    torch.manual_seed(0)
    encoder = models.class_for(config, "encoder")(config).eval()
    ids = torch.randint(3, 100, (2, 7))
    mask, types = torch.ones_like(ids), torch.zeros_like(ids)
    with torch.no_grad():
        states = encoder_hidden_states(encoder, ids, mask, types)
        layers = getattr(config, "num_hidden_layers", None) or getattr(config, "num_layers")
        assert len(states) == layers + 1 and all(s.shape[:2] == (2, 7) for s in states)
        if row.token_types and getattr(config, "type_vocab_size", 0) > 1:
            other = encoder_hidden_states(encoder, ids, mask, torch.ones_like(ids))
            assert not torch.equal(other[-1], states[-1])
