"""Feature-based BERT: the chosen hidden layers, combined exactly as asked, and files that round-trip."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from bertkit import BertConfig, BertForPreTraining, BertModel, WordPieceTokenizer
from bertkit.cli import main
from bertkit.features import combine_layers, extract_features, read_features, write_features

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
