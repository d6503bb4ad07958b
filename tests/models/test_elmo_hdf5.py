"""A released ELMo (allenai/bilm-tf's options.json + weights.hdf5) read by bertkit gives the layers of an independent
reference: AllenNLP's `_ElmoCharacterEncoder` + `ElmoLstm` (with `LstmCellWithProjection`) transcribed below, reading
the same file with h5py itself (their weight loading included: the transposes, the negated carry gate, TF's gate
order and forget bias). Random weights in that layout, clipping small enough that it acts; within 1e-5.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

h5py = pytest.importorskip("h5py", reason="reading bilm-tf's weights.hdf5 needs h5py (pip install 'bertkit[elmo]')")

from bertkit.errors import CheckpointError  # noqa: E402
from bertkit.models.modeldir import read_config  # noqa: E402
from bertkit.cli import main  # noqa: E402
from bertkit.features import encoder_hidden_states  # noqa: E402
from bertkit.models import ElmoModel  # noqa: E402
from bertkit.tokenizers import load_tokenizer  # noqa: E402
from bertkit.tokenizers.word import WordTokenizer, read_bilm_vocab, word_backend  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

FILTERS = [[1, 4], [2, 8], [3, 16]]  # 28 CNN outputs
E, P, H, LAYERS, HIGHWAY, W = 4, 16, 32, 2, 2, 50
CELL_CLIP, PROJ_CLIP = 1.0, 0.3  # small enough that both clip somewhere (asserted below)
SENTENCES = ["the cat sat on the mat", "naïve café 日本語 words",
             "a " + "x" * 60 + " word longer than fifty bytes is cut", "one"]


def options() -> dict:
    return {"lstm": {"use_skip_connections": True, "projection_dim": P, "cell_clip": CELL_CLIP,
                     "proj_clip": PROJ_CLIP, "dim": H, "n_layers": LAYERS},
            "char_cnn": {"activation": "relu", "filters": FILTERS, "n_highway": HIGHWAY, "embedding": {"dim": E},
                         "n_characters": 262, "max_characters_per_token": W}}


def write_bilm(directory: Path, seed: int = 0, projection: bool = True) -> Path:
    """Random weights in bilm-tf's hdf5 layout (the dataset names and shapes `dump_weights` writes)."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    opts = options()
    n = sum(c for _, c in FILTERS)
    if not projection:
        opts["lstm"]["projection_dim"] = n
    p = opts["lstm"]["projection_dim"]
    (directory / "options.json").write_text(json.dumps(opts))
    (directory / "vocab.txt").write_text("</S>\n<S>\n<UNK>\nthe\ncat\nsat\non\nmat\n")
    normal = lambda *shape, scale=1.0: (rng.standard_normal(shape) * scale).astype(np.float32)  # noqa: E731
    with h5py.File(directory / "weights.hdf5", "w") as f:
        f["char_embed"] = rng.uniform(-1, 1, (261, E)).astype(np.float32)
        for i, (width, count) in enumerate(FILTERS):
            f[f"CNN/W_cnn_{i}"] = normal(1, width, E, count, scale=0.4)
            f[f"CNN/b_cnn_{i}"] = normal(count, scale=0.1)
        for k in range(HIGHWAY):
            f[f"CNN_high_{k}/W_carry"] = normal(n, n, scale=n ** -0.5)
            f[f"CNN_high_{k}/b_carry"] = normal(n, scale=0.5) - 1.0
            f[f"CNN_high_{k}/W_transform"] = normal(n, n, scale=n ** -0.5)
            f[f"CNN_high_{k}/b_transform"] = normal(n, scale=0.1)
        if projection:
            f["CNN_proj/W_proj"] = normal(n, p, scale=n ** -0.5)
            f["CNN_proj/b_proj"] = normal(p, scale=0.1)
        for d in range(2):
            for layer in range(LAYERS):
                cell = f"RNN_{d}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"
                f[f"{cell}/W_0"] = normal(2 * p, 4 * H, scale=0.5)
                f[f"{cell}/B"] = normal(4 * H, scale=0.3)
                f[f"{cell}/W_P_0"] = normal(H, p, scale=0.5)
    return directory


# ------------------------------------------------------------------------------------------------------------------
# The reference: AllenNLP's ELMoCharacterMapper, _ElmoCharacterEncoder and ElmoLstm, transcribed (float64)
# ------------------------------------------------------------------------------------------------------------------
def reference_char_ids(words: list[str]) -> np.ndarray:
    """ELMoCharacterMapper on <S> words </S> (add_sentence_boundary_token_ids): bilm-tf's ids, then + 1."""
    bos, eos, bow, eow, pad = 256, 257, 258, 259, 260

    def spell(inner: list[int]) -> list[int]:
        ids = [pad] * W
        ids[0] = bow
        ids[1:1 + len(inner)] = inner
        ids[len(inner) + 1] = eow
        return [c + 1 for c in ids]

    rows = [spell([bos])] + [spell(list(w.encode("utf-8", "ignore")[:W - 2])) for w in words] + [spell([eos])]
    return np.array(rows, dtype=np.int64)


def reference_token_layer(f, chars: np.ndarray) -> torch.Tensor:
    """_ElmoCharacterEncoder: (L, W) character ids -> (L, P) token vectors, weights loaded as AllenNLP does."""
    table = f["char_embed"][...]
    table = np.concatenate([np.zeros((1, table.shape[1])), table]).astype(np.float64)  # row 0 pads a word
    x = torch.from_numpy(table[chars]).transpose(1, 2)  # (L, E, W)
    convs = []
    for i in range(len(FILTERS)):
        weight = np.transpose(f[f"CNN/W_cnn_{i}"][...].squeeze(0), (2, 1, 0))  # (count, E, width)
        out = F.conv1d(x, torch.from_numpy(weight).double(), torch.from_numpy(f[f"CNN/b_cnn_{i}"][...]).double())
        convs.append(torch.relu(out.max(dim=-1).values))
    h = torch.cat(convs, dim=-1)
    n = h.shape[-1]
    for k in range(HIGHWAY):
        g = lambda name: torch.from_numpy(f[f"CNN_high_{k}/{name}"][...]).double()  # noqa: E731
        # AllenNLP's Highway: one matrix [W_transform^T; -W_carry^T] (its gate carries x; bilm-tf's multiplies f(x))
        weight = torch.cat([g("W_transform").T, -g("W_carry").T])
        bias = torch.cat([g("b_transform"), -g("b_carry")])
        nonlinear, gate = (h @ weight.T + bias).split(n, dim=-1)
        gate = torch.sigmoid(gate)
        new = gate * h + (1 - gate) * torch.relu(nonlinear)
        # bilm-tf's own form of the same layer (model.py `high`): carry * relu(x W_tr + b_tr) + (1 - carry) * x
        carry = torch.sigmoid(h @ g("W_carry") + g("b_carry"))
        torch.testing.assert_close(new, carry * torch.relu(h @ g("W_transform") + g("b_transform")) + (1 - carry) * h)
        h = new
    if "CNN_proj" not in f:
        return h
    return h @ torch.from_numpy(f["CNN_proj/W_proj"][...]).double() + torch.from_numpy(f["CNN_proj/b_proj"][...])


def allennlp_cell_weights(f, direction: int, layer: int, input_size: int):
    """ElmoLstm.load_weights for one LstmCellWithProjection: (input W, state W, state bias, projection W)."""
    cell = f[f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"]
    tf_weights = np.transpose(cell["W_0"][...]).astype(np.float64)
    torch_weights = tf_weights.copy()
    for rows in (slice(0, input_size), slice(input_size, None)):
        torch_w, tf_w = torch_weights[:, rows], tf_weights[:, rows]
        torch_w[H:2 * H], torch_w[2 * H:3 * H] = tf_w[2 * H:3 * H], tf_w[H:2 * H]  # TF (i, j, f, o) -> (i, f, j, o)
    tf_bias = cell["B"][...].astype(np.float64)
    tf_bias[2 * H:3 * H] += 1  # TF's LSTMCell adds forget_bias 1.0 at run time
    bias = tf_bias.copy()
    bias[H:2 * H], bias[2 * H:3 * H] = tf_bias[2 * H:3 * H], tf_bias[H:2 * H]
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    return (t(torch_weights[:, :input_size]), t(torch_weights[:, input_size:]), t(bias),
            t(np.transpose(cell["W_P_0"][...]).astype(np.float64)))


def reference_cell(x: torch.Tensor, weights, forward: bool, clipped: dict) -> torch.Tensor:
    """LstmCellWithProjection over one sentence (L, D) in one direction, from a zero state -> (L, P)."""
    w_in, w_state, bias, w_proj = weights
    state, memory = x.new_zeros(w_proj.shape[0]), x.new_zeros(H)
    out = [None] * x.shape[0]
    for t in (range(x.shape[0]) if forward else reversed(range(x.shape[0]))):
        gates = w_in @ x[t] + w_state @ state + bias
        input_gate, forget_gate = torch.sigmoid(gates[:H]), torch.sigmoid(gates[H:2 * H])
        memory_init, output_gate = torch.tanh(gates[2 * H:3 * H]), torch.sigmoid(gates[3 * H:])
        memory = input_gate * memory_init + forget_gate * memory
        clipped["cell"] += int((memory.abs() > CELL_CLIP).sum())
        memory = memory.clamp(-CELL_CLIP, CELL_CLIP)
        state = w_proj @ (output_gate * torch.tanh(memory))
        clipped["proj"] += int((state.abs() > PROJ_CLIP).sum())
        state = state.clamp(-PROJ_CLIP, PROJ_CLIP)
        out[t] = state
    return torch.stack(out)


def reference_layers(path: Path, words: list[str], clipped: dict, p: int = P) -> list[torch.Tensor]:
    """_ElmoBiLm.forward for one sentence: [token layer [x; x], then each biLSTM layer [forward; backward]]."""
    with h5py.File(path, "r") as f:
        tokens = reference_token_layer(f, reference_char_ids(words))
        layers = [torch.cat([tokens, tokens], dim=-1)]
        fwd = bwd = tokens
        for layer in range(LAYERS):
            new_fwd = reference_cell(fwd, allennlp_cell_weights(f, 0, layer, p), True, clipped)
            new_bwd = reference_cell(bwd, allennlp_cell_weights(f, 1, layer, p), False, clipped)
            if layer != 0:  # skip connections from the second layer on
                new_fwd, new_bwd = new_fwd + fwd, new_bwd + bwd
            fwd, bwd = new_fwd, new_bwd
            layers.append(torch.cat([fwd, bwd], dim=-1))
    return layers


# ------------------------------------------------------------------------------------------------------------------
# The tests
# ------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bilm_dir(tmp_path_factory) -> Path:
    return write_bilm(tmp_path_factory.mktemp("bilm") / "elmo")


def bertkit_layers(directory: Path, sentences: list[str]):
    tokenizer = load_tokenizer(directory)
    tokenizer.open_vocabulary = True  # what features and frozen task models do for ELMo
    encodings = tokenizer.encode_batch(sentences)
    T = max(len(e.input_ids) for e in encodings)
    ids = torch.tensor([e.input_ids + [tokenizer.pad_id] * (T - len(e.input_ids)) for e in encodings])
    mask = torch.tensor([[1] * len(e.input_ids) + [0] * (T - len(e.input_ids)) for e in encodings])
    model = ElmoModel.from_pretrained(directory).eval()
    with torch.no_grad():
        hidden = encoder_hidden_states(model, ids, mask, None, tokenizer)
    return tokenizer, encodings, ids, mask, hidden


def test_released_layout_matches_the_allennlp_reference(bilm_dir):
    tokenizer, encodings, ids, mask, hidden = bertkit_layers(bilm_dir, SENTENCES)
    assert len(hidden) == LAYERS + 1 and all(h.shape[-1] == 2 * P for h in hidden)
    clipped = {"cell": 0, "proj": 0}
    for row, (text, enc) in enumerate(zip(SENTENCES, encodings)):
        words = text.split()
        assert enc.tokens == ["<s>", *words, "</s>"]  # open vocabulary: every word keeps its spelling
        chars = tokenizer.char_ids_of(ids[row, :len(words) + 2].numpy())
        np.testing.assert_array_equal(chars, reference_char_ids(words))
        expected = reference_layers(bilm_dir / "weights.hdf5", words, clipped)
        L = len(words) + 2
        for k, (ours, theirs) in enumerate(zip(hidden, expected)):
            torch.testing.assert_close(ours[row, :L].double(), theirs, atol=1e-5, rtol=0, msg=f"layer {k}")
            assert not ours[row, L:].any()  # padding positions are zeros in every layer
    assert clipped["cell"] > 0 and clipped["proj"] > 0  # both clips acted, so both are checked
    assert tokenizer.char_stats["truncated_words"] >= 1


def test_without_a_cnn_projection(tmp_path):
    """bilm-tf has no CNN_proj when the filters add up to projection_dim: the token layer is the highway output."""
    directory = write_bilm(tmp_path / "noproj", seed=1, projection=False)
    _, _, _, _, hidden = bertkit_layers(directory, ["the cat"])
    expected = reference_layers(directory / "weights.hdf5", ["the", "cat"], {"cell": 0, "proj": 0},
                                p=sum(c for _, c in FILTERS))
    for ours, theirs in zip(hidden, expected):
        torch.testing.assert_close(ours[0].double(), theirs, atol=1e-5, rtol=0)


def test_config_and_vocabulary_from_the_released_files(bilm_dir):
    raw = read_config(bilm_dir)
    assert (raw["projection_dim"], raw["lstm_dim"], raw["num_layers"], raw["cell_clip"], raw["proj_clip"]) == \
        (P, H, LAYERS, CELL_CLIP, PROJ_CLIP)
    assert raw["filters"] == FILTERS and raw["char_vocab_size"] == 262 and raw["residual"] is True
    tokenizer = load_tokenizer(bilm_dir)  # vocab.txt here is bilm-tf's word list, not a WordPiece vocabulary
    assert tokenizer.kind == "word" and tokenizer.byte_chars and raw["vocab_size"] == tokenizer.vocab_size == 9
    assert tokenizer.encode("the mat").tokens == ["<s>", "the", "mat", "</s>"]


def test_tokenizer_saved_and_read_back_keeps_byte_characters(bilm_dir, tmp_path):
    tokenizer = load_tokenizer(bilm_dir)
    tokenizer.save(tmp_path / "tok")
    again = load_tokenizer(tmp_path / "tok")
    words = ["<s>", "café", "x" * 70, "</s>", "<pad>"]
    np.testing.assert_array_equal(again.char_ids(words), tokenizer.char_ids(words))
    assert again.byte_chars and again.char_vocab_size == 262


@pytest.mark.parametrize("damage, message", [
    (lambda f: f.__delitem__("CNN_high_1/W_carry"), "no dataset 'CNN_high_1/W_carry'"),
    (lambda f: (f.__delitem__("CNN/b_cnn_2"), f.__setitem__("CNN/b_cnn_2", np.zeros(3, np.float32))),
     "CNN/b_cnn_2 has shape (3,), options.json makes it (16,)"),
])
def test_a_damaged_weights_file_is_one_line(tmp_path, damage, message):
    directory = write_bilm(tmp_path / "bad")
    with h5py.File(directory / "weights.hdf5", "a") as f:
        damage(f)
    with pytest.raises(CheckpointError, match=r"weights\.hdf5: " + message.replace("(", r"\(").replace(")", r"\)")):
        ElmoModel.from_pretrained(directory)


def test_options_with_a_tanh_cnn_are_refused(tmp_path):
    directory = write_bilm(tmp_path / "tanh")
    opts = options()
    opts["char_cnn"]["activation"] = "tanh"
    (directory / "options.json").write_text(json.dumps(opts))
    with pytest.raises(CheckpointError, match=r"options\.json: char_cnn\.activation 'tanh' is not supported"):
        read_config(directory)


def test_features_cli_on_a_released_directory(bilm_dir, tmp_path):
    (tmp_path / "in.txt").write_text("\n".join(SENTENCES[:2]) + "\n")
    out = tmp_path / "feats.npz"
    assert main(["features", "--model", str(bilm_dir), "--input", str(tmp_path / "in.txt"), "--out", str(out),
                 "--layers", "0,1,2", "--combine", "none"]) in (0, None)
    data = np.load(out)
    _, _, _, _, hidden = bertkit_layers(bilm_dir, SENTENCES[:2])
    features, lengths = data["features"], data["lengths"]
    for row in range(2):
        for k in range(3):
            np.testing.assert_allclose(features[row, :lengths[row], k], hidden[k][row, :lengths[row]].numpy(),
                                       atol=1e-6, rtol=0)


def test_frozen_finetune_on_a_released_directory(bilm_dir, tmp_path):
    """`finetune --frozen` trains a task model on the released ELMo's layers; the model directory it writes (a
    bertkit ELMo directory, its tokenizer on UTF-8 bytes) gives the released model's layers exactly."""
    rows = ["text\tlabel"] + [f"{w} the cat sat\t{'yes' if i % 2 else 'no'}"
                              for i, w in enumerate(["good", "bad", "fine", "awful", "nice", "poor"] * 2)]
    (tmp_path / "cls.tsv").write_text("\n".join(rows) + "\n")
    code = main(["finetune", "classify", "--model", str(bilm_dir), "--train", str(tmp_path / "cls.tsv"), "--dev",
                 str(tmp_path / "cls.tsv"), "--out", str(tmp_path / "run"), "--frozen", "--epochs", "1",
                 "--batch-size", "4", "--quiet"])
    assert code == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["features"]["encoder_layers"] == LAYERS + 1 and results["features"]["frozen"]
    _, _, _, _, released = bertkit_layers(bilm_dir, SENTENCES)
    _, _, _, _, saved = bertkit_layers(tmp_path / "run" / "model", SENTENCES)
    for ours, theirs in zip(saved, released):
        assert torch.equal(ours, theirs)
    # the directory keeps the released model's whitespace split (its tokenizer.json's pre-tokenizer); predict reads
    # it so, or as --words says
    from bertkit.tasks.finetune import load_predictor

    model_dir = tmp_path / "run" / "model"
    assert load_tokenizer(model_dir).words == "whitespace"
    assert load_predictor(model_dir).tokenizer.words == "whitespace"
    assert load_predictor(model_dir, words="bert").tokenizer.words == "bert"
    assert main(["predict", "classify", "--model", str(model_dir), "--text", "U.S. good", "--words", "bert",
                 "--json"]) == 0


def test_words_override_and_its_mistakes_are_one_line(bilm_dir, tmp_path, capsys):
    from bertkit.models.modeldir import ModelDir

    assert ModelDir.open(bilm_dir).tokenizer().words == "whitespace"
    tokenizer = ModelDir.open(bilm_dir).tokenizer(words="bert")
    assert tokenizer.words == "bert" and tokenizer.encode("U.S.").tokens == ["<s>", "U", ".", "S", ".", "</s>"]
    with pytest.raises(ValueError, match="--words must be one of whitespace, bert, got 'comma'"):
        tokenizer.split_words("comma")
    (tmp_path / "cls.tsv").write_text("text\tlabel\na b\tyes\n")
    capsys.readouterr()
    assert main(["finetune", "classify", "--model", str(bilm_dir), "--train", str(tmp_path / "cls.tsv"), "--dev",
                 str(tmp_path / "cls.tsv"), "--out", str(tmp_path / "run"), "--frozen", "--words", "comma"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--words must be whitespace or bert, got 'comma'" in err, err
    # the server's and similarity's tokenizer split as asked (whitespace by default)
    from bertkit.serve.engine import Engine

    assert Engine(bilm_dir, "embeddings").tokenizer.words == "whitespace"
    assert Engine(bilm_dir, "embeddings", words="bert").tokenizer.words == "bert"
    assert main(["similarity", "--model", str(bilm_dir), "--word", "U.S.", "the U.S. cat", "a U.S. mat",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == ["U.S.", "U.S."]


def test_words_on_a_model_without_a_word_tokenizer_is_one_line(tmp_path, capsys, tiny_tokenizer):
    from bertkit import BertConfig
    from bertkit.models import BertForMaskedLM

    BertForMaskedLM(BertConfig(vocab_size=tiny_tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=37)).save_pretrained(
        tmp_path / "bert", tokenizer=tiny_tokenizer)
    (tmp_path / "in.txt").write_text("a b\n")
    capsys.readouterr()
    assert main(["features", "--model", str(tmp_path / "bert"), "--input", str(tmp_path / "in.txt"), "--out",
                 str(tmp_path / "f.npz"), "--words", "whitespace"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--words is ELMo's" in err and "wordpiece" in err, err
    assert main(["features", "--model", str(tmp_path / "bert"), "--input", str(tmp_path / "in.txt"), "--out",
                 str(tmp_path / "f.npz"), "--stateful"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--stateful is ELMo's" in err, err
    assert not (tmp_path / "f.npz").exists()


BYTE_TOKENIZER = WordTokenizer(word_backend(read_bilm_vocab("no-such-vocab.txt")), [], W, byte_chars=True)
SPECIAL_WORDS = ("<s>", "</s>", "<pad>")


@settings(max_examples=200, deadline=None)
@given(words=st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=70).filter(
    lambda w: w not in SPECIAL_WORDS), min_size=1, max_size=4))
def test_byte_characters_are_elmo_character_mappers(words):
    """Any word (any script, any length) is spelt as AllenNLP's ELMoCharacterMapper spells it."""
    np.testing.assert_array_equal(BYTE_TOKENIZER.char_ids(["<s>", *words, "</s>"]), reference_char_ids(words))


def test_missing_h5py_is_one_line(bilm_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "h5py", None)  # import h5py raises ImportError
    with pytest.raises(CheckpointError, match=r"weights\.hdf5: reading a released ELMo needs h5py: "
                                              r"pip install 'bertkit\[elmo\]'$"):
        ElmoModel.from_pretrained(bilm_dir)
