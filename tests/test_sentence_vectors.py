"""Sentence vectors beyond one pass per text (`bertkit.sentence`, `bertkit.features.encode_sentences`): long
texts as overlapping windows, Matryoshka prefixes, and prompts, against sentence-transformers where it has them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertkit import BertConfig, BertModel, WordPieceTokenizer
from bertkit.cli import main
from bertkit.features import encode_sentences, truncate_dimensions
from bertkit.models.pooling import SentenceEncoder
from bertkit.sentence import SentenceConfig, combine_windows, read_sentence_config, window_spans, windowed_encodings

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = "the quick brown fox jumps over a lazy dog pack my box with five dozen liquor jugs".split()
SHORT = ["the quick brown fox", "a lazy dog", ""]
LONG = " ".join(WORDS * 3)  # 54 words: several windows of 16 tokens


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("sentence")
    tokenizer = WordPieceTokenizer.train(texts=[" ".join(WORDS)] * 3, vocab_size=80, min_frequency=1,
                                         show_progress=False)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    sentence = SentenceConfig(modes=("mean",), normalize=True, prompts={"query": "query: ", "document": "doc: "},
                              matryoshka_dims=(32, 16, 8))
    SentenceEncoder(BertModel(config), sentence).save_pretrained(root / "model", tokenizer)
    return root / "model"


def test_window_spans_cover_the_text_with_the_stride():
    assert window_spans(5, 8, 4) == [(0, 5)]  # shorter than a window: one
    assert window_spans(0, 8, 4) == [(0, 0)]
    assert window_spans(8, 8, 4) == [(0, 8)]
    assert window_spans(9, 8, 4) == [(0, 8), (4, 9)]
    assert window_spans(20, 8, 6) == [(0, 8), (6, 14), (12, 20)]
    assert window_spans(10, 4, 4) == [(0, 4), (4, 8), (8, 10)]  # no overlap
    for n, size, stride in [(37, 10, 3), (100, 16, 16), (17, 5, 1)]:
        spans = window_spans(n, size, stride)
        covered = set()
        for k, (a, b) in enumerate(spans):
            assert b - a <= size and a == k * stride
            covered.update(range(a, b))
        assert covered == set(range(n)) and spans[-1][1] == n and spans[-2][1] < n
    with pytest.raises(ValueError, match="stride"):
        window_spans(5, 4, 5)


def test_combine_windows_is_the_piece_weighted_mean():
    v = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]], dtype=np.float32)
    np.testing.assert_array_equal(combine_windows(v[:1], [7], True), v[0])  # one window: unchanged
    x = combine_windows(v, [2, 1, 1], False)
    np.testing.assert_allclose(x, [(2 + 3) / 4, (2 + 3) / 4], rtol=1e-7)
    np.testing.assert_allclose(combine_windows(v, [2, 1, 1], True), x / np.linalg.norm(x), rtol=1e-6)


def test_a_text_within_one_window_gives_exactly_todays_vector(model_dir):
    plain = encode_sentences(model_dir, SHORT)
    windowed = encode_sentences(model_dir, SHORT, window=16, stride=4)
    np.testing.assert_array_equal(windowed, plain)
    prompted = encode_sentences(model_dir, SHORT, prompt="query: ", window=16, stride=4)
    np.testing.assert_array_equal(prompted, encode_sentences(model_dir, SHORT, prompt="query: "))


def test_a_long_text_is_the_weighted_mean_of_its_windows_encoded_alone(model_dir):
    tokenizer = WordPieceTokenizer.from_pretrained(model_dir)
    pieces = tokenizer.encode_raw([LONG])[0]
    spans = window_spans(len(pieces.ids), 14, 5)  # 16 tokens: 14 pieces and [CLS], [SEP]
    assert len(spans) > 3
    model = SentenceEncoder.from_pretrained(model_dir).eval()
    vectors = []
    with torch.no_grad():
        for a, b in spans:
            ids = torch.tensor([tokenizer.build_inputs(pieces.ids[a:b])[0]])
            vectors.append(model.embed(ids)[0].numpy())
    weights = [b - a for a, b in spans]
    expected = np.average(np.stack(vectors).astype(np.float64), axis=0, weights=weights)
    expected /= np.linalg.norm(expected)
    got = encode_sentences(model_dir, SHORT[:1] + [LONG], window=16, stride=5)
    np.testing.assert_allclose(got[1], expected, atol=1e-6)  # padding in the batch: float32 rounding only
    per, owner, chars = encode_sentences(model_dir, SHORT[:1] + [LONG], window=16, stride=5, per_window=True)
    assert owner.tolist() == [0] + [1] * len(spans)
    np.testing.assert_allclose(per[1:], np.stack(vectors), atol=1e-6)
    assert chars[1].tolist() == [0, pieces.offsets[spans[0][1] - 1][1]]
    assert chars[-1].tolist() == [pieces.offsets[spans[-1][0]][0], len(LONG)]
    for (a, b), (start, end) in zip(spans, chars[1:]):
        assert LONG[start:end] == tokenizer.decode(pieces.ids[a:b]) or start == pieces.offsets[a][0]


def test_windows_repeat_the_prompt(model_dir):
    tokenizer = WordPieceTokenizer.from_pretrained(model_dir)
    windows = windowed_encodings(tokenizer, [LONG], 16, 5, prompt="query: ")
    head = tokenizer.encode_raw(["query: "])[0].ids
    assert len(windows.encoded) > 3
    for row in windows.encoded:
        assert row.input_ids[1:1 + len(head)] == head and len(row) <= 16


def test_dimensions_truncate_and_renormalise(model_dir):
    full = encode_sentences(model_dir, SHORT)
    cut = encode_sentences(model_dir, SHORT, dimensions=8)
    np.testing.assert_allclose(cut, full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True), rtol=1e-6)
    np.testing.assert_array_equal(truncate_dimensions(full, None, True), full)
    with pytest.raises(ValueError, match="--dimensions 33 must be between 1 and the model's 32"):
        truncate_dimensions(full, 33, True)


def test_prompts_and_dims_round_trip_through_sentence_transformers(model_dir):
    st = pytest.importorskip("sentence_transformers")
    assert read_sentence_config(model_dir).matryoshka_dims == (32, 16, 8)
    assert json.loads((model_dir / "config_sentence_transformers.json").read_text())["matryoshka_dims"] == [32, 16, 8]
    theirs = st.SentenceTransformer(str(model_dir), device="cpu")
    assert theirs.prompts == {"query": "query: ", "document": "doc: "}
    for name in ("query", "document"):
        np.testing.assert_allclose(encode_sentences(model_dir, SHORT, prompt=theirs.prompts[name]),
                                   theirs.encode(SHORT, prompt_name=name), atol=1e-6)
    truncated = st.SentenceTransformer(str(model_dir), device="cpu", truncate_dim=16)
    reference = truncated.encode(SHORT, normalize_embeddings=True)
    np.testing.assert_allclose(encode_sentences(model_dir, SHORT, dimensions=16), reference, atol=1e-6)


def test_features_cli_prompt_name_window_and_dimensions(model_dir, tmp_path, capsys):
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(SHORT[:2] + [LONG]) + "\n")
    main(["features", "--model", str(model_dir), "--input", str(lines), "--out", str(tmp_path / "v.npy"),
          "--prompt-name", "query", "--window", "16", "--stride", "5", "--dimensions", "16"])
    expected = encode_sentences(model_dir, SHORT[:2] + [LONG], prompt="query: ", window=16, stride=5, dimensions=16)
    np.testing.assert_array_equal(np.load(tmp_path / "v.npy"), expected)
    main(["features", "--model", str(model_dir), "--input", str(lines), "--out", str(tmp_path / "w.npz"),
          "--window", "16", "--per-window"])
    saved = np.load(tmp_path / "w.npz")
    assert saved["embeddings"].shape[0] == len(saved["text"]) > 3 and saved["chars"].shape == (len(saved["text"]), 2)
    capsys.readouterr()
    assert main(["features", "--model", str(model_dir), "--input", str(lines), "--out", str(tmp_path / "x.npy"),
                 "--prompt-name", "passage"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--prompt-name 'passage'" in err and "has document, query" in err
    assert not (tmp_path / "x.npy").exists()
