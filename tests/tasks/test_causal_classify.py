"""GPT-1's fine-tuning for a causal model: the head reads the last real token (the extract token), the auxiliary
language-modelling loss is L2 + 0.5 L1 exactly, and a tiny causal model learns a pair task through the CLI whose
label only the second sentence tells."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bertkit import BertConfig, WordPieceTokenizer
from bertkit.cli import main
from bertkit.tasks.finetune import FinetuneConfig, finetune, predict, pretrained_lm_head
from bertkit.models import BertForCausalLM, BertForSequenceClassification
from bertkit.models.heads import last_real_token
from bertkit.tasks.classify import SequenceClassificationTask

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = dict(vocab_size=90, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48,
            max_position_embeddings=40, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, causal=True)


def causal_config(model_type: str) -> BertConfig:
    extra = dict(type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2) if model_type == "roberta" else {}
    return BertConfig.for_family(model_type, **{**TINY, **extra})


def padded_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 90, (3, 10), generator=g)
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    return ids, mask


@pytest.mark.parametrize("model_type", ["bert", "roberta"])  # a linear head; RoBERTa's sentence head
def test_the_head_reads_the_last_real_token(model_type):
    torch.manual_seed(0)
    model = BertForSequenceClassification(causal_config(model_type), num_labels=3).eval()
    ids, mask = padded_batch()
    with torch.no_grad():
        logits = model(ids, mask).logits
        after = ids.clone()
        after[1, 6:], after[2, 3:] = 7, torch.arange(11, 18)  # whatever follows the last real token
        assert torch.equal(model(after, mask).logits, logits)
        alone = model(ids[2:, :3]).logits  # the row without padding gives the same
        torch.testing.assert_close(alone, logits[2:], atol=1e-5, rtol=1e-5)
        last = ids.clone()
        last[1, 5] = (ids[1, 5] + 1) % 90  # the last real token itself is read
        changed = model(last, mask).logits
    assert not torch.allclose(changed[1], logits[1]) and torch.equal(changed[[0, 2]], logits[[0, 2]])


def test_last_real_token_with_either_padding_side():
    hidden = torch.arange(2 * 4 * 1, dtype=torch.float32).view(2, 4, 1)
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    left = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])
    assert last_real_token(hidden, right).flatten().tolist() == [1.0, 7.0]
    assert last_real_token(hidden, left).flatten().tolist() == [3.0, 7.0]
    assert last_real_token(hidden, None).flatten().tolist() == [3.0, 7.0]


def test_auxiliary_language_model_loss_is_gpt1s():
    torch.manual_seed(1)
    model = BertForSequenceClassification(causal_config("bert"), num_labels=2).eval()
    ids, mask = padded_batch(3)
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
             "labels": torch.tensor([0, 1, 1])}
    plain = SequenceClassificationTask("cls")
    task = plain.with_language_model(0.5)
    terms = task(model, batch)
    assert set(plain(model, batch)) == {"cls_loss", "cls_accuracy"} and "lm_aux_loss" in terms
    # By hand: every real token after a row's first, predicted from the last layer at the position before it
    # through the tied input embeddings (h W_e^T).
    with torch.no_grad():
        hidden = model.bert(ids, mask).last_hidden_state
    word = model.bert.embeddings.word.weight.detach()
    total, count = 0.0, 0
    for row, length in enumerate(mask.sum(-1).tolist()):
        logits = hidden[row, :length - 1] @ word.T
        total += float(F.cross_entropy(logits, ids[row, 1:length], reduction="sum"))
        count += length - 1
    value, n = terms["lm_aux_loss"]
    assert float(n) == count == task.counts(batch)["lm_aux_loss"] == 9 + 5 + 2
    assert value.item() == pytest.approx(0.5 * total, rel=1e-5)
    assert task.counts(batch)["cls_loss"] == 3 and terms["cls_loss"][0].item() == pytest.approx(
        plain(model, batch)["cls_loss"][0].item())


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_auxiliary_loss_is_the_pretrained_language_models_own(model_type, tmp_path):
    """Fine-tuning a pretrained causal LM, L1 is that LM's loss on the task's inputs: scored with the head it was
    pretrained with (dense, activation, LayerNorm, bias before the tied embeddings), not with the bare embeddings,
    an untrained head whose loss starts above log(V) and whose gradient drowns the task's (a 150-step pretrained
    model then stayed at the majority class on SST-2)."""
    torch.manual_seed(2)
    lm = BertForCausalLM(causal_config(model_type))
    with torch.no_grad():  # a head that pretraining moved away from its initialisation
        lm.mlm.bias.normal_(0.0, 1.0)
        lm.mlm.norm.weight.uniform_(0.5, 1.5)
    lm.save_pretrained(tmp_path / "lm")
    ids, mask = padded_batch(4)
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
             "labels": torch.tensor([0, 1, 1])}
    head = pretrained_lm_head(tmp_path / "lm")
    task = SequenceClassificationTask("cls").with_language_model(0.5, head)
    model = BertForSequenceClassification.from_pretrained(tmp_path / "lm", num_labels=2).eval()
    with torch.no_grad():
        value, count = task(model, batch)["lm_aux_loss"]
        labels = ids.masked_fill(mask.eq(0), -100)
        pretrained = BertForCausalLM.from_pretrained(tmp_path / "lm").eval()(ids, mask, labels=labels).loss
        bare = SequenceClassificationTask("cls").with_language_model(0.5)(model, batch)["lm_aux_loss"][0]
    assert float(count) == 9 + 5 + 2
    assert (value / count).item() == pytest.approx(0.5 * pretrained.item(), rel=1e-6)
    assert abs(bare.item() - value.item()) > 1.0  # the bare embeddings score another model
    assert not any(p.requires_grad for p in head.parameters())  # kept as pretraining left it
    # The head decodes with the task model's own embeddings (which fine-tuning trains), not a copy.
    with torch.no_grad():
        model.bert.embeddings.word.weight.mul_(2.0)
        moved = task(model, batch)["lm_aux_loss"][0]
    assert moved.item() != pytest.approx(value.item())


def test_a_directory_without_a_language_model_head_scores_with_the_tied_embeddings(tmp_path):
    torch.manual_seed(3)
    BertForSequenceClassification(causal_config("bert"), num_labels=2).save_pretrained(tmp_path / "cls")
    assert pretrained_lm_head(tmp_path / "cls") is None


# ------------------------------------------------------------------------------------------------------------------
# End to end: a pair task only the second sentence decides
# ------------------------------------------------------------------------------------------------------------------
WORDS = "the a cat dog sat ran on under mat tree house big small red blue".split()


def pair_rows(n: int, seed: int) -> list[str]:
    """Label "yes" when the pair (second sentence) holds "good", "no" when it holds "bad"; 5 of 8 are "no"."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        good = i % 8 < 3
        pair = [rng.choice(WORDS) for _ in range(rng.randint(2, 5))]
        pair.insert(rng.randrange(len(pair) + 1), "good" if good else "bad")
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5)))
        rows.append(f"{text},{' '.join(pair)},{'yes' if good else 'no'}")
    return rows


@pytest.fixture(scope="module")
def causal_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("causal")
    texts = [" ".join(WORDS + ["good", "bad"])] * 3
    tokenizer = WordPieceTokenizer.train(texts=texts, vocab_size=60, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    config = BertConfig(**{**TINY, "vocab_size": tokenizer.vocab_size, "initializer_range": 0.1})
    BertForCausalLM(config).save_pretrained(root / "model", tokenizer=tokenizer)
    for name, n, seed in (("train", 96, 1), ("dev", 32, 2)):
        (root / f"{name}.csv").write_text("text,pair,label\n" + "\n".join(pair_rows(n, seed)) + "\n")
    return root


def test_causal_model_learns_a_pair_task_through_the_cli(causal_dir, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["finetune", "classify", "--model", causal_dir / "model", "--train", causal_dir / "train.csv", "--dev",
            causal_dir / "dev.csv", "--pair-column", "pair", "--out", out, "--epochs", "6", "--batch-size", "8",
            "--lr", "3e-3", "--max-seq-length", "24", "--quiet"]
    assert main([str(a) for a in argv]) == 0
    capsys.readouterr()
    results = json.loads((out / "results.json").read_text())
    majority = 20 / 32
    assert results["best"]["accuracy"] >= majority + 0.25, results["epochs"]
    assert results["config"]["lm_weight"] == 0.5 and results["lm_head"] == "pretrained"
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("lm_aux_loss" in r for r in logged)  # GPT-1's auxiliary loss was trained
    # The directory predicts in bertkit, and transformers still loads it.
    said = predict(out / "model", None, [("the cat sat", "a good dog"), ("the cat sat", "a bad dog")])
    assert [p["label"] for p in said] == ["yes", "no"]
    transformers = pytest.importorskip("transformers")
    loaded = transformers.BertForSequenceClassification.from_pretrained(out / "model")
    assert loaded.config.is_decoder and loaded.config.id2label == {0: "no", 1: "yes"}


def test_auxiliary_loss_switches_off(causal_dir, tmp_path):
    config = FinetuneConfig(epochs=1, batch_size=8, learning_rate=3e-3, max_seq_length=24, progress=False,
                            lm_weight=0.0, pair_column="pair", log_every=1)
    finetune("classify", causal_dir / "model", causal_dir / "train.csv", causal_dir / "dev.csv", tmp_path / "off",
             config)
    logged = [json.loads(line) for line in (tmp_path / "off" / "metrics.jsonl").read_text().splitlines()]
    assert logged and not any("lm_aux_loss" in r for r in logged) and any("cls_loss" in r for r in logged)
    with pytest.raises(ValueError, match="lm_weight"):
        FinetuneConfig(lm_weight=-1.0)


def test_a_bilstm_task_model_on_a_causal_encoder(causal_dir, tmp_path):
    """The BERT paper's ablation row "left-to-right + BiLSTM": a causal encoder fine-tuned with a fresh BiLSTM on its
    last layer. The task model has no language-model head, so GPT-1's auxiliary loss stays off (and says nothing
    of a head it cannot reach)."""
    config = FinetuneConfig(epochs=2, batch_size=8, learning_rate=3e-3, max_seq_length=24, progress=False,
                            pair_column="pair", log_every=1, task_model="bilstm", layers="-1", combine="concat")
    finetune("classify", causal_dir / "model", causal_dir / "train.csv", causal_dir / "dev.csv", tmp_path / "run",
             config)
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["cls_loss"] for r in logged if "cls_loss" in r]
    assert losses and not any("lm_aux_loss" in r for r in logged)
    assert (tmp_path / "run" / "model" / "task_model.json").is_file()
