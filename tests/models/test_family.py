"""The BERT family on one implementation: RoBERTa, ALBERT, ELECTRA, DistilBERT and a causal encoder each compute
exactly what transformers' model of that family computes, on the same weights, in both directions."""

import json

import pytest
import torch

from bertkit.checkpoint import CheckpointError
from bertkit.config import BertConfig
from bertkit.models import (IGNORE_INDEX, BertForCausalLM, BertForMaskedLM, BertForPreTraining,
                            BertForReplacedTokenDetection, BertModel)
from bertkit.models.bert import position_ids

transformers = pytest.importorskip("transformers")
ATOL = 1e-5
TINY = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64)


def family_config(model_type: str, **overrides) -> BertConfig:
    fields = dict(TINY)
    if model_type == "roberta":
        fields.update(type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)
    if model_type == "albert":
        fields.update(embedding_size=16, num_hidden_groups=1, hidden_act="gelu_new", bos_token_id=2, eos_token_id=3)
    if model_type == "electra":
        fields.update(embedding_size=16)
    fields.update(overrides)
    return BertConfig.for_family(model_type, **fields)


def randomize(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter random (LayerNorms and biases too), so parity cannot hide behind ones and zeros."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if p.dim() == 1 and p.shape[0] <= 64 else 0.0))
    return model.eval()


def batch(config: BertConfig, B=3, T=12, seed=0, pairs=True):
    """Ids with padding (rows 1 and 2) written as the pad id, as a tokenizer pads; both token types if any."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, config.vocab_size, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, T - 4:] = 0
    mask[2, T // 2:] = 0
    ids[mask == 0] = config.pad_token_id
    types = torch.zeros(B, T, dtype=torch.long)
    if pairs and config.type_vocab_size > 1:
        types[:, T // 3:] = 1
    types[mask == 0] = 0
    labels = torch.full((B, T), IGNORE_INDEX)
    labels[:, 1] = ids[:, 1]
    labels[0, 5] = 3
    return ids, mask, types, labels


def close(a, b, mask=None):
    """a == b within ATOL; with a (B, T) `mask`, at its real positions only (bertkit's unpadded path leaves 0 at
    padding positions, where transformers computes something nobody reads)."""
    if mask is not None:
        a, b = a[mask.bool()], b[mask.bool()]
    torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


def no_loading_problems(info):
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info


# ==================================================================================================================
# RoBERTa
# ==================================================================================================================
def test_roberta_positions_are_transformers_padding_offset_positions():
    config = family_config("roberta")
    ids, *_ = batch(config)
    expected = transformers.models.roberta.modeling_roberta.RobertaEmbeddings.create_position_ids_from_input_ids(
        ids, config.pad_token_id)
    assert torch.equal(position_ids(ids, config), expected)
    assert position_ids(ids, config)[2].tolist() == [2, 3, 4, 5, 6, 7, 1, 1, 1, 1, 1, 1]
    assert config.max_length == 64 - 2


def assert_same_mlm(ours, theirs, config, types=True):
    ids, mask, tt, labels = batch(config)
    kwargs = {"token_type_ids": tt} if types else {}
    with torch.no_grad():
        a = ours(ids, mask, tt if types else None, labels=labels, output_hidden_states=True)
        b = theirs(input_ids=ids, attention_mask=mask, labels=labels, output_hidden_states=True, **kwargs)
    close(a.hidden_states[-1], b.hidden_states[-1], mask)  # the sequence output
    close(a.prediction_logits, b.logits, mask)
    close(a.loss, b.loss)


def test_transformers_roberta_directory_loads_in_bertkit(tmp_path):
    config = family_config("roberta")
    theirs = randomize(transformers.RobertaForMaskedLM(transformers.RobertaConfig(**config.to_dict())), 1)
    theirs.save_pretrained(str(tmp_path))
    ours = BertForMaskedLM.from_pretrained(tmp_path).eval()
    assert ours.config == config
    assert_same_mlm(ours, theirs, config)
    # The family's pretraining model is RobertaForMaskedLM itself: no sentence-pair head.
    pretraining = BertForPreTraining.from_pretrained(tmp_path).eval()
    assert pretraining.nsp is None and pretraining.bert.pooler is None
    assert_same_mlm(pretraining, theirs, config)


def test_bertkit_roberta_directory_loads_in_transformers(tmp_path):
    config = family_config("roberta")
    ours = randomize(BertForMaskedLM(config), 2)
    ours.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["model_type"] == "roberta" and raw["architectures"] == ["RobertaForMaskedLM"]
    assert (raw["pad_token_id"], raw["bos_token_id"], raw["eos_token_id"], raw["type_vocab_size"]) == (1, 0, 2, 1)
    theirs, info = transformers.RobertaForMaskedLM.from_pretrained(str(tmp_path), output_loading_info=True)
    no_loading_problems(info)
    assert_same_mlm(ours, theirs.eval(), config)
    assert transformers.AutoConfig.from_pretrained(str(tmp_path)).model_type == "roberta"


def test_roberta_bare_encoder_with_pooler(tmp_path):
    config = family_config("roberta")
    theirs = randomize(transformers.RobertaModel(transformers.RobertaConfig(**config.to_dict())), 3)
    theirs.save_pretrained(str(tmp_path))
    ours = BertModel.from_pretrained(tmp_path).eval()
    ids, mask, _, _ = batch(config)
    with torch.no_grad():
        a, b = ours(ids, mask), theirs(input_ids=ids, attention_mask=mask)
    close(a.last_hidden_state, b.last_hidden_state, mask)
    close(a.pooler_output, b.pooler_output)
    ours.save_pretrained(tmp_path / "again")
    _, info = transformers.RobertaModel.from_pretrained(str(tmp_path / "again"), output_loading_info=True)
    no_loading_problems(info)


def test_roberta_refuses_too_long_input_and_second_token_type():
    model = BertModel(family_config("roberta", max_position_embeddings=10))
    with pytest.raises(ValueError, match=r"sequence length 9 .* less the 2 that padding-offset positions skip"):
        model(torch.full((1, 9), 7))
    model(torch.full((1, 8), 7))
    with pytest.raises(ValueError, match="type_vocab_size is 1"):
        model(torch.full((1, 4), 7), token_type_ids=torch.ones(1, 4, dtype=torch.long))


# ==================================================================================================================
# Configuration of the family
# ==================================================================================================================
@pytest.mark.parametrize("model_type, hf_class", [
    ("bert", "BertConfig"), ("roberta", "RobertaConfig"), ("albert", "AlbertConfig"), ("electra", "ElectraConfig"),
    ("distilbert", "DistilBertConfig")])
def test_config_json_round_trips_through_transformers(model_type, hf_class, tmp_path):
    config = family_config(model_type)
    config.to_json_file(tmp_path / "config.json")
    hf = getattr(transformers, hf_class).from_json_file(str(tmp_path / "config.json"))
    assert hf.model_type == model_type
    for key, value in config.to_dict().items():
        assert getattr(hf, key) == value, key
    hf.save_pretrained(tmp_path / "hf")
    assert BertConfig.from_json_file(tmp_path / "hf" / "config.json") == config
    assert BertConfig.from_dict(config.to_dict()) == config


def test_electra_embedding_size_equal_to_hidden_size_means_no_projection():
    assert BertConfig.for_family("electra", **TINY, embedding_size=32) == BertConfig.for_family("electra", **TINY)
    assert BertConfig.for_family("albert", **TINY, embedding_size=32).embedding_size == 32  # ALBERT always projects


@pytest.mark.parametrize("fields, message", [
    (dict(model_type="gpt2"), "model_type 'gpt2' is not supported"),
    (dict(embedding_size=16), "embedding_size=16 cannot be written in the 'bert' format; families with "
                              "embedding_size: albert, electra"),
    (dict(num_hidden_groups=1), "num_hidden_groups=1 cannot be written in the 'bert' format"),
    (dict(model_type="roberta"), "padding_offset_positions must be True for model_type 'roberta'"),
    (dict(model_type="albert"), "always projects its embeddings"),
    (dict(type_vocab_size=0), "type_vocab_size 0 .* DistilBERT"),
    (dict(model_type="albert", embedding_size=8, num_hidden_groups=3), r"num_hidden_groups must be in \[1, "),
])
def test_family_fields_that_cannot_be_written_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        BertConfig(**{**TINY, **fields})


def test_unsupported_family_keys_are_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "albert", "inner_group_num": 2, "embedding_size": 8}))
    with pytest.raises(ValueError, match="inner_group_num=2 is not supported"):
        BertConfig.from_json_file(path)
    path.write_text(json.dumps({"model_type": "distilbert", "sinusoidal_pos_embds": True}))
    with pytest.raises(ValueError, match="sinusoidal_pos_embds=True is not supported"):
        BertConfig.from_json_file(path)
    path.write_text(json.dumps({"model_type": "roberta", "embedding_size": 8}))
    with pytest.raises(ValueError, match=r"unknown config keys \['embedding_size'\]"):
        BertConfig.from_json_file(path)
    path.write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="not a BERT-family config"):
        BertConfig.from_json_file(path)


# ==================================================================================================================
# ALBERT
# ==================================================================================================================
ALBERT_CONFIGS = {
    "one-group": family_config("albert"),  # ALBERT proper: one layer's weights applied L times
    "two-groups-of-two": family_config("albert", num_hidden_layers=4, num_hidden_groups=2),
    "no-sharing": family_config("albert", num_hidden_groups=None),
}


def assert_same_albert(ours, theirs, config):
    ids, mask, types, labels = batch(config)
    order = torch.tensor([0, 1, 1])
    with torch.no_grad():
        a = ours(ids, mask, types, labels=labels, next_sentence_label=order, output_hidden_states=True)
        b = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels,
                   sentence_order_label=order)
        seq = theirs.albert(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    close(a.hidden_states[-1], seq, mask)
    close(a.prediction_logits, b.prediction_logits, mask)
    close(a.seq_relationship_logits, b.sop_logits)
    close(a.loss, b.loss)


@pytest.mark.parametrize("name", list(ALBERT_CONFIGS))
def test_transformers_albert_directory_loads_in_bertkit(name, tmp_path):
    config = ALBERT_CONFIGS[name]
    theirs = randomize(transformers.AlbertForPreTraining(transformers.AlbertConfig(**config.to_dict())), 4)
    theirs.save_pretrained(str(tmp_path))
    ours = BertForPreTraining.from_pretrained(tmp_path).eval()
    assert ours.config == config
    assert_same_albert(ours, theirs, config)


@pytest.mark.parametrize("name", list(ALBERT_CONFIGS))
def test_bertkit_albert_directory_loads_in_transformers(name, tmp_path):
    config = ALBERT_CONFIGS[name]
    ours = randomize(BertForPreTraining(config), 5)
    ours.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["architectures"] == ["AlbertForPreTraining"] and raw["inner_group_num"] == 1
    assert raw["num_hidden_groups"] == config.num_layer_weights and raw["embedding_size"] == 16
    theirs, info = transformers.AlbertForPreTraining.from_pretrained(str(tmp_path), output_loading_info=True)
    no_loading_problems(info)
    assert_same_albert(ours, theirs.eval(), config)
    # The MLM-only model and the bare encoder come out of the same directory.
    mlm = BertForMaskedLM.from_pretrained(tmp_path).eval()
    ids, mask, types, _ = batch(config)
    with torch.no_grad():
        close(mlm(ids, mask, types).prediction_logits, ours(ids, mask, types).prediction_logits)
    assert BertModel.from_pretrained(tmp_path).pooler is not None


def test_albert_shares_one_layer_across_depth():
    model = BertModel(family_config("albert", num_hidden_layers=6))
    assert len(model.layers) == 1
    ids = torch.randint(5, 120, (2, 7))
    out = model(ids, output_hidden_states=True)
    assert len(out.hidden_states) == 7  # embeddings + 6 applications of the one layer
    grouped = BertConfig.for_family("albert", **{**TINY, "embedding_size": 16, "num_hidden_layers": 6,
                                                 "num_hidden_groups": 3})
    assert [grouped.layer_weights_index(i) for i in range(6)] == [0, 0, 1, 1, 2, 2]


def layer_parameters(H: int, I: int) -> int:
    """One post-LN encoder layer: Q, K, V, O (H x H + H each), two LayerNorms (2H each), FFN H -> I -> H."""
    return 4 * (H * H + H) + 2 * (2 * H) + (H * I + I) + (I * H + H)


def test_albert_parameter_count_falls_as_the_paper_says():
    """ALBERT section 3.1: factorised embeddings take V*E + E*H instead of V*H, and sharing keeps one layer's
    weights instead of L. Counted exactly on a BERT and an ALBERT of the same V, H, L (positions and token
    types are E wide in ALBERT too)."""
    V, H, L, I, P, S, E = 1000, 64, 6, 256, 64, 2, 16
    sizes = dict(vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=4, intermediate_size=I,
                 max_position_embeddings=P, type_vocab_size=S)
    bert = BertModel(BertConfig(**sizes))
    albert = BertModel(BertConfig.for_family("albert", **sizes, embedding_size=E, num_hidden_groups=1))
    pooler = H * H + H
    bert_embeddings = V * H + P * H + S * H + 2 * H
    albert_embeddings = V * E + P * E + S * E + 2 * E + (E * H + H)  # tables E wide, then the E -> H projection
    assert bert.num_parameters() == bert_embeddings + L * layer_parameters(H, I) + pooler
    assert albert.num_parameters() == albert_embeddings + 1 * layer_parameters(H, I) + pooler
    # The paper's two savings, term by term.
    assert bert_embeddings - albert_embeddings == (V * H - (V * E + E * H)) + (P + S) * (H - E) + 2 * (H - E) - H
    assert bert.num_parameters() - albert.num_parameters() == (
        bert_embeddings - albert_embeddings + (L - 1) * layer_parameters(H, I))
    # transformers counts the same.
    hf = transformers.AlbertModel(transformers.AlbertConfig(**albert.config.to_dict()))
    assert sum(p.numel() for p in hf.parameters()) == albert.num_parameters()
    # With G groups, G layers' weights.
    grouped = BertModel(BertConfig.for_family("albert", **sizes, embedding_size=E, num_hidden_groups=3))
    assert grouped.num_parameters() == albert_embeddings + 3 * layer_parameters(H, I) + pooler


# ==================================================================================================================
# ELECTRA
# ==================================================================================================================
ELECTRA_CONFIGS = {
    "projected": family_config("electra"),  # E = 16 < H = 32: embeddings_project
    "unprojected": family_config("electra", embedding_size=None, hidden_act="gelu_new"),
}


def assert_same_discriminator(ours, theirs, config):
    ids, mask, types, _ = batch(config)
    replaced = (torch.rand(ids.shape, generator=torch.Generator().manual_seed(9)) < 0.3).long()
    with torch.no_grad():
        a = ours(ids, mask, types, labels=replaced, output_hidden_states=True)
        b = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=replaced,
                   output_hidden_states=True)
    close(a.hidden_states[-1], b.hidden_states[-1], mask)
    close(a.logits, b.logits, mask)
    close(a.loss, b.loss)


@pytest.mark.parametrize("name", list(ELECTRA_CONFIGS))
def test_transformers_electra_discriminator_loads_in_bertkit(name, tmp_path):
    config = ELECTRA_CONFIGS[name]
    theirs = randomize(transformers.ElectraForPreTraining(transformers.ElectraConfig(**config.to_dict())), 6)
    theirs.save_pretrained(str(tmp_path))
    ours = BertForReplacedTokenDetection.from_pretrained(tmp_path).eval()
    assert ours.config == config and (ours.bert.project is None) == (name == "unprojected")
    assert_same_discriminator(ours, theirs, config)


@pytest.mark.parametrize("name", list(ELECTRA_CONFIGS))
def test_bertkit_electra_discriminator_loads_in_transformers(name, tmp_path):
    config = ELECTRA_CONFIGS[name]
    ours = randomize(BertForReplacedTokenDetection(config), 7)
    ours.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["architectures"] == ["ElectraForPreTraining"] and raw["embedding_size"] == config.embedding_width
    theirs, info = transformers.ElectraForPreTraining.from_pretrained(str(tmp_path), output_loading_info=True)
    no_loading_problems(info)
    assert_same_discriminator(ours, theirs.eval(), config)
    BertModel(config).save_pretrained(tmp_path / "bare")
    with pytest.raises(CheckpointError, match=r"holds no discriminator heads \('discriminator_predictions.\*'"):
        BertForReplacedTokenDetection.from_pretrained(tmp_path / "bare")


def test_electra_generator_is_electra_for_masked_lm(tmp_path):
    from bertkit.models import generator_config_for

    config = generator_config_for(family_config("electra"), fraction=0.5)
    assert (config.hidden_size, config.num_attention_heads, config.intermediate_size, config.embedding_size) == (
        16, 1, 64, None)  # E = 16 = the generator's H: no projection
    ours = randomize(BertForMaskedLM(config), 8)
    ours.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["ElectraForMaskedLM"]
    theirs, info = transformers.ElectraForMaskedLM.from_pretrained(str(tmp_path), output_loading_info=True)
    no_loading_problems(info)
    assert_same_mlm(ours, theirs.eval(), config)


def electra_pair(seed=0):
    from bertkit.models import GeneratorDiscriminator

    torch.manual_seed(seed)
    return GeneratorDiscriminator(family_config("electra"), generator_fraction=0.5)


def test_generator_and_discriminator_share_embeddings_and_save_both(tmp_path):
    from bertkit.models import GeneratorDiscriminator

    model = electra_pair()
    shared = model.discriminator.bert.embeddings
    assert model.generator.bert.embeddings is shared and model.generator.mlm.word_embeddings is shared.word
    # E = 16: the discriminator (H = 32) projects, the generator (H = 16) needs no projection.
    assert model.discriminator.bert.project is not None and model.generator.bert.project is None
    generator_only = sum(p.numel() for n, p in model.generator.named_parameters() if ".embeddings." not in n)
    assert model.num_parameters() == model.discriminator.num_parameters() + generator_only
    model.save_pretrained(tmp_path)
    assert (tmp_path / "generator" / "config.json").is_file()
    again = GeneratorDiscriminator.from_pretrained(tmp_path)
    assert again.generator.bert.embeddings is again.discriminator.bert.embeddings
    for (k, v), (k2, v2) in zip(model.state_dict().items(), again.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k


def test_replaced_token_detection_labels_by_hand():
    """The generator is made certain of token 7; a masked 7 stays 'original', a masked 9 becomes 'replaced'."""
    from bertkit.training.objectives import ElectraObjective

    model = electra_pair().eval()
    with torch.no_grad():
        model.generator.mlm.bias.fill_(-1e4)
        model.generator.mlm.bias[7] = 1e4  # softmax is one-hot on 7, so every sample is 7
    original = torch.tensor([[0, 7, 9, 11, 12, 2], [0, 9, 13, 2, 1, 1]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    labels = torch.full_like(original, IGNORE_INDEX)
    labels[0, 1], labels[0, 2], labels[1, 1] = 7, 9, 9  # positions picked for prediction
    inputs = original.clone()
    inputs[labels != IGNORE_INDEX] = 4  # [MASK]
    out = model(inputs, mask, torch.zeros_like(inputs), labels=labels)
    assert out.corrupted_ids.tolist() == [[0, 7, 7, 11, 12, 2], [0, 7, 13, 2, 1, 1]]
    assert out.rtd_labels.tolist() == [[0, 0, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0]]
    assert out.mlm_labels.tolist() == [7, 9, 9]
    batch_ = {"input_ids": inputs, "attention_mask": mask, "token_type_ids": torch.zeros_like(inputs),
              "labels": labels}
    objective = ElectraObjective()
    assert objective.counts(batch_) == {"mlm_loss": 3.0, "rtd_loss": 10.0}
    torch.manual_seed(0)
    result = objective(model, batch_)
    real = mask == 1
    bce = torch.nn.functional.binary_cross_entropy_with_logits(out.rtd_logits[real], out.rtd_labels[real],
                                                               reduction="sum")
    torch.testing.assert_close(result["rtd_loss"][0], 50 * bce)  # padding excluded, weight 50
    assert float(result["replaced_fraction"][0]) == 2.0 and float(result["rtd_loss"][1]) == 10.0


def synthetic_batches(vocab=120, B=8, T=16, count=4, seed=0):
    """Fixed masked batches over a tiny repetitive language (so a few steps can learn something)."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        start = torch.randint(5, 40, (B, 1), generator=g)
        ids = 5 + (start + torch.arange(T)) % (vocab - 5)  # counting sequences: each token predicts the next
        picked = torch.rand(B, T, generator=g) < 0.15
        picked[:, 3] = True
        labels = torch.where(picked, ids, torch.full_like(ids, IGNORE_INDEX))
        mask = torch.ones(B, T, dtype=torch.long)
        batches.append({"input_ids": torch.where(picked, torch.full_like(ids, 4), ids), "labels": labels,
                        "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)})
    return batches


def train_steps(model, objective, batches, steps=30, lr=2e-3):
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    model.train()
    for step in range(steps):
        b = batches[step % len(batches)]
        out = objective(model, b)
        loss = sum(v[0] / v[1] for k, v in out.items() if k.endswith("_loss"))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def test_electra_objective_loss_falls():
    from bertkit.training.objectives import ElectraObjective

    model = electra_pair(seed=1)
    losses = train_steps(model, ElectraObjective(), synthetic_batches())
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.8 * first, losses


class _Batches(list):
    """The trainer's batch-stream protocol over a fixed list (no resume needed here)."""

    def load_state_dict(self, state):  # pragma: no cover - not resumed in these tests
        raise AssertionError("not resumable")


def test_electra_runs_in_the_trainer_and_saves_the_discriminator(tmp_path):
    from bertkit.training.objectives import ElectraObjective
    from bertkit.training.trainer import TrainConfig, train

    model = electra_pair(seed=2)
    batches = _Batches(synthetic_batches(count=3))
    config = TrainConfig(max_steps=3, warmup_steps=1, learning_rate=1e-3, progress=False, device="cpu",
                         precision="fp32", log_every=1, save_every=1000)
    result = train(model, ElectraObjective(), batches, config, tmp_path / "run",
                   on_save=lambda m, step: m.save_pretrained(tmp_path / "run" / "model"))
    assert result.step == 3 and {"mlm_loss", "rtd_loss", "rtd_accuracy"} <= set(result.last_metrics)
    # The saved discriminator is a transformers ElectraForPreTraining that agrees with the trained one.
    theirs = transformers.ElectraForPreTraining.from_pretrained(str(tmp_path / "run" / "model")).eval()
    ids, mask, types, _ = batch(model.config)
    with torch.no_grad():
        close(model.discriminator.eval()(ids, mask, types).logits,
              theirs(input_ids=ids, attention_mask=mask, token_type_ids=types).logits, mask)


# ==================================================================================================================
# Causal (GPT-style) encoder
# ==================================================================================================================
def test_causal_mask_hides_the_future_and_only_with_causal():
    torch.manual_seed(0)
    bidirectional = BertModel(BertConfig(**TINY, hidden_dropout_prob=0.0)).eval()
    causal = BertModel(BertConfig(**TINY, hidden_dropout_prob=0.0, causal=True)).eval()
    causal.load_state_dict(bidirectional.state_dict())  # the same weights; only the mask differs
    ids = torch.randint(5, 120, (2, 10))
    changed = ids.clone()
    changed[:, 6:] = torch.randint(5, 120, (2, 4))
    with torch.no_grad():
        a, b = causal(ids).last_hidden_state, causal(changed).last_hidden_state
        c, d = bidirectional(ids).last_hidden_state, bidirectional(changed).last_hidden_state
        probs = causal(ids, output_attentions=True).attentions[0]
    assert torch.equal(a[:, :6], b[:, :6])  # positions before the change do not move, not even by rounding
    assert not torch.allclose(a[:, 6:], b[:, 6:])
    assert not torch.allclose(c[:, :6], d[:, :6])  # without the causal mask every position sees the change
    assert float(probs.triu(1).abs().max()) == 0.0  # no attention to later positions
    close(a, causal(ids, torch.ones_like(ids)).last_hidden_state)  # padding mask and causal mask combine


@pytest.mark.parametrize("direction", ["theirs-to-ours", "ours-to-theirs"])
def test_causal_lm_matches_transformers_bert_lm_head_model(direction, tmp_path):
    config = BertConfig(**TINY, causal=True)
    if direction == "theirs-to-ours":
        hf_config = transformers.BertConfig(**config.to_dict())
        assert hf_config.is_decoder
        theirs = randomize(transformers.BertLMHeadModel(hf_config), 10)
        theirs.save_pretrained(str(tmp_path))
        ours = BertForCausalLM.from_pretrained(tmp_path).eval()
    else:
        ours = randomize(BertForCausalLM(config), 11)
        ours.save_pretrained(tmp_path)
        assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["BertLMHeadModel"]
        theirs, info = transformers.BertLMHeadModel.from_pretrained(str(tmp_path), output_loading_info=True)
        no_loading_problems(info)
        theirs.eval()
    assert ours.config == config
    ids, mask, types, _ = batch(config)
    labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
    with torch.no_grad():
        a = ours(ids, mask, types, labels=labels)
        b = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels, use_cache=False)
    real = mask.bool()  # padded query rows are not compared: they attend to nothing real after the text
    close(a.logits[real], b.logits[real])
    close(a.loss, b.loss)


def test_causal_lm_needs_a_causal_config():
    with pytest.raises(ValueError, match="needs a causal config"):
        BertForCausalLM(BertConfig(**TINY))


def test_greedy_generation_reproduces_a_memorised_sequence():
    from bertkit.training.objectives import CausalLMObjective

    torch.manual_seed(0)
    config = BertConfig(**TINY, causal=True, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForCausalLM(config)
    sequence = torch.tensor([[2, 17, 42, 9, 88, 23, 61, 5, 100, 33, 71, 3]])
    # The objective reads MLM-style batches and undoes their masking: mask a few positions to show it does.
    masked = sequence.clone()
    masked[0, [3, 7]] = 4
    labels = torch.full_like(sequence, IGNORE_INDEX)
    labels[0, [3, 7]] = sequence[0, [3, 7]]
    batches = [{"input_ids": masked, "labels": labels, "attention_mask": torch.ones_like(sequence),
                "token_type_ids": torch.zeros_like(sequence)}]
    losses = train_steps(model, CausalLMObjective(), batches, steps=60, lr=1e-2)
    assert losses[-1] < 0.1 * losses[0], losses
    out = model.generate(sequence[:, :2], max_new_tokens=10)
    assert out.tolist() == sequence.tolist()
    # Sampling among the single best token is greedy; seeded sampling repeats itself.
    assert model.generate(sequence[:, :2], 10, temperature=1.0, top_k=1).tolist() == sequence.tolist()
    runs = [model.generate(sequence[:, :2], 10, temperature=2.0, generator=torch.Generator().manual_seed(3))
            for _ in range(2)]
    assert torch.equal(runs[0], runs[1]) and runs[0].shape == (1, 12)
    assert model.generate(sequence[:, :2], 10, eos_token_id=int(sequence[0, 4])).shape == (1, 5)


def test_generate_cli_continues_a_memorised_text(tmp_path, capsys):
    from bertkit import WordPieceTokenizer
    from bertkit.cli import main
    from bertkit.training.objectives import CausalLMObjective

    tok = WordPieceTokenizer.train(texts=["the cat sat on the mat", "a dog ran in the park"] * 5, vocab_size=60,
                                   min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    model = BertForCausalLM(BertConfig(**{**TINY, "vocab_size": tok.vocab_size}, causal=True,
                                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    ids = torch.tensor([tok.encode("the cat sat on the mat").input_ids])
    batches = [{"input_ids": ids, "labels": torch.full_like(ids, IGNORE_INDEX), "attention_mask": torch.ones_like(ids),
                "token_type_ids": torch.zeros_like(ids)}]
    train_steps(model, CausalLMObjective(), batches, steps=80, lr=1e-2)
    model.save_pretrained(tmp_path / "lm")
    tok.save(tmp_path / "lm")
    main(["generate", "--model", str(tmp_path / "lm"), "--json", "the cat"])
    out = json.loads(capsys.readouterr().out)
    assert out["continuation"] == "sat on the mat" and out["ids"][-1] == tok.sep_id  # stopped at the separator
    BertForPreTraining(BertConfig(**TINY)).save_pretrained(tmp_path / "mlm")
    tok.save(tmp_path / "mlm")
    assert main(["generate", "--model", str(tmp_path / "mlm"), "the cat"]) == 2
    assert "mlm: not a causal model" in capsys.readouterr().err


# ==================================================================================================================
# DistilBERT (loading and saving; no token types, no pooler)
# ==================================================================================================================
@pytest.mark.parametrize("direction", ["theirs-to-ours", "ours-to-theirs"])
def test_distilbert_masked_lm_matches_transformers(direction, tmp_path):
    config = family_config("distilbert", hidden_act="gelu_new")
    if direction == "theirs-to-ours":
        theirs = randomize(transformers.DistilBertForMaskedLM(transformers.DistilBertConfig(**config.to_dict())), 12)
        theirs.save_pretrained(str(tmp_path))
        ours = BertForMaskedLM.from_pretrained(tmp_path).eval()
    else:
        ours = randomize(BertForMaskedLM(config), 13)
        ours.save_pretrained(tmp_path)
        theirs, info = transformers.DistilBertForMaskedLM.from_pretrained(str(tmp_path), output_loading_info=True)
        no_loading_problems(info)
        theirs.eval()
    assert ours.config == config and ours.bert.embeddings.token_type is None and ours.bert.pooler is None
    assert_same_mlm(ours, theirs, config, types=False)
    ids, mask, _, _ = batch(config)
    with torch.no_grad():  # token types from a BERT-style pair encoding are ignored, as DistilBERT ignores them
        close(ours(ids, mask, torch.ones_like(ids)).prediction_logits, ours(ids, mask).prediction_logits)


def test_distilbert_bare_encoder(tmp_path):
    config = family_config("distilbert")
    theirs = randomize(transformers.DistilBertModel(transformers.DistilBertConfig(**config.to_dict())), 14)
    theirs.save_pretrained(str(tmp_path))
    ours = BertModel.from_pretrained(tmp_path).eval()
    ids, mask, _, _ = batch(config)
    with torch.no_grad():
        close(ours(ids, mask).last_hidden_state, theirs(input_ids=ids, attention_mask=mask).last_hidden_state, mask)
    from bertkit.models import BertForSequenceClassification

    # No pooler to read: the classifier starts DistilBERT's own head (pre_classifier) fresh on the encoder.
    classifier = BertForSequenceClassification.from_pretrained(tmp_path, num_labels=2).eval()
    assert classifier.bert.pooler is None and classifier.summary.weight.shape == (config.hidden_size,) * 2
    with torch.no_grad():
        close(classifier.bert(ids, mask).last_hidden_state, ours(ids, mask).last_hidden_state, mask)


# ==================================================================================================================
# Recipes: the family through the pretraining driver's configuration
# ==================================================================================================================
@pytest.mark.parametrize("recipe, model_type, architecture, pair", [
    ("roberta-mini", "roberta", "RobertaForMaskedLM", False), ("albert-mini", "albert", "AlbertForPreTraining", True),
    ("roberta-base", "roberta", "RobertaForMaskedLM", False), ("albert-base", "albert", "AlbertForPreTraining", True)])
def test_recipes_build_the_family_model_through_pretrain(recipe, model_type, architecture, pair, tmp_path):
    from bertkit.models.registry import OBJECTIVES
    from bertkit.training.objectives import MaskedLMObjective
    from bertkit.training.pretrain import build_pretraining_model, resolve_config

    config = resolve_config(recipe, {"preset": "tiny"})
    model = build_pretraining_model(config, vocab_size=120)[0]
    assert model.config.model_type == model_type and (model.nsp is not None) == pair
    objective = MaskedLMObjective(pair_task=OBJECTIVES[config.data.objective].pair_task)
    b = synthetic_batches(count=1, B=4)[0]
    b["next_sentence_label"] = torch.tensor([0, 1, 0, 1])
    out = objective(model, b)
    assert float(out["mlm_loss"][1]) == float((b["labels"] != IGNORE_INDEX).sum()) and ("sop_loss" in out) == pair
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [architecture]
    _, info = getattr(transformers, architecture).from_pretrained(str(tmp_path), output_loading_info=True)
    no_loading_problems(info)


@pytest.mark.parametrize("recipe, preset, cls, model_type", [
    ("electra-base", "base", "GeneratorDiscriminator", "electra"), ("electra-mini", "mini", "GeneratorDiscriminator",
                                                                     "electra"),
    ("causal-mini", "mini", "BertForCausalLM", "roberta"), ("roberta-base", "base", "BertForPreTraining", "roberta"),
    ("albert-base", "base", "BertForPreTraining", "albert"), ("bert-base", "base", "BertForPreTraining", "bert")])
def test_paper_and_cpu_recipes_resolve_to_their_model(recipe, preset, cls, model_type):
    from bertkit.training.pretrain import build_pretraining_model, resolve_config

    config = resolve_config(recipe)
    assert config.preset == preset
    model = build_pretraining_model(resolve_config(recipe, {"preset": "tiny"}), vocab_size=120)[0]
    assert type(model).__name__ == cls
    inner = model.discriminator if cls == "GeneratorDiscriminator" else model
    assert inner.config.model_type == model_type and inner.config.causal == (recipe == "causal-mini")


def test_electra_recipe_and_builder():
    from bertkit.models import GeneratorDiscriminator
    from bertkit.training.objectives import ElectraObjective, build_pretraining
    from bertkit.training.pretrain import load_recipe

    recipe = load_recipe("electra-mini")
    config = BertConfig.preset("tiny", vocab_size=120, **recipe["model"])
    model, objective = build_pretraining("electra", config, generator_fraction=recipe["data"]["generator_fraction"],
                                         rtd_weight=recipe["data"]["rtd_weight"])
    assert isinstance(model, GeneratorDiscriminator) and isinstance(objective, ElectraObjective)
    assert model.generator_config.hidden_size == config.hidden_size // 4 and objective.rtd_weight == 50.0
    with pytest.raises(ValueError, match="model_type to electra"):
        build_pretraining("electra", BertConfig(**TINY))
    with pytest.raises(ValueError, match="needs a causal model"):
        build_pretraining("causal", BertConfig(**TINY))
    with pytest.raises(ValueError, match="sentence-pair head, which model_type 'roberta'"):
        build_pretraining("bert", family_config("roberta"))


@pytest.mark.parametrize("raw", [
    # The config.json files of the released checkpoints (roberta-base, albert-base-v2,
    # electra-small-discriminator, distilbert-base-uncased), as published.
    {"architectures": ["RobertaForMaskedLM"], "attention_probs_dropout_prob": 0.1, "bos_token_id": 0,
     "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768,
     "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-05, "max_position_embeddings": 514,
     "model_type": "roberta", "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 1,
     "type_vocab_size": 1, "vocab_size": 50265},
    {"architectures": ["AlbertForMaskedLM"], "attention_probs_dropout_prob": 0, "bos_token_id": 2,
     "classifier_dropout_prob": 0.1, "down_scale_factor": 1, "embedding_size": 128, "eos_token_id": 3,
     "gap_size": 0, "hidden_act": "gelu_new", "hidden_dropout_prob": 0, "hidden_size": 768,
     "initializer_range": 0.02, "inner_group_num": 1, "intermediate_size": 3072, "layer_norm_eps": 1e-12,
     "max_position_embeddings": 512, "model_type": "albert", "net_structure_type": 0, "num_attention_heads": 12,
     "num_hidden_groups": 1, "num_hidden_layers": 12, "num_memory_blocks": 0, "pad_token_id": 0,
     "type_vocab_size": 2, "vocab_size": 30000},
    {"architectures": ["ElectraForPreTraining"], "attention_probs_dropout_prob": 0.1, "embedding_size": 128,
     "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 256, "initializer_range": 0.02,
     "intermediate_size": 1024, "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "electra",
     "num_attention_heads": 4, "num_hidden_layers": 12, "pad_token_id": 0, "type_vocab_size": 2,
     "vocab_size": 30522},
    {"activation": "gelu", "architectures": ["DistilBertForMaskedLM"], "attention_dropout": 0.1, "dim": 768,
     "dropout": 0.1, "hidden_dim": 3072, "initializer_range": 0.02, "max_position_embeddings": 512,
     "model_type": "distilbert", "n_heads": 12, "n_layers": 6, "pad_token_id": 0, "qa_dropout": 0.1,
     "seq_classif_dropout": 0.2, "sinusoidal_pos_embds": False, "tie_weights_": True, "vocab_size": 30522},
], ids=["roberta-base", "albert-base-v2", "electra-small-discriminator", "distilbert-base-uncased"])
def test_released_family_configs_are_read(raw):
    config = BertConfig.from_dict(raw)
    assert config.model_type == raw["model_type"]
    assert config.hidden_size == raw.get("hidden_size", raw.get("dim"))
    assert config.max_length == 512  # RoBERTa's 514 positions less its offset of 2


def test_bert_masked_lm_and_unknown_family_tensors(tmp_path):
    """BERT's own MLM-only model (BertForMaskedLM) both ways; a stray tensor is named with its family."""
    config = BertConfig(**TINY)
    ours = randomize(BertForMaskedLM(config), 15)
    ours.save_pretrained(tmp_path / "mlm")
    theirs, info = transformers.BertForMaskedLM.from_pretrained(str(tmp_path / "mlm"), output_loading_info=True)
    no_loading_problems(info)
    assert_same_mlm(ours, theirs.eval(), config)
    with pytest.raises(CheckpointError, match=r"missing \['nsp.weight', 'nsp.bias'\]"):
        BertForPreTraining.from_pretrained(tmp_path / "mlm")
    assert BertForMaskedLM.from_pretrained(tmp_path / "mlm").bert.pooler is None
    from safetensors.torch import load_file, save_file

    BertForReplacedTokenDetection(family_config("electra")).save_pretrained(tmp_path / "electra")
    state = load_file(str(tmp_path / "electra" / "model.safetensors"))
    state["pre_classifier.weight"] = torch.zeros(2, 2)  # DistilBERT's classifier head: no ELECTRA model has it
    save_file(state, str(tmp_path / "electra" / "model.safetensors"))
    with pytest.raises(CheckpointError, match="not part of an ELECTRA model: pre_classifier.weight"):
        BertForReplacedTokenDetection.from_pretrained(tmp_path / "electra")
    with pytest.raises(CheckpointError, match="cannot hold a BertForReplacedTokenDetection"):
        BertForReplacedTokenDetection.from_pretrained(tmp_path / "mlm")


@pytest.mark.parametrize("model_type, ours_name, theirs_name", [
    ("roberta", "BertForTokenClassification", "RobertaForTokenClassification"),
    ("roberta", "BertForQuestionAnswering", "RobertaForQuestionAnswering"),
    ("albert", "BertForSequenceClassification", "AlbertForSequenceClassification"),
    ("electra", "BertForTokenClassification", "ElectraForTokenClassification"),
])
def test_task_heads_whose_layout_the_family_shares(model_type, ours_name, theirs_name, tmp_path):
    import bertkit.models

    config = family_config(model_type)
    cls = getattr(bertkit.models, ours_name)
    ours = randomize(cls(config), 16)
    ours.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [theirs_name]
    theirs, info = getattr(transformers, theirs_name).from_pretrained(str(tmp_path), output_loading_info=True)
    no_loading_problems(info)
    ids, mask, types, _ = batch(config)
    with torch.no_grad():
        out = theirs.eval()(input_ids=ids, attention_mask=mask, token_type_ids=types)
        theirs_logits = torch.stack([out.start_logits, out.end_logits], -1) if "Question" in theirs_name else out.logits
        per_token = theirs_logits.shape[:2] == mask.shape
        close(ours(ids, mask, types).logits, theirs_logits, mask if per_token else None)
    assert type(cls.from_pretrained(tmp_path)) is cls
