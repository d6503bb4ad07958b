"""Our model computes exactly what transformers' BERT computes, on the same weights, in both directions.

Model-directory behaviour of its own (strict loading, atomic saves, permissions) is tested in
tests/test_checkpoint.py."""

import pytest
import torch

from bertkit import BertConfig, BertForPreTraining, BertModel
from bertkit.checkpoint import CheckpointError
from bertkit.models import IGNORE_INDEX, set_fast_paths

from conftest import minilm_dir, tiny_config

transformers = pytest.importorskip("transformers")
ATOL = 1e-5


def batch(config, B=3, T=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, config.vocab_size, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, T - 4:] = 0  # padding in two rows
    mask[2, T // 2:] = 0
    types = torch.zeros(B, T, dtype=torch.long)
    types[:, T // 3:] = 1  # both token types
    labels = torch.full((B, T), IGNORE_INDEX)
    labels[:, 1] = ids[:, 1]
    labels[0, 5] = 3
    nsp = torch.tensor([0, 1, 1][:B])
    return ids, mask, types, labels, nsp


def assert_same_outputs(ours, theirs, config):
    """Same outputs at every real position, on the default (unpadded) path and on the plain padded path, which
    matches transformers at padding positions too."""
    ids, mask, types, labels, nsp = batch(config)
    ours.eval(), theirs.eval()
    with torch.no_grad():
        b = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels,
                   next_sentence_label=nsp, output_hidden_states=True)
        for unpad in (True, False):
            set_fast_paths(ours, unpad=unpad)
            a = ours(ids, mask, types, labels=labels, next_sentence_label=nsp, output_hidden_states=True)
            where = mask.bool() if unpad else torch.ones_like(mask, dtype=torch.bool)  # padding too when plain
            assert_outputs_close(a, b, where)
        set_fast_paths(ours, unpad=True)
    with torch.no_grad():  # the pooled output, through the bare encoder of each
        pa = ours.bert(ids, mask, types).pooler_output
        pb = theirs.bert(input_ids=ids, attention_mask=mask, token_type_ids=types).pooler_output
    torch.testing.assert_close(pa, pb, atol=ATOL, rtol=0)


def assert_outputs_close(a, b, where):
    """Pretraining outputs a (bertkit) and b (transformers) agree at the (B, T) positions `where`."""
    assert len(a.hidden_states) == len(b.hidden_states)
    for x, y in zip(a.hidden_states, b.hidden_states):
        torch.testing.assert_close(x[where], y[where], atol=ATOL, rtol=0)
    torch.testing.assert_close(a.prediction_logits[where], b.prediction_logits[where], atol=ATOL, rtol=0)
    torch.testing.assert_close(a.seq_relationship_logits, b.seq_relationship_logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(a.loss, b.loss, atol=ATOL, rtol=0)


CONFIGS = {
    "tiny": tiny_config(),
    "tiny-tanh-gelu": tiny_config(hidden_act="gelu_new", layer_norm_eps=1e-6, type_vocab_size=3),
    "base-shaped": BertConfig(vocab_size=1000),  # BERT-base: L12 H768 A12, smaller vocabulary to stay quick
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_bertkit_directory_loads_in_transformers_with_same_outputs(name, tmp_path):
    config = CONFIGS[name]
    torch.manual_seed(1)
    ours = BertForPreTraining(config)
    ours.save_pretrained(tmp_path)
    theirs, info = transformers.BertForPreTraining.from_pretrained(str(tmp_path), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert_same_outputs(ours, theirs, config)


@pytest.mark.parametrize("name", ["tiny", "base-shaped"])
def test_transformers_directory_loads_in_bertkit_with_same_outputs(name, tmp_path):
    config = CONFIGS[name]
    torch.manual_seed(2)
    theirs = transformers.BertForPreTraining(transformers.BertConfig(**config.to_dict()))
    theirs.save_pretrained(str(tmp_path))
    ours = BertForPreTraining.from_pretrained(tmp_path)
    assert_same_outputs(ours, theirs, config)


def test_legacy_pytorch_bin_with_old_names_and_tied_decoder(tmp_path):
    """Old checkpoints: pytorch_model.bin, LayerNorm gamma/beta, stored decoder and position_ids buffer."""
    config = tiny_config()
    torch.manual_seed(3)
    theirs = transformers.BertForPreTraining(transformers.BertConfig(**config.to_dict())).eval()
    state = {}
    for k, v in theirs.state_dict().items():
        k = k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        state[k] = v.clone()
    state["cls.predictions.decoder.weight"] = theirs.bert.embeddings.word_embeddings.weight.clone()
    state["bert.embeddings.position_ids"] = torch.arange(config.max_position_embeddings)[None]
    torch.save(state, tmp_path / "pytorch_model.bin")
    config.to_json_file(tmp_path / "config.json")
    assert_same_outputs(BertForPreTraining.from_pretrained(tmp_path), theirs, config)


def test_bare_encoder_checkpoint(tmp_path):
    config = tiny_config()
    torch.manual_seed(4)
    theirs = transformers.BertModel(transformers.BertConfig(**config.to_dict())).eval()
    theirs.save_pretrained(str(tmp_path))
    ours = BertModel.from_pretrained(tmp_path).eval()
    ids, mask, types, *_ = batch(config)
    with torch.no_grad():
        a, b = ours(ids, mask, types), theirs(input_ids=ids, attention_mask=mask, token_type_ids=types)
    real = mask.bool()  # padding positions are 0 on the unpadded path, transformers computes them
    torch.testing.assert_close(a.last_hidden_state[real], b.last_hidden_state[real], atol=ATOL, rtol=0)
    torch.testing.assert_close(a.last_hidden_state[~real], torch.zeros_like(b.last_hidden_state[~real]))
    torch.testing.assert_close(a.pooler_output, b.pooler_output, atol=ATOL, rtol=0)
    with pytest.raises(CheckpointError, match="holds no pretraining heads .* BertModel.from_pretrained"):
        BertForPreTraining.from_pretrained(tmp_path)
    fresh = BertForPreTraining.from_pretrained(tmp_path, new_heads=True)
    torch.testing.assert_close(fresh.bert.embeddings.word.weight, ours.embeddings.word.weight)
    # A pretraining directory also loads as a bare encoder (heads dropped).
    BertForPreTraining(config).save_pretrained(tmp_path / "pt")
    assert isinstance(BertModel.from_pretrained(tmp_path / "pt"), BertModel)


def test_bertkit_bare_encoder_round_trip(tmp_path):
    torch.manual_seed(5)
    ours = BertModel(tiny_config()).eval()
    ours.save_pretrained(tmp_path)
    theirs = transformers.BertModel.from_pretrained(str(tmp_path)).eval()
    again = BertModel.from_pretrained(tmp_path)
    for (k, v), (k2, v2) in zip(ours.state_dict().items(), again.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)
    ids = torch.randint(0, 120, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).last_hidden_state, theirs(input_ids=ids).last_hidden_state,
                                   atol=ATOL, rtol=0)


def test_attention_probabilities_and_hidden_states():
    config = tiny_config()
    model = BertModel(config).eval()
    ids, mask, types, *_ = batch(config)
    with torch.no_grad():
        out = model(ids, mask, types, output_hidden_states=True, output_attentions=True)
        plain = model(ids, mask, types)
    assert len(out.hidden_states) == config.num_hidden_layers + 1 and len(out.attentions) == config.num_hidden_layers
    probs = out.attentions[0]
    assert probs.shape == (3, config.num_attention_heads, 12, 12)
    torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]))
    assert float(probs[1, :, :, -4:].abs().max()) == 0.0  # padding gets no attention
    real = mask.bool()  # with output_attentions the padded path runs; without, the unpadded one
    torch.testing.assert_close(out.last_hidden_state[real], plain.last_hidden_state[real], atol=ATOL, rtol=0)


def test_initialisation_follows_bert():
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.preset("mini", vocab_size=3000))
    w = model.bert.layers[0].ffn.up.weight.detach()
    assert abs(float(w.std()) - 0.02) < 0.001 and abs(float(w.mean())) < 0.001
    assert float(model.bert.layers[0].ffn.up.bias.detach().abs().max()) == 0.0
    assert float(model.mlm.bias.detach().abs().max()) == 0.0
    norm = model.bert.embeddings.norm
    assert torch.equal(norm.weight, torch.ones_like(norm.weight)) and float(norm.bias.detach().abs().max()) == 0.0
    assert model.mlm.word_embeddings.weight is model.bert.embeddings.word.weight  # tied


def test_losses_ignore_minus_100_and_sum():
    config = tiny_config()
    model = BertForPreTraining(config).eval()
    ids, mask, types, labels, nsp = batch(config)
    with torch.no_grad():
        out = model(ids, mask, types, labels=labels, next_sentence_label=nsp)
        logits = out.prediction_logits
        picked = labels != IGNORE_INDEX
        mlm = torch.nn.functional.cross_entropy(logits[picked], labels[picked])
        ns = torch.nn.functional.cross_entropy(out.seq_relationship_logits, nsp)
    torch.testing.assert_close(out.mlm_loss, mlm)
    torch.testing.assert_close(out.loss, mlm + ns)
    assert model(ids).loss is None


# ---- bad input -----------------------------------------------------------------------------------------------
def test_sequence_longer_than_positions():
    model = BertModel(tiny_config(max_position_embeddings=16))
    with pytest.raises(ValueError, match="sequence length 17 is longer than max_position_embeddings \\(16\\)"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_ids_outside_vocab_and_shape_mismatch():
    model = BertModel(tiny_config())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(torch.full((1, 4), 500))
    with pytest.raises(ValueError, match="attention_mask has shape"):
        model(torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 5, dtype=torch.long))


# ---- the real checkpoint ---------------------------------------------------------------------------------------
def test_real_minilm_checkpoint_matches_transformers():
    from bertkit import WordPieceTokenizer

    path = minilm_dir()
    ours = BertModel.from_pretrained(path).eval()
    theirs = transformers.BertModel.from_pretrained(str(path)).eval()
    tok = WordPieceTokenizer.from_pretrained(path)
    sentences = ["The cat sits outside.", "A man is playing guitar in the park, isn't he?",
                 "Résumé writing is hard.", "I love pasta"]
    encs = tok.encode_batch(sentences, padding=True)
    ids = torch.tensor([e.input_ids for e in encs])
    mask = torch.tensor([e.attention_mask for e in encs])
    hf_tok = transformers.BertTokenizer.from_pretrained(str(path))
    assert hf_tok(sentences, padding=True)["input_ids"] == ids.tolist()
    with torch.no_grad():
        a = ours(ids, mask, output_hidden_states=True)
        b = theirs(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    real = mask.bool()
    for x, y in zip(a.hidden_states, b.hidden_states):
        torch.testing.assert_close(x[real], y[real], atol=ATOL, rtol=0)
    torch.testing.assert_close(a.pooler_output, b.pooler_output, atol=ATOL, rtol=0)


def test_sparse_mlm_prediction_gives_the_same_loss_and_gradients():
    config = tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(6)
    model = BertForPreTraining(config)
    ids, mask, types, labels, nsp = batch(config)
    dense = model(ids, mask, types, labels=labels, next_sentence_label=nsp)
    dense.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    at = labels != IGNORE_INDEX
    sparse = model(ids, mask, types, labels=labels, next_sentence_label=nsp, predict_at=at)
    sparse.loss.backward()
    assert sparse.prediction_logits.shape == (int(at.sum()), config.vocab_size)
    torch.testing.assert_close(sparse.prediction_logits, dense.prediction_logits[at], atol=1e-6, rtol=0)
    torch.testing.assert_close(sparse.loss, dense.loss, atol=1e-6, rtol=0)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], atol=1e-6, rtol=1e-5)
