"""A released ELMo against the numbers bilm-tf itself computed: allenai/allennlp's test_fixtures/elmo (Apache-2.0),
in ../shared/data/elmo-allennlp (see its README row; CI has it, the tests skip without it).

The fixture: options.json + lm_weights.hdf5 (a small ELMo in bilm-tf's layout: 2 layers, LSTM 64, projection 16,
clips 3), sentences.json (3 lists of 10 sentences, tokenized, words split on spaces) and lm_embeddings_{k}.hdf5
(dataset i: sentence i of list k, bilm-tf's top layer, (2, T, 16) = the forward and the backward LSTM's output,
<S> and </S> left out). bilm-tf read batch i = (list 0's, list 1's, list 2's sentence i), 3 rows, every LSTM state
carried from batch to batch, batch 0 from zeros.

"Top layer" there is bertkit's last hidden state: [forward; backward] of the second biLSTM layer, each half the
16-wide projection with the residual connection added (2P = 32 wide), at the sentence's words (the features'
first and last rows are <s> and </s>). Within 1e-5; measured 1.2e-6 at most over the 30 sentences.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertkit.cli import main
from bertkit.features import encoder_hidden_states, extract_features, load_encoder, read_features
from bertkit.models import ElmoModel
from bertkit.tokenizers import load_tokenizer
from conftest import shared_data

h5py = pytest.importorskip("h5py", reason="reading bilm-tf's weights.hdf5 needs h5py (pip install 'bertkit[elmo]')")

pytestmark = pytest.mark.usefixtures("one_thread")
ATOL = 1e-5  # float32 LSTMs over 50 words; the largest difference measured is 1.2e-6


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    """(directory, sentences[k][i], expected[k][i] (T, 32)): the fixture's files under the names bertkit reads
    (weights.hdf5 is bilm-tf's name; the fixture calls it lm_weights.hdf5)."""
    source = shared_data("elmo-allennlp")
    directory = tmp_path_factory.mktemp("elmo-released")
    (directory / "options.json").symlink_to(source / "options.json")
    (directory / "weights.hdf5").symlink_to(source / "lm_weights.hdf5")
    sentences = json.loads((source / "sentences.json").read_text(encoding="utf-8"))
    expected = []
    for k in range(len(sentences)):
        with h5py.File(source / f"lm_embeddings_{k}.hdf5", "r") as f:
            expected.append([np.concatenate(list(f[str(i)][...]), axis=-1) for i in range(len(sentences[k]))])
    return directory, sentences, expected


def batch_texts(sentences, i: int) -> list[str]:
    return [sentences[k][i] for k in range(len(sentences))]


def test_a_released_directory_splits_words_on_whitespace(fixture):
    directory, sentences, _ = fixture
    tokenizer = load_tokenizer(directory)
    assert tokenizer.words == "whitespace"
    tokenizer.open_vocabulary = True  # the fixture has no vocab.txt: every word is read by its spelling
    for text in (s for group in sentences for s in group):
        assert tokenizer.encode(text).tokens == ["<s>", *text.split(), "</s>"]
    text = "The U.S. index rose 68.88 points"
    assert tokenizer.encode(text).tokens == ["<s>", *text.split(), "</s>"]
    assert tokenizer.split_words("bert").encode(text).tokens == ["<s>", "The", "U", ".", "S", ".", "index", "rose",
                                                                 "68", ".", "88", "points", "</s>"]


def test_the_first_batch_from_zero_state_is_bilm_tfs(fixture):
    directory, sentences, expected = fixture
    tokenizer = load_tokenizer(directory)
    tokenizer.open_vocabulary = True
    model = load_encoder(directory).eval()
    assert model.stateful is False
    encoded = tokenizer.encode_batch(batch_texts(sentences, 0))
    T = max(len(e.input_ids) for e in encoded)
    ids, mask = torch.zeros(len(encoded), T, dtype=torch.long), torch.zeros(len(encoded), T, dtype=torch.long)
    for row, e in enumerate(encoded):
        ids[row, :len(e.input_ids)], mask[row, :len(e.input_ids)] = torch.tensor(e.input_ids), 1
    with torch.no_grad():
        top = encoder_hidden_states(model, ids, mask, tokenizer=tokenizer)[-1]
    for k, e in enumerate(encoded):
        want = expected[k][0]
        assert len(e.input_ids) == len(want) + 2  # <s> words </s>
        np.testing.assert_allclose(top[k, 1:len(e.input_ids) - 1].numpy(), want, atol=ATOL, rtol=0)


def test_stateful_reading_reproduces_all_thirty_sentences(fixture):
    """bilm-tf's run as the features API reads it: the 30 sentences in batch order, 3 a batch, stateful; and the
    same batches from zeros do differ from bilm-tf after the first (the carried state is what the file holds)."""
    directory, sentences, expected = fixture
    texts = [text for i in range(len(sentences[0])) for text in batch_texts(sentences, i)]
    want = [expected[k][i] for i in range(len(sentences[0])) for k in range(len(sentences))]
    features, tokens = extract_features(directory, texts, layers=[-1], batch_size=3, stateful=True)
    for got, words, reference in zip(features, tokens, want):
        assert len(words) == len(reference) + 2
        np.testing.assert_allclose(got[1:-1], reference, atol=ATOL, rtol=0)
    assert ElmoModel.from_pretrained(directory, stateful=True).stateful  # the model API's switch
    fresh, _ = extract_features(directory, texts[3:6], layers=[-1], batch_size=3)
    assert max(np.abs(got[1:-1] - reference).max() for got, reference in zip(fresh, want[3:6])) > 1e-3


def test_the_command_line_reads_the_stream_statefully_and_splits_as_asked(fixture, tmp_path, capsys):
    directory, sentences, expected = fixture
    texts = [text for i in range(2) for text in batch_texts(sentences, i)]  # two batches: the state carried once
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "top.npz"
    assert main(["features", "--model", str(directory), "--input", str(tmp_path / "in.txt"), "--out", str(out),
                 "--layers", "-1", "--batch-size", "3", "--stateful"]) == 0
    features, _ = read_features(out)
    for n, got in enumerate(features):
        np.testing.assert_allclose(got[1:-1], expected[n % 3][n // 3], atol=ATOL, rtol=0)
    capsys.readouterr()
    assert main(["features", "--model", str(directory), "--input", str(tmp_path / "in.txt"), "--out", str(out),
                 "--layers", "-1", "--words", "bert"]) == 0
    _, tokens = read_features(out)
    assert tokens[0][1:4] == ["The", "U", "."]  # the first sentence's "U.S." split the BERT way
