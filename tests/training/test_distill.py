"""Knowledge distillation on tiny models built here: the losses are the papers' formulas, a student copied from its
teacher gets no soft gradient, distilling moves the student's outputs to the teacher's (classification, MLM,
hidden states through a projection), the CLI writes a student transformers loads, and a resumed run repeats."""

from __future__ import annotations

import dataclasses
import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit import BertConfig, BertForMaskedLM, BertForPreTraining, WordPieceTokenizer
from bertkit.cli import main
from bertkit.training.distill import (DistillationStudent, DistillationTask, DistillConfig, build_student,
                                      check_same_vocabulary, distill_task, layer_map, logits_and_hidden,
                                      soft_cross_entropy, soft_kl)
from bertkit.tasks.finetune import FinetuneConfig, finetune, predict
from bertkit.tasks.run import collate
from bertkit.models import IGNORE_INDEX, BertForSequenceClassification, BertForTokenClassification

FILLER = "the movie film plot actor was is very quite really a an story scene music fun long short".split()
QUICK = dict(batch_size=8, learning_rate=3e-3, progress=False, log_every=1, max_seq_length=24)


def rows(n: int, seed: int) -> list[tuple[str, str]]:
    """(text, label): the label says whether the text contains "good" (else it contains "bad")."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = [rng.choice(FILLER) for _ in range(rng.randint(3, 7))]
        words.insert(rng.randrange(len(words) + 1), "good" if i % 2 == 0 else "bad")
        out.append((" ".join(words), "pos" if i % 2 == 0 else "neg"))
    return out


def write_csv(path: Path, data: list[tuple[str, str]]) -> Path:
    path.write_text("text,label\n" + "".join(f"{t},{l}\n" for t, l in data), encoding="utf-8")
    return path


def tiny_fields(**overrides) -> dict:
    """tiny()'s sizes without a model_type, for BertConfig.for_family."""
    return dict(vocab_size=20, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                max_position_embeddings=64, initializer_range=0.1, **overrides)


def tiny(vocab_size: int, **overrides) -> BertConfig:
    # A larger initialisation than BERT's 0.02 lets a randomly initialised 32-wide model learn in a few steps.
    fields = dict(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, max_position_embeddings=64, initializer_range=0.1)
    fields.update(overrides)
    return BertConfig(**fields)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("distill-data")
    transfer = root / "transfer.txt"
    transfer.write_text("".join(t + "\n" for t, _ in rows(48, 9)), encoding="utf-8")
    return {"train": write_csv(root / "train.csv", rows(32, 1)), "dev": write_csv(root / "dev.csv", rows(16, 2)),
            "transfer": transfer, "root": root}


@pytest.fixture(scope="module")
def pretrained(files) -> Path:
    """A tiny randomly initialised BertForPreTraining with a vocabulary trained here."""
    texts = [t for t, _ in rows(80, 0)] + ["good bad"]
    tokenizer = WordPieceTokenizer.train(texts=texts, vocab_size=120, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    BertForPreTraining(tiny(tokenizer.vocab_size)).save_pretrained(files["root"] / "pretrained", tokenizer=tokenizer)
    return files["root"] / "pretrained"


@pytest.fixture(scope="module")
def teacher(files, pretrained) -> Path:
    """A tiny BERT fine-tuned on the "good"/"bad" task: a real teacher with confident, learnt logits."""
    tokenizer = WordPieceTokenizer.from_pretrained(pretrained)
    results = finetune("classify", pretrained, files["train"], files["dev"], files["root"] / "ft",
                       FinetuneConfig(epochs=6, dropout=0.0, **QUICK))
    assert results["best"]["accuracy"] >= 0.9  # the teacher knows the task
    # The best epoch is the first to get the tiny dev set right, with probabilities near 0.6: sharpen its head (the
    # same predictions, 20x the logits) so that its distribution is far from the uniform one a fresh student starts
    # at; soft targets near 0.5 teach a fresh student little more than the average prediction.
    model_dir = files["root"] / "ft" / "model"
    info = (model_dir / "finetune.json").read_text()
    model = BertForSequenceClassification.from_pretrained(model_dir)
    with torch.no_grad():
        model.classifier.weight.mul_(20.0)
        model.classifier.bias.mul_(20.0)
    model.save_pretrained(model_dir, tokenizer=tokenizer)
    (model_dir / "finetune.json").write_text(info)
    return model_dir


def batch_of(model_dir: Path, texts: list[str], labels: list[int]) -> dict[str, torch.Tensor]:
    tokenizer = WordPieceTokenizer.from_pretrained(model_dir)
    features = [{"input_ids": e.input_ids, "token_type_ids": e.token_type_ids, "label": y}
                for e, y in zip(tokenizer.encode_batch(texts, max_length=24), labels)]
    return collate(features, tokenizer.pad_id)


def mean_kl(student: torch.nn.Module, teacher: torch.nn.Module, batch: dict, temperature: float = 1.0) -> float:
    with torch.no_grad():
        s = student.eval()(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits
        t = teacher.eval()(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits
    return float(soft_kl(s, t, temperature).mean())


# ------------------------------------------------------------------------------------------------------------------
# The losses
# ------------------------------------------------------------------------------------------------------------------
def test_soft_loss_is_the_temperature_softened_cross_entropy_times_t_squared():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(5, 7, generator=g) * 3, torch.randn(5, 7, generator=g) * 3
    T = 2.5
    sn, tn = s.double().numpy(), t.double().numpy()
    p_t = np.exp(tn / T) / np.exp(tn / T).sum(-1, keepdims=True)
    log_p_s = sn / T - np.log(np.exp(sn / T).sum(-1, keepdims=True))
    log_p_t = np.log(p_t)
    ce = -(p_t * log_p_s).sum(-1) * T * T
    kl = (p_t * (log_p_t - log_p_s)).sum(-1) * T * T
    assert np.allclose(soft_cross_entropy(s, t, T).numpy(), ce, rtol=1e-5, atol=1e-5)
    assert np.allclose(soft_kl(s, t, T).numpy(), kl, rtol=1e-5, atol=1e-5)
    # CE - KL is T^2 times the teacher's entropy: the same gradient, KL is 0 when the student matches.
    assert np.allclose(ce - kl, -(p_t * log_p_t).sum(-1) * T * T, atol=1e-5)
    assert float(soft_kl(t, t, T).abs().max()) < 1e-6
    # At T = 1 without the teacher's softness the soft loss is the ordinary cross-entropy on a one-hot target.
    hard = torch.full((5, 7), -1e4)
    hard[torch.arange(5), torch.arange(5)] = 0.0
    assert torch.allclose(soft_cross_entropy(s, hard, 1.0),
                          torch.nn.functional.cross_entropy(s, torch.arange(5), reduction="none"), atol=1e-5)


def test_soft_loss_gradient_is_t_times_the_probability_gap_and_zero_when_logits_agree():
    g = torch.Generator().manual_seed(1)
    t = torch.randn(4, 6, generator=g)
    T = 3.0
    same = t.clone().requires_grad_(True)
    soft_cross_entropy(same, t, T).sum().backward()
    assert float(same.grad.abs().max()) < 1e-6
    other = torch.randn(4, 6, generator=g).requires_grad_(True)
    soft_cross_entropy(other, t, T).sum().backward()
    expected = T * ((other.detach() / T).softmax(-1) - (t / T).softmax(-1))
    assert torch.allclose(other.grad, expected, atol=1e-6)
    assert float(other.grad.abs().max()) > 1e-3


def test_task_terms_match_a_hand_computation_and_a_copy_of_the_teacher_gets_no_soft_gradient(teacher):
    base = BertForSequenceClassification.from_pretrained(teacher)
    config = dataclasses.replace(base.config, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    t_model = BertForSequenceClassification(config, 2, base.labels)
    t_model.load_state_dict(base.state_dict())
    batch = batch_of(teacher, ["a good film", "bad plot", "the story", "really good music"], [1, 0, IGNORE_INDEX, 1])
    T, w_soft, w_hard, w_logits = 2.0, 0.7, 0.3, 0.2
    cfg = DistillConfig(temperature=T, alpha_soft=w_soft, alpha_hard=w_hard, alpha_logits=w_logits)
    task = DistillationTask(t_model, cfg, "classification")
    assert task.counts(batch) == {"soft_loss": 4.0, "hard_loss": 3.0, "logits_loss": 4.0}  # row 3 is unlabelled

    torch.manual_seed(5)
    student = DistillationStudent(BertForSequenceClassification(config, 2, base.labels)).eval()
    out = task(student, batch)
    with torch.no_grad():
        s = student.student(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits.double()
        t = t_model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits.double()
    p_t = (t / T).softmax(-1)
    soft = -(p_t * (s / T).log_softmax(-1)).sum() * T * T
    gold = torch.tensor([1, 0, 1])
    hard = torch.nn.functional.cross_entropy(s[[0, 1, 3]], gold, reduction="sum")
    assert out["soft_loss"][0].item() == pytest.approx(w_soft * soft.item(), rel=1e-5)
    assert out["hard_loss"][0].item() == pytest.approx(w_hard * hard.item(), rel=1e-5)
    assert out["logits_loss"][0].item() == pytest.approx(w_logits * ((s - t) ** 2).mean(-1).sum().item(), rel=1e-5)
    assert out["hard_loss"][1].item() == 3 and out["soft_loss"][1].item() == 4

    # A student identical to the teacher: the soft loss pulls on nothing (its gradient is T (p_s - p_t) = 0).
    copy = DistillationStudent(BertForSequenceClassification(config, 2, base.labels))
    copy.student.load_state_dict(t_model.state_dict())
    soft_only = DistillationTask(t_model, DistillConfig(alpha_soft=1.0, alpha_hard=0.0, temperature=T),
                                 "classification")
    soft_only(copy, batch)["soft_loss"][0].backward()
    grads = [p.grad.abs().max().item() for p in copy.parameters() if p.grad is not None]
    assert grads and max(grads) < 1e-5
    copy.zero_grad()
    with torch.no_grad():
        copy.student.classifier.bias += torch.tensor([0.5, -0.5])  # no longer the teacher: the soft loss pulls back
    soft_only(copy, batch)["soft_loss"][0].backward()
    assert copy.student.classifier.bias.grad[0].item() > 1e-3 > -1e-3 > copy.student.classifier.bias.grad[1].item()
    assert all(p.grad is None for p in t_model.parameters())  # the teacher is frozen


def test_hidden_path_gives_the_forward_logits_and_the_uniform_map():
    torch.manual_seed(0)
    ids = torch.tensor([[2, 7, 9, 11, 3, 0], [2, 5, 3, 0, 0, 0]])
    mask, types = (ids != 0).long(), torch.zeros_like(ids)
    # every family's own sentence head (RoBERTa's dense head, DistilBERT's pre_classifier, a causal model's last
    # token), not only BERT's pooler
    configs = [tiny(20), tiny(20, causal=True), BertConfig.for_family("roberta", **tiny_fields(type_vocab_size=1)),
               BertConfig.for_family("electra", **tiny_fields()), BertConfig.for_family("distilbert", **tiny_fields())]
    for model in (*(BertForSequenceClassification(c, 3) for c in configs), BertForTokenClassification(tiny(20), 4)):
        model.eval()
        logits, hidden = logits_and_hidden(model, ids, mask, types, hidden=True)
        assert torch.allclose(logits, model(ids, mask, types).logits, atol=1e-6)
        assert len(hidden) == 3 and hidden[0].shape == (2, 6, 32)
    assert layer_map("uniform", 2, 4) == [(0, 0), (1, 2), (2, 4)]
    assert layer_map("uniform", 3, 6) == [(0, 0), (1, 2), (2, 4), (3, 6)]
    assert layer_map("uniform", 4, 6) == [(0, 0), (1, 1), (2, 3), (3, 4), (4, 6)]
    assert layer_map("last", 3, 12) == [(3, 12)] and layer_map("1:3", 2, 4) == [(1, 3)]
    with pytest.raises(ValueError, match="out of range"):
        layer_map("3:1", 2, 4)
    for bad in (dict(temperature=0.0), dict(alpha_soft=0, alpha_hard=0), dict(alpha_hard=-1.0),
                dict(hidden_map="1-2"), dict(student_layers_from_teacher="a,b"), dict(student_preset="huge")):
        with pytest.raises(ValueError):
            DistillConfig(**bad)


def test_hidden_state_loss_through_a_projection(teacher):
    t_model = BertForSequenceClassification.from_pretrained(teacher).eval()
    torch.manual_seed(3)
    narrow = BertForSequenceClassification(tiny(t_model.config.vocab_size, hidden_size=16, num_hidden_layers=1,
                                                intermediate_size=32, hidden_dropout_prob=0.0,
                                                attention_probs_dropout_prob=0.0), 2, t_model.labels)
    cfg = DistillConfig(alpha_soft=0.0, alpha_hard=0.0, alpha_hidden=2.0)
    pairs = layer_map(cfg.hidden_map, 1, 2)
    student = DistillationStudent(narrow, pairs, teacher_width=32)
    assert pairs == [(0, 0), (1, 2)] and [tuple(p.weight.shape) for p in student.projections] == [(32, 16)] * 2
    task = DistillationTask(t_model, cfg, "classification", pairs)
    batch = batch_of(teacher, ["a good film", "bad"], [1, 0])
    real = batch["attention_mask"] == 1
    assert task.counts(batch) == {"hidden_loss": float(real.sum()) * 2}
    out = task(student, batch)
    with torch.no_grad():
        _, hs = logits_and_hidden(narrow, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], hidden=True)
        _, ht = logits_and_hidden(t_model, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                              hidden=True)
        expected = sum(((proj(hs[i])[real] - ht[j][real]) ** 2).mean(-1).sum()
                       for proj, (i, j) in zip(student.projections, pairs))
    assert out["hidden_loss"][0].item() == pytest.approx(2.0 * expected.item(), rel=1e-5)
    assert {k for k in out if k.endswith("_loss")} == {"hidden_loss"}  # no soft or hard term with weight 0


def test_hidden_state_distillation_trains_the_projection_and_discards_it(teacher, files, tmp_path):
    narrow = tmp_path / "narrow"
    tokenizer = WordPieceTokenizer.from_pretrained(teacher)
    torch.manual_seed(4)
    BertForSequenceClassification(tiny(tokenizer.vocab_size, hidden_size=16, num_hidden_layers=1,
                                       intermediate_size=32), 2, ["neg", "pos"]).save_pretrained(narrow,
                                                                                                 tokenizer=tokenizer)
    cfg = DistillConfig(alpha_soft=1.0, alpha_hard=0.0, alpha_hidden=1.0)
    results = distill_task("classify", teacher, files["train"], files["dev"], tmp_path / "run",
                           FinetuneConfig(epochs=8, dropout=0.0, **QUICK), cfg, student_dir=narrow)
    records = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    hidden = [r["hidden_loss"] for r in records if "hidden_loss" in r]
    assert len(hidden) == 32 and np.mean(hidden[-3:]) < 0.6 * np.mean(hidden[:3]), hidden
    state = torch.load(tmp_path / "run" / "checkpoints" / "step-00000032.pt", weights_only=True)["model"]
    assert {k for k in state if k.startswith("projections.")} == {"projections.0.weight", "projections.0.bias",
                                                                  "projections.1.weight", "projections.1.bias"}
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "run" / "model" / "model.safetensors"))
    assert not any("projection" in k for k in saved) and saved["bert.embeddings.word_embeddings.weight"].shape[1] == 16
    assert results["student"]["hidden_size"] == 16 and results["teacher"]["hidden_size"] == 32


# ------------------------------------------------------------------------------------------------------------------
# Task distillation end to end
# ------------------------------------------------------------------------------------------------------------------
def test_distilling_moves_the_students_logits_to_the_teachers(teacher, files, tmp_path):
    t_model = BertForSequenceClassification.from_pretrained(teacher)
    tokenizer = WordPieceTokenizer.from_pretrained(teacher)
    torch.manual_seed(7)  # a student that knows nothing: random one-layer encoder and head
    BertForSequenceClassification(tiny(tokenizer.vocab_size, num_hidden_layers=1), 2, ["neg", "pos"]).save_pretrained(
        tmp_path / "student", tokenizer=tokenizer)
    batch = batch_of(teacher, [t for t, _ in rows(16, 2)], [0] * 16)  # the dev file's texts
    before = mean_kl(BertForSequenceClassification.from_pretrained(tmp_path / "student"), t_model, batch, 2.0)
    # Soft losses only, on the training texts and the unlabelled transfer set: the student sees no gold label.
    cfg = DistillConfig(temperature=2.0, alpha_soft=1.0, alpha_hard=0.0)
    results = distill_task("classify", teacher, files["train"], files["dev"], tmp_path / "run",
                           FinetuneConfig(epochs=6, dropout=0.0, **QUICK), cfg, student_dir=tmp_path / "student",
                           transfer_path=files["transfer"])
    dev_kl = [r["teacher_kl"] for r in results["epochs"]]  # T^2 x KL from the teacher on dev, every epoch
    # 60 steps take it from ~1.8 to 0.25-0.6 whatever the student's seed (five tried): at least halved.
    assert dev_kl[-1] < 0.5 * before and dev_kl[-1] < dev_kl[0], (before, dev_kl)
    # The saved student is the best epoch's (by accuracy), and the figure recorded for it is its own.
    saved = BertForSequenceClassification.from_pretrained(tmp_path / "run" / "model")
    assert mean_kl(saved, t_model, batch, 2.0) == pytest.approx(results["best"]["teacher_kl"], rel=1e-4, abs=1e-6)
    records = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    kl = [r["kl"] for r in records if "kl" in r]
    assert len(kl) == results["max_steps"] == 60 and np.mean(kl[-5:]) < 0.5 * np.mean(kl[:5])
    assert not any("hard_loss" in r for r in records)
    assert results["train_examples"] == 32 and results["transfer_examples"] == 48
    assert results["best"]["accuracy"] >= 0.9 and results["best"]["teacher_agreement"] >= 0.9
    assert results["teacher"]["accuracy"] >= 0.9 and results["teacher"]["layers"] == 2


def test_cli_writes_a_student_that_transformers_loads_with_the_same_outputs(teacher, files, tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "run"
    code = main(["distill", "classify", "--teacher", str(teacher), "--student-layers-from-teacher", "1",
                 "--train", str(files["train"]), "--dev", str(files["dev"]), "--transfer", str(files["transfer"]),
                 "--out", str(out), "--epochs", "1", "--batch-size", "8", "--learning-rate", "1e-3",
                 "--max-seq-length", "24", "--temperature", "3", "--alpha-hard", "0.2", "--quiet"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["student"]["layers"] == 1 and summary["teacher"]["layers"] == 2 and summary["steps"] == 10
    ours = BertForSequenceClassification.from_pretrained(out / "model").eval()
    peer = transformers.BertForSequenceClassification.from_pretrained(str(out / "model")).eval()
    assert peer.config.num_hidden_layers == 1 and peer.config.id2label == {0: "neg", 1: "pos"}
    batch = batch_of(out / "model", ["a good film", "the long story was bad", "fun"], [0, 0, 0])
    with torch.no_grad():
        a = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits
        b = peer(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                 token_type_ids=batch["token_type_ids"]).logits
    assert torch.allclose(a, b, atol=1e-5, rtol=0)
    assert not (out / "model" / "teacher").exists() and (out / "results.json").is_file()
    saved = json.loads((out / "model" / "config.json").read_text())
    assert saved["num_hidden_layers"] == 1 and saved["architectures"] == ["BertForSequenceClassification"]
    (result,) = predict(out / "model", None, ["a very good film"])  # finetune.json is there for `predict`
    assert result["label"] in ("neg", "pos")


def test_student_layers_are_copied_from_the_chosen_teacher_layers(teacher):
    t_model = BertForSequenceClassification.from_pretrained(teacher)
    student = build_student(BertForSequenceClassification, t_model, DistillConfig(student_layers_from_teacher="1"),
                            num_labels=2, labels=t_model.labels)
    ours, theirs = student.state_dict(), t_model.state_dict()
    assert student.config.num_hidden_layers == 1
    assert all(torch.equal(v, theirs[k.replace("layers.0.", "layers.1.")]) for k, v in ours.items())
    assert not torch.equal(ours["bert.layers.0.ffn.up.weight"], theirs["bert.layers.0.ffn.up.weight"])
    with pytest.raises(ValueError, match=r"tensor 'bert\.embeddings\.word\.weight' is \(\d+, 32\) in the teacher "
                                         r"but \(\d+, 128\) in the student"):
        build_student(BertForSequenceClassification, t_model,
                      DistillConfig(student_preset="tiny", student_layers_from_teacher="0,1"),
                      num_labels=2, labels=t_model.labels)
    with pytest.raises(ValueError, match="layers 0..1; cannot initialise the student from layer 5"):
        build_student(BertForSequenceClassification, t_model, DistillConfig(student_layers_from_teacher="0,5"),
                      num_labels=2, labels=t_model.labels)


def test_mismatched_vocabularies_are_refused_naming_both_files(teacher, pretrained, files, tmp_path, capsys):
    other = WordPieceTokenizer.train(texts=["completely different words here"] * 3, vocab_size=60, min_frequency=1,
                                     show_progress=False)
    torch.manual_seed(0)
    BertForPreTraining(tiny(other.vocab_size)).save_pretrained(tmp_path / "student", tokenizer=other)
    code = main(["distill", "classify", "--teacher", str(teacher), "--student", str(tmp_path / "student"),
                 "--train", str(files["train"]), "--dev", str(files["dev"]), "--out", str(tmp_path / "run"),
                 "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"{teacher / 'vocab.txt'}" in err and f"{tmp_path / 'student' / 'vocab.txt'}" in err
    assert "vocabularies differ" in err
    code = main(["distill", "classify", "--teacher", str(pretrained), "--student-preset", "tiny",
                 "--train", str(files["train"]), "--dev", str(files["dev"]), "--out", str(tmp_path / "run2"),
                 "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "not a fine-tuned BertForSequenceClassification" in err


def test_vocabulary_files_are_compared_entry_by_entry(tmp_path):
    """The message names both files, their sizes and the first entry (counted from 1) where they part, or says that
    one is a prefix of the other."""
    dirs = {}
    for name, words in (("a", ["[PAD]", "x", "y", "z"]), ("b", ["[PAD]", "x", "w", "z"]), ("c", ["[PAD]", "x"])):
        dirs[name] = tmp_path / name
        dirs[name].mkdir()
        (dirs[name] / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    check_same_vocabulary(dirs["a"], dirs["a"])
    a, b, c = (dirs[n] / "vocab.txt" for n in "abc")
    with pytest.raises(ValueError, match=re.escape(f"differ: {a} has 4 entries, {b} has 4; first difference at "
                                                   f"entry 3: 'y' vs 'w'. Distillation")):
        check_same_vocabulary(dirs["a"], dirs["b"])
    with pytest.raises(ValueError, match=re.escape(f"differ: {a} has 4 entries, {c} has 2; one is a prefix of the "
                                                   f"other. Distillation")):
        check_same_vocabulary(dirs["a"], dirs["c"])


def test_resume_repeats_the_uninterrupted_run(teacher, files, tmp_path):
    cfg = DistillConfig(student_layers_from_teacher="0", alpha_hidden=0.5, hidden_map="last")
    config = FinetuneConfig(epochs=2, dropout=0.1, **QUICK)  # dropout on: the RNG state must be restored too
    full = distill_task("classify", teacher, files["train"], files["dev"], tmp_path / "full", config, cfg)
    distill_task("classify", teacher, files["train"], files["dev"], tmp_path / "split", config, cfg,
                 stop_after_steps=3)
    resumed = distill_task("classify", teacher, files["train"], files["dev"], tmp_path / "split", config, cfg,
                           resume=True)

    def losses(run: str) -> list[tuple[int, float]]:
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [(r["step"], r["loss"]) for r in map(json.loads, lines) if "loss" in r]

    assert len(losses("full")) == 8 and losses("split") == losses("full")  # bit-identical on CPU
    assert resumed["epochs"] == full["epochs"]
    a = BertForSequenceClassification.from_pretrained(tmp_path / "full" / "model").state_dict()
    b = BertForSequenceClassification.from_pretrained(tmp_path / "split" / "model").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_token_classification_distils_the_first_sub_word_of_every_transfer_word(pretrained, tmp_path):
    from bertkit.training.distill import UNLABELLED, read_transfer
    from bertkit.tasks import family_for

    def sentences(n: int, seed: int) -> str:  # "good" and "bad" are the entities, every other word is O
        tag = {"good": "B-POS", "bad": "B-NEG"}
        return "\n\n".join("\n".join(f"{w} {tag.get(w, 'O')}" for w in text.split()) for text, _ in rows(n, seed))

    train, dev = tmp_path / "train.conll", tmp_path / "dev.conll"
    train.write_text(sentences(32, 1) + "\n", encoding="utf-8")
    dev.write_text(sentences(16, 2) + "\n", encoding="utf-8")
    finetune("ner", pretrained, train, dev, tmp_path / "teacher", FinetuneConfig(epochs=12, dropout=0.0, **QUICK))
    teacher = tmp_path / "teacher" / "model"
    transfer = tmp_path / "transfer.txt"
    transfer.write_text("a funny film\n" + "".join(t + "\n" for t, _ in rows(24, 5)), encoding="utf-8")

    config = FinetuneConfig(kind="ner", epochs=2, dropout=0.0, **QUICK)
    tokenizer = WordPieceTokenizer.from_pretrained(teacher)
    first = read_transfer(transfer, family_for("ner")(config), tokenizer, config)[0]
    pieces = tokenizer.convert_ids_to_tokens(first["input_ids"])
    assert pieces[1:-1] == ["a", "fun", "##n", "##y", "film"]  # only each word's first piece is distilled
    assert [p for p, y in zip(pieces, first["labels"]) if y == UNLABELLED] == ["a", "fun", "film"]
    assert all(y == IGNORE_INDEX for y in first["labels"] if y != UNLABELLED)

    results = distill_task("ner", teacher, train, dev, tmp_path / "run", config,
                           DistillConfig(student_layers_from_teacher="1", temperature=1.0), transfer_path=transfer)
    assert results["transfer_examples"] == 25 and results["student"]["layers"] == 1
    records = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all("soft_loss" in r and "hard_loss" in r for r in records if "loss" in r)
    assert results["best"]["f1"] >= 0.9 and results["teacher"]["f1"] >= 0.9
    model = BertForTokenClassification.from_pretrained(tmp_path / "run" / "model")
    assert model.labels == ["O", "B-NEG", "I-NEG", "B-POS", "I-POS"]


# ------------------------------------------------------------------------------------------------------------------
# MLM distillation
# ------------------------------------------------------------------------------------------------------------------
WORDS = "the a cat dog bird sees likes chases eats small big red green house tree river park runs sleeps".split()


def corpus(path: Path, documents: int, seed: int) -> Path:
    rng = random.Random(seed)
    lines = []
    for _ in range(documents):
        topic = rng.choice(WORDS)
        lines += [" ".join([topic] + [rng.choice(WORDS) for _ in range(rng.randint(4, 10))]) + "." for _ in range(5)]
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def test_mlm_distillation_on_the_pretraining_stream(tmp_path, capsys):
    from bertkit.data.corpus import iter_lines
    from bertkit.data.prepare import prepare

    text = corpus(tmp_path / "corpus.txt", 30, 0)
    tokenizer = WordPieceTokenizer.train(iter_lines([text]), vocab_size=80, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    # The teacher: a random tiny MLM with sharp predictions (large weights), so there is something to copy.
    BertForMaskedLM(tiny(tokenizer.vocab_size, initializer_range=0.3)).save_pretrained(tmp_path / "teacher",
                                                                                         tokenizer=tokenizer)
    prepare([text], tmp_path / "teacher", tmp_path / "data", eval_paths=[corpus(tmp_path / "held.txt", 4, 1)],
            progress=False)
    # Recipe fields (the instances, the masking, the optimiser, the student's dropout) ride along as --field value.
    code = main(["distill", "mlm", "--teacher", str(tmp_path / "teacher"), "--data", str(tmp_path / "data"),
                 "--out", str(tmp_path / "run"), "--student-layers-from-teacher", "1", "--temperature", "1",
                 "--alpha-hard", "0", "--max-steps", "40", "--batch-size", "16", "--max-seq-length", "32",
                 "--learning-rate", "3e-3", "--objective", "roberta", "--max-predictions-per-seq", "5",
                 "--warmup-steps", "0", "--warmup-ratio", "0.1", "--log-every", "1", "--save-every", "40",
                 "--eval-instances", "32", "--progress", "false", "--hidden-dropout-prob", "0",
                 "--attention-probs-dropout-prob", "0"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    records = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    kl = [r["kl"] for r in records if "kl" in r]
    assert printed["step"] == 40 and len(kl) == 40 and np.mean(kl[-5:]) < 0.5 * np.mean(kl[:5]), kl
    assert not any("hard_loss" in r for r in records) and "eval_mlm_accuracy" in printed
    summary = json.loads((tmp_path / "run" / "results.json").read_text())
    assert "mlm_accuracy" in summary["teacher_eval"] and summary["student_parameters"] < summary["teacher_parameters"]

    # The task compares the two models at the masked positions only, from the sparse path: the same numbers as
    # the dense logits there.
    from bertkit.data.instances import SpecialIds
    from bertkit.data.loader import PretrainingStream, StreamOptions
    from bertkit.data.shards import ShardedCorpus

    t_model = BertForMaskedLM.from_pretrained(tmp_path / "teacher").eval()
    s_model = BertForMaskedLM.from_pretrained(tmp_path / "run" / "model").eval()
    special = SpecialIds(cls=tokenizer.cls_id, sep=tokenizer.sep_id, pad=tokenizer.pad_id, mask=tokenizer.mask_id)
    stream = PretrainingStream(ShardedCorpus(tmp_path / "data", "train"),
                               StreamOptions(instances="full-sentences", max_seq_length=32, max_predictions_per_seq=5),
                               special, tokenizer.vocab_size, 8, prefetch=0)
    batch = next(iter(stream))
    task = DistillationTask(t_model, DistillConfig(temperature=2.0, alpha_soft=1.0, alpha_hard=1.0), "mlm")
    at = batch["labels"] != IGNORE_INDEX
    assert task.counts(batch) == {"soft_loss": float(at.sum()), "hard_loss": float(at.sum())}
    out = task(DistillationStudent(s_model).eval(), batch)
    with torch.no_grad():
        s = s_model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).prediction_logits[at]
        t = t_model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).prediction_logits[at]
    assert out["soft_loss"][0].item() == pytest.approx(soft_cross_entropy(s, t, 2.0).sum().item(), rel=1e-4)
    hard = torch.nn.functional.cross_entropy(s, batch["labels"][at], reduction="sum")
    assert out["hard_loss"][0].item() == pytest.approx(hard.item(), rel=1e-4)
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertForMaskedLM.from_pretrained(str(tmp_path / "run" / "model"))
    assert hf.config.num_hidden_layers == 1


def test_mlm_distillation_reads_the_stream_as_pretraining_does_isolate_documents_included(tmp_path, monkeypatch):
    import bertkit.data.loader as loader
    import bertkit.training.distill as distill_module
    from bertkit.data.instances import SpecialIds
    from bertkit.data.prepare import prepare
    from bertkit.data.shards import ShardedCorpus
    from bertkit.training.distill import distill_mlm
    from bertkit.training.pretrain import resolve_config, stream_options

    text = corpus(tmp_path / "corpus.txt", 12, 0)
    tokenizer = WordPieceTokenizer.train(text.read_text(encoding="utf-8").splitlines(), vocab_size=80,
                                         min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    BertForMaskedLM(tiny(tokenizer.vocab_size)).save_pretrained(tmp_path / "teacher", tokenizer=tokenizer)
    prepare([text], tmp_path / "teacher", tmp_path / "data", progress=False)
    seen = []

    class Recording(loader.PretrainingStream):  # the stream distill_mlm builds, with the options it was given
        def __init__(self, corpus, options, *args, **kwargs):
            seen.append(options)
            super().__init__(corpus, options, *args, **kwargs)

    monkeypatch.setattr(distill_module, "PretrainingStream", Recording)  # the name distill_mlm reads
    config = resolve_config(None, {"objective": "roberta", "isolate_documents": True, "max_seq_length": 64,
                                   "max_predictions_per_seq": 5, "batch_size": 4, "max_steps": 2, "save_every": 2,
                                   "eval_instances": 0, "progress": False})
    distill_mlm(tmp_path / "teacher", tmp_path / "data", tmp_path / "run", config,
                DistillConfig(student_layers_from_teacher="1"), eval_at_start=False)
    assert len(seen) == 1 and seen[0] == stream_options(config.data)
    assert seen[0].isolate_documents and seen[0].instances == "full-sentences"
    # Isolated documents: packed rows number their documents 1, 2, ... in the attention mask.
    special = SpecialIds(cls=tokenizer.cls_id, sep=tokenizer.sep_id, pad=tokenizer.pad_id, mask=tokenizer.mask_id)
    stream = Recording(ShardedCorpus(tmp_path / "data", "train"), seen[0], special, tokenizer.vocab_size, 4,
                       prefetch=0)
    assert int(next(iter(stream))["attention_mask"].max()) > 1
