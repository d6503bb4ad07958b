"""Sentence embeddings: sentence-transformers' pooling modes, its directories read and written both ways, and the
real all-MiniLM-L6-v2 against sentence-transformers itself."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from conftest import minilm_dir, tiny_config
from bertkit.models import BertModel
from bertkit.models.pooling import SentenceEncoder, pool
from bertkit.sentence import POOLING_MODES, DenseSpec, SentenceConfig, pooling_modes, read_sentence_config

st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is a test dependency (parity)")
TEXTS = ["A man is playing a guitar.", "The quick brown fox jumps over the lazy dog, again and again!", "x",
         "Numbers like 3.14 are split on punctuation."]


def _mask(lengths: list[int], T: int, left: bool) -> torch.Tensor:
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for i, n in enumerate(lengths):
        if left:
            mask[i, T - n:] = 1
        else:
            mask[i, :n] = 1
    return mask


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("modes", [(m,) for m in POOLING_MODES] + [("cls", "max", "mean")])
def test_pool_equals_sentence_transformers_pooling(modes, left):
    """Every mode (and a concatenation) on padding at either side: sentence-transformers' Pooling module's
    numbers, to float32 rounding."""
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling

    torch.manual_seed(0)
    hidden = torch.randn(4, 9, 8)
    mask = _mask([9, 1, 5, 3], 9, left)
    theirs = Pooling(8, pooling_mode=modes if len(modes) > 1 else modes[0])(
        {"token_embeddings": hidden, "attention_mask": mask})["sentence_embedding"]
    torch.testing.assert_close(pool(hidden, mask, modes), theirs, rtol=0, atol=1e-6)


def test_pooling_names():
    assert pooling_modes("last") == ("lasttoken",)
    assert pooling_modes("mean+cls") == ("cls", "mean")  # sentence-transformers' concatenation order
    with pytest.raises(ValueError, match="unknown pooling 'median'"):
        pooling_modes("median")


def _tiny_encoder(tiny_tokenizer, sentence: SentenceConfig) -> SentenceEncoder:
    torch.manual_seed(1)
    encoder = BertModel(tiny_config(vocab_size=tiny_tokenizer.vocab_size, hidden_dropout_prob=0.0,
                                    attention_probs_dropout_prob=0.0, initializer_range=0.2))
    model = SentenceEncoder(encoder, sentence).eval()
    for layer in model.dense:
        torch.nn.init.normal_(layer.linear.weight, std=0.3)
    return model


def _ours(model: SentenceEncoder, tokenizer, texts) -> np.ndarray:
    enc = tokenizer.encode_batch(list(texts), max_length=model.sentence.max_seq_length or 64)
    T = max(len(e) for e in enc)
    ids = torch.full((len(enc), T), tokenizer.pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, e in enumerate(enc):
        ids[i, :len(e)] = torch.tensor(e.input_ids)
        mask[i, :len(e)] = 1
    with torch.no_grad():
        return model.embed(ids, mask).numpy()


def _theirs(directory, texts) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # a deprecated key in our files would warn
        model = st.SentenceTransformer(str(directory), device="cpu")
    return model.encode(list(texts), convert_to_numpy=True)


@pytest.mark.parametrize("sentence", [
    SentenceConfig(("cls",), normalize=False, max_seq_length=32),
    SentenceConfig(("mean",), normalize=True, max_seq_length=32),
    SentenceConfig(("max",), max_seq_length=32),
    SentenceConfig(("lasttoken",), normalize=True, max_seq_length=32),
    SentenceConfig(("weightedmean",), max_seq_length=32),
    SentenceConfig(("cls", "mean"), normalize=True, max_seq_length=32,
                   dense=(DenseSpec("2_Dense", 64, 16, True, "tanh"),)),
], ids=["cls", "mean-normalize", "max", "last-normalize", "weightedmean", "cls+mean-dense-normalize"])
def test_saved_directory_pools_the_same_in_sentence_transformers(tmp_path, one_thread, tiny_tokenizer, sentence):
    model = _tiny_encoder(tiny_tokenizer, sentence)
    model.save_pretrained(tmp_path / "m", tokenizer=tiny_tokenizer)
    assert read_sentence_config(tmp_path / "m") == sentence  # our own files read back to the same config
    np.testing.assert_allclose(_theirs(tmp_path / "m", TEXTS), _ours(model, tiny_tokenizer, TEXTS), rtol=0, atol=1e-6)
    back = SentenceEncoder.from_pretrained(tmp_path / "m").eval()
    np.testing.assert_array_equal(_ours(back, tiny_tokenizer, TEXTS), _ours(model, tiny_tokenizer, TEXTS))


def test_directory_written_by_sentence_transformers_reads_the_same(tmp_path, one_thread, tiny_tokenizer):
    """sentence-transformers' own files (its current spelling: `pooling_mode`, module paths of 5+), a Dense layer
    included, read by bertkit pool the same."""
    model = _tiny_encoder(tiny_tokenizer, SentenceConfig(("cls",), max_seq_length=32))
    model.save_pretrained(tmp_path / "m", tokenizer=tiny_tokenizer)
    theirs = st.SentenceTransformer(str(tmp_path / "m"), device="cpu")
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize

    torch.manual_seed(3)
    theirs.append(Dense(32, 8, activation_function=torch.nn.Identity()))
    theirs.append(Normalize())
    theirs.save(str(tmp_path / "st"))
    assert read_sentence_config(tmp_path / "st").normalize
    ours = SentenceEncoder.from_pretrained(tmp_path / "st").eval()
    assert ours.dimension == 8
    np.testing.assert_allclose(_ours(ours, tiny_tokenizer, TEXTS), theirs.encode(TEXTS), rtol=0, atol=1e-6)


def test_unsupported_module_is_refused(tmp_path, tiny_tokenizer):
    model = _tiny_encoder(tiny_tokenizer, SentenceConfig())
    model.save_pretrained(tmp_path / "m", tokenizer=tiny_tokenizer)
    modules = json.loads((tmp_path / "m" / "modules.json").read_text())
    modules.append({"idx": 9, "name": "9", "path": "9_LSTM", "type": "sentence_transformers.models.LSTM"})
    (tmp_path / "m" / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match=r"modules.json: module 'sentence_transformers.models.LSTM' is not supported"):
        SentenceEncoder.from_pretrained(tmp_path / "m")


def test_plain_directory_pools_as_sentence_transformers_guesses(tmp_path, tiny_tokenizer):
    """No modules.json: mean pooling without normalisation, sentence-transformers' own guess."""
    model = _tiny_encoder(tiny_tokenizer, SentenceConfig())
    model.encoder.save_pretrained(tmp_path / "plain", tokenizer=tiny_tokenizer)
    assert read_sentence_config(tmp_path / "plain") is None
    assert SentenceEncoder.from_pretrained(tmp_path / "plain").sentence == SentenceConfig()


def test_minilm_both_ways_within_1e6(tmp_path, one_thread):
    """all-MiniLM-L6-v2: bertkit equals sentence-transformers on its own directory; saved by bertkit, it loads in
    sentence-transformers with its pooling and normalisation (equal to 1e-6); saved by sentence-transformers
    6.x (its newer spelling), bertkit reads it the same."""
    from bertkit.tokenizers import load_tokenizer

    path = minilm_dir()
    reference = st.SentenceTransformer(str(path), device="cpu")
    expected = reference.encode(TEXTS)
    model = SentenceEncoder.from_pretrained(path).eval()
    assert model.sentence.modes == ("mean",) and model.sentence.normalize and model.sentence.max_seq_length == 256
    tokenizer = load_tokenizer(path)
    np.testing.assert_allclose(_ours(model, tokenizer, TEXTS), expected, rtol=0, atol=1e-6)
    model.save_pretrained(tmp_path / "ours", tokenizer=tokenizer)
    np.testing.assert_allclose(_theirs(tmp_path / "ours", TEXTS), expected, rtol=0, atol=1e-6)
    reference.save(str(tmp_path / "theirs"))
    back = SentenceEncoder.from_pretrained(tmp_path / "theirs").eval()
    np.testing.assert_allclose(_ours(back, load_tokenizer(tmp_path / "theirs"), TEXTS), expected, rtol=0, atol=1e-6)


def test_features_cli_uses_the_directorys_pooling(tmp_path, tiny_tokenizer, capsys):
    """`bertkit features`: a sentence-transformers directory gives one vector per line, pooled as
    sentence-transformers pools it; a plain directory keeps per-token features unless --pooling says."""
    from bertkit.cli import main
    from bertkit.features import read_features

    model = _tiny_encoder(tiny_tokenizer, SentenceConfig(("max",), normalize=True, max_seq_length=32))
    model.save_pretrained(tmp_path / "st", tokenizer=tiny_tokenizer)
    model.encoder.save_pretrained(tmp_path / "plain", tokenizer=tiny_tokenizer)
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    assert main(["features", "--model", str(tmp_path / "st"), "--input", str(tmp_path / "in.txt"),
                 "--out", str(tmp_path / "st.npy")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "st.npy"), _theirs(tmp_path / "st", TEXTS), rtol=0, atol=1e-6)
    assert main(["features", "--model", str(tmp_path / "plain"), "--input", str(tmp_path / "in.txt"),
                 "--out", str(tmp_path / "tokens.npz"), "--layers", "-1"]) == 0
    features, tokens = read_features(tmp_path / "tokens.npz")
    assert len(features) == len(TEXTS) and features[0].shape == (len(tokens[0]), 32)
    assert main(["features", "--model", str(tmp_path / "plain"), "--input", str(tmp_path / "in.txt"),
                 "--out", str(tmp_path / "cls.npz"), "--pooling", "cls"]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "cls.npz")["embeddings"], np.stack([f[0] for f in features]),
                               rtol=0, atol=1e-5)
    assert '"pooling": "cls"' in capsys.readouterr().out
