"""Every verb takes a ModernBERT directory, on the command line, from raw text to directories transformers loads.

One model made as a user would: `tokenizer train` -> `prepare` -> `pretrain --config modernbert-mini` (a tiny
ModernBERT whose local layers see +-4 tokens, so the inputs below are longer than the window). It then goes through
`finetune` of every kind (glue, classify, ner, squad, swag), `predict`, `distill` (task and MLM, a ModernBERT
teacher with a ModernBERT and a BERT student) and `init --model-type modernbert`; every directory written loads in
transformers' ModernBertFor... (or BertFor...) class with no missing keys and the same logits (1e-5) on
transformers' own tokenisation. Pretraining through the CLI: the loss falls, a stopped run resumed with --resume
logs the same per-step losses (with packed isolated documents, the warmup-stable-decay schedule and the batch-size
warm-up on), and the objectives ModernBERT cannot train are refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bertkit.cli import main
from bertkit.tokenizers import load_tokenizer
from tasks.test_every_kind import FINETUNE, corpus_text, same_logits, their_inputs, write_data

transformers = pytest.importorskip("transformers")

# A tiny ModernBERT: 3 layers (0 and 2 global, 1 local with a window of +-4), rows of 32 tokens.
TINY = ["--hidden-size", "32", "--num-hidden-layers", "3", "--num-attention-heads", "2", "--intermediate-size", "48",
        "--local-attention", "8", "--global-attn-every-n-layers", "2", "--max-seq-length", "32",
        "--max-predictions-per-seq", "10", "--batch-size", "8", "--eval-instances", "16", "--log-every", "1",
        "--learning-rate", "2e-3", "--warmup-ratio", "0.1", "--eval-every", "0", "--progress", "false"]


def run(*argv) -> None:
    code = main([str(a) for a in argv])
    assert code == 0, f"bertkit {' '.join(map(str, argv))} exited {code}"


def fails(capsys, *argv) -> str:
    """Run a command that must fail with exit status 2 and one line on stderr; that line."""
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bertkit: error: ") and "\n" not in err, err
    return err


def losses(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """The tokenizer, the prepared data and the pretrained tiny ModernBERT directory."""
    root = tmp_path_factory.mktemp("modernbert-verbs")
    corpus = root / "corpus.txt"
    corpus.write_text(corpus_text(0), encoding="utf-8")
    run("tokenizer", "train", "--files", corpus, "--vocab-size", 200, "--min-frequency", 1, "--out", root / "tok",
        "--quiet")
    run("prepare", "--corpus", corpus, "--tokenizer", root / "tok", "--out", root / "data", "--eval-fraction", "0.1",
        "--quiet")
    run("pretrain", "--data", root / "data", "--out", root / "run", "--config", "modernbert-mini", *TINY,
        "--max-steps", "6", "--save-every", "6")
    return {"tok": root / "tok", "data": root / "data", "model": root / "run" / "model"}


def swag_file(path: Path) -> Path:
    rows = ["video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label"]
    people, places = ["mary", "john", "anna", "carl"], ["rome", "paris", "berlin", "vienna"]
    for i in range(16):
        p, c = people[i % 4], places[i % 4]
        endings = [f"lives in {places[(i + k) % 4]} ." for k in range(4)]
        rows.append(f"v{i},{i},x,{p} is from {c} .,{p.title()},gold,{','.join(endings)},0")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_the_pretrained_directory_is_transformers_modernbert(made):
    theirs, info = transformers.ModernBertForMaskedLM.from_pretrained(str(made["model"]), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert theirs.config.local_attention == 8 and theirs.config.num_hidden_layers == 3


def test_finetune_every_kind_and_predict(made, tmp_path, capsys):
    from bertkit.models import (ModernBertForMultipleChoice, ModernBertForQuestionAnswering,
                                ModernBertForSequenceClassification, ModernBertForTokenClassification)

    model, data = made["model"], write_data(tmp_path)
    (tmp_path / "reviews.csv").write_text("review,stars\n" + "".join(
        f"{'a good long film with a fine story' if i % 2 else 'bad'} number {i},{i % 2}\n" for i in range(24)),
        encoding="utf-8")
    run("finetune", "glue", "--task", "sst2", "--model", model, "--train", data["sst2"], "--dev", data["sst2"],
        "--out", tmp_path / "glue", *FINETUNE)
    texts = ["a good film", "the long story was very bad and the music was long and the actor was quite fun"]
    same_logits(tmp_path / "glue" / "model", "AutoModelForSequenceClassification", "ModernBert",
                ModernBertForSequenceClassification, texts)
    run("finetune", "classify", "--model", model, "--train", tmp_path / "reviews.csv", "--dev",
        tmp_path / "reviews.csv", "--text-column", "review", "--label-column", "stars", "--dropout", "0.1",
        "--out", tmp_path / "classify", *FINETUNE)
    written = json.loads((tmp_path / "classify" / "model" / "config.json").read_text())
    assert [written[k] for k in ("embedding_dropout", "attention_dropout", "mlp_dropout", "classifier_dropout")] \
        == [0.1] * 4  # --dropout sets every dropout of the architecture
    same_logits(tmp_path / "classify" / "model", "AutoModelForSequenceClassification", "ModernBert",
                ModernBertForSequenceClassification, texts)
    run("finetune", "ner", "--model", model, "--train", data["ner"], "--dev", data["ner"], "--out", tmp_path / "ner",
        *FINETUNE)
    same_logits(tmp_path / "ner" / "model", "AutoModelForTokenClassification", "ModernBert",
                ModernBertForTokenClassification, ["Mary lives in Rome .", "Carl lives in Vienna and Paris ."])
    run("finetune", "squad", "--model", model, "--train", data["squad"], "--dev", data["squad"],
        "--out", tmp_path / "squad", *FINETUNE)
    assert (tmp_path / "squad" / "predictions.json").is_file()
    same_logits(tmp_path / "squad" / "model", "AutoModelForQuestionAnswering", "ModernBert",
                ModernBertForQuestionAnswering, ["Where does mary live ?"],
                ["Mary lives in Rome . The film was good and the music was long ."])
    swag = swag_file(tmp_path / "swag.csv")
    run("finetune", "swag", "--model", model, "--train", swag, "--dev", swag, "--out", tmp_path / "swag", *FINETUNE)
    theirs = transformers.AutoModelForMultipleChoice.from_pretrained(str(tmp_path / "swag" / "model")).eval()
    assert type(theirs).__name__ == "ModernBertForMultipleChoice"
    ours = ModernBertForMultipleChoice.from_pretrained(tmp_path / "swag" / "model").eval()
    choices = ["Mary lives in rome .", "Mary lives in a very long story about the film and the music ."]
    enc = their_inputs(tmp_path / "swag" / "model", ["mary is from rome ."] * 2, choices)
    with torch.no_grad():
        expected = theirs(**{k: v[None] for k, v in enc.items()}).logits
        got = ours(enc["input_ids"][None], enc["attention_mask"][None]).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    capsys.readouterr()

    run("predict", "classify", "--model", tmp_path / "glue" / "model", "--text", "a very good film", "--json")
    assert json.loads(capsys.readouterr().out)["label"] in ("0", "1")
    run("predict", "classify", "--model", tmp_path / "classify" / "model", "--text", "bad", "--json")
    assert json.loads(capsys.readouterr().out)["label"] in ("0", "1")
    run("predict", "ner", "--model", tmp_path / "ner" / "model", "--text", "Mary lives in Rome .", "--json")
    result = json.loads(capsys.readouterr().out)
    assert result["words"] == ["Mary", "lives", "in", "Rome", "."]
    run("predict", "squad", "--model", tmp_path / "squad" / "model", "--question", "Where does Mary live ?",
        "--context", "Mary lives in Rome .", "--json")
    answer = json.loads(capsys.readouterr().out)
    assert answer["answer"] == "" or answer["answer"] in "Mary lives in Rome ."
    run("predict", "swag", "--model", tmp_path / "swag" / "model", "--context", "mary is from rome .",
        "--choice", "Mary lives in rome .", "--choice", "Mary lives in paris .", "--json")
    assert json.loads(capsys.readouterr().out)["choice"] in (0, 1)


def test_a_kind_without_a_model_of_the_architecture_is_refused_in_one_line(made, tmp_path, capsys, monkeypatch):
    """Where bertkit has no task model of a directory's architecture for a kind, fine-tuning stops at once with one
    line naming the kind and the model type (ModernBERT has them all; one is taken away here to see the line)."""
    from bertkit.models import ROLE_CLASSES

    data = write_data(tmp_path)
    row = {k: v for k, v in ROLE_CLASSES["modernbert"].items() if k != "qa"}
    monkeypatch.setitem(ROLE_CLASSES, "modernbert", row)
    err = fails(capsys, "finetune", "squad", "--model", made["model"], "--train", data["squad"], "--dev",
                data["squad"], "--out", tmp_path / "squad", *FINETUNE)
    assert "squad: bertkit has no question-answering model for model_type 'modernbert'" in err


def test_distill_tasks_with_a_modernbert_teacher(made, tmp_path):
    """A ModernBERT teacher fine-tuned on glue / ner -> a ModernBERT student cut from it (hidden-state loss on) and
    a BERT student of the same vocabulary; both written as directories transformers loads with equal logits."""
    from bertkit.models import BertForTokenClassification, ModernBertForSequenceClassification

    model, data = made["model"], write_data(tmp_path)
    run("finetune", "glue", "--task", "sst2", "--model", model, "--train", data["sst2"], "--dev", data["sst2"],
        "--out", tmp_path / "glue", *FINETUNE)
    run("distill", "init-student", "--from", tmp_path / "glue" / "model", "--layers", "0,2",
        "--out", tmp_path / "student")
    run("distill", "glue", "--task", "sst2", "--teacher", tmp_path / "glue" / "model", "--student",
        tmp_path / "student", "--train", data["sst2"], "--dev", data["sst2"], "--alpha-hidden", "1",
        "--out", tmp_path / "distilled", *FINETUNE)
    results = json.loads((tmp_path / "distilled" / "results.json").read_text())
    assert results["student"]["layers"] == 2 and results["teacher"]["layers"] == 3
    same_logits(tmp_path / "distilled" / "model", "AutoModelForSequenceClassification", "ModernBert",
                ModernBertForSequenceClassification, ["a good film", "bad"])

    run("finetune", "ner", "--model", model, "--train", data["ner"], "--dev", data["ner"], "--out", tmp_path / "ner",
        *FINETUNE)
    run("init", "--tokenizer", tmp_path / "ner" / "model", "--preset", "tiny", "--out", tmp_path / "bert-student")
    run("distill", "ner", "--teacher", tmp_path / "ner" / "model", "--student", tmp_path / "bert-student",
        "--train", data["ner"], "--dev", data["ner"], "--alpha-hidden", "1", "--out", tmp_path / "bert-distilled",
        *FINETUNE)
    same_logits(tmp_path / "bert-distilled" / "model", "AutoModelForTokenClassification", "Bert",
                BertForTokenClassification, ["Mary lives in Rome ."])


def test_hidden_state_distillation_sees_what_forward_computes(made):
    """logits_and_hidden' hidden path (encoder, then the head's `scores`) gives the logits of the model's forward."""
    from bertkit.training.distill import logits_and_hidden
    from bertkit.models import ModernBertForSequenceClassification, ModernBertForTokenClassification

    tok = load_tokenizer(made["model"])
    batch = [tok.encode(t).input_ids for t in ("Mary lives in Rome and the film was long and good .", "bad")]
    T = max(map(len, batch))
    ids = torch.tensor([b + [tok.pad_id] * (T - len(b)) for b in batch])
    mask = torch.tensor([[1] * len(b) + [0] * (T - len(b)) for b in batch])
    for cls in (ModernBertForSequenceClassification, ModernBertForTokenClassification):
        model = cls.from_pretrained(made["model"], num_labels=3).eval()
        with torch.no_grad():
            logits, hidden = logits_and_hidden(model, ids, mask, torch.zeros_like(ids), hidden=True)
            torch.testing.assert_close(logits, model(ids, mask).logits, atol=1e-6, rtol=0)
        assert len(hidden) == 4 and hidden[0].shape == (2, T, 32)


def test_distill_mlm_with_modernbert_teachers_and_students(made, tmp_path):
    run("distill", "mlm", "--teacher", made["model"], "--data", made["data"], "--out", tmp_path / "mlm",
        "--student-layers-from-teacher", "0,1", "--alpha-hidden", "1", "--objective", "roberta",
        "--max-seq-length", "32", "--batch-size", "8", "--max-steps", "3", "--save-every", "3",
        "--eval-instances", "8", "--progress", "false")
    theirs, info = transformers.ModernBertForMaskedLM.from_pretrained(str(tmp_path / "mlm" / "model"),
                                                                      output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert theirs.config.num_hidden_layers == 2 and theirs.config.local_attention == 8
    # A BERT teacher and a ModernBERT student of the same vocabulary, last hidden states compared as well.
    run("init", "--tokenizer", made["tok"], "--preset", "tiny", "--out", tmp_path / "bert-teacher")
    run("init", "--model-type", "modernbert", "--tokenizer", made["tok"], "--preset", "tiny", "--out",
        tmp_path / "mb-student")
    run("distill", "mlm", "--teacher", tmp_path / "bert-teacher", "--student", tmp_path / "mb-student",
        "--data", made["data"], "--out", tmp_path / "cross", "--alpha-hidden", "1", "--hidden-map", "last",
        "--objective", "roberta", "--max-seq-length", "32", "--batch-size", "8", "--max-steps", "2",
        "--save-every", "2", "--eval-instances", "8", "--progress", "false")
    student, info = transformers.ModernBertForMaskedLM.from_pretrained(str(tmp_path / "cross" / "model"),
                                                                       output_loading_info=True)
    assert not info["missing_keys"] and student.config.hidden_size == 128
    # And the other way: the ModernBERT teacher, a BERT student (its MLM model, not the NSP one).
    run("distill", "mlm", "--teacher", made["model"], "--student", tmp_path / "bert-teacher", "--data", made["data"],
        "--out", tmp_path / "to-bert", "--objective", "roberta", "--max-seq-length", "32", "--batch-size", "8",
        "--max-steps", "2", "--save-every", "2", "--eval-instances", "8", "--progress", "false")
    assert json.loads((tmp_path / "to-bert" / "model" / "config.json").read_text())["architectures"] == [
        "BertForMaskedLM"]
    bert, info = transformers.BertForMaskedLM.from_pretrained(str(tmp_path / "to-bert" / "model"),
                                                              output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]


def test_init_writes_a_modernbert_directory(made, tmp_path, capsys):
    run("init", "--model-type", "modernbert", "--tokenizer", made["tok"], "--preset", "tiny", "--seed", "3",
        "--out", tmp_path / "scratch")
    theirs, info = transformers.ModernBertForMaskedLM.from_pretrained(str(tmp_path / "scratch"),
                                                                      output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    tok = load_tokenizer(made["tok"])
    config = theirs.config
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (2, 128, tok.vocab_size)
    assert (config.pad_token_id, config.cls_token_id, config.sep_token_id) == (tok.pad_id, tok.cls_id, tok.sep_id)
    run("fill-mask", "--model", tmp_path / "scratch", "--json", "mary lives in [MASK] .")
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["predictions"]
    err = fails(capsys, "init", "--model-type", "modernbert", "--tokenizer", made["tok"], "--preset", "medium",
                "--out", tmp_path / "medium")
    assert "modernbert preset 'medium'" in err and not (tmp_path / "medium").exists()


def test_pretrain_through_the_cli_falls_and_resumes_exactly(made, tmp_path):
    """modernbert-mini on the tiny corpus: the loss falls; stopped after step 7 and resumed, a run logs the losses
    of one that never stopped, bit for bit, with packed isolated documents, WSD and the batch-size warm-up on."""
    options = [*TINY, "--isolate-documents", "true", "--schedule", "wsd", "--decay-fraction", "0.3",
               "--decay-shape", "1-sqrt", "--grad-accumulation", "3", "--batch-size", "4",
               "--batch-warmup-steps", "6", "--max-steps", "16", "--save-every", "8"]
    run("pretrain", "--data", made["data"], "--out", tmp_path / "whole", "--config", "modernbert-mini", *options)
    whole = losses(tmp_path / "whole")
    assert len(whole) == 16 and sum(whole[-4:]) / 4 < sum(whole[:4]) / 4 - 0.3, whole
    records = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    # 1 micro-batch per step, then 2, then the full 3 from step 6 on (logged after each step).
    assert [r["micro_batches"] for r in records if "micro_batches" in r][:8] == [1, 1, 1, 2, 2, 2, 3, 3]
    # Stopped by a token budget (the schedule still spans 16 steps), then resumed without it.
    tokens = {r["step"]: r["tokens"] for r in records if "tokens" in r}
    run("pretrain", "--data", made["data"], "--out", tmp_path / "parts", "--config", "modernbert-mini", *options,
        "--max-tokens", tokens[7])
    assert len(losses(tmp_path / "parts")) == 7
    run("pretrain", "--data", made["data"], "--out", tmp_path / "parts", "--config", "modernbert-mini", *options,
        "--resume")
    assert losses(tmp_path / "parts") == whole
    theirs, info = transformers.ModernBertForMaskedLM.from_pretrained(str(tmp_path / "parts" / "model"),
                                                                      output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]


@pytest.mark.parametrize("objective, named", [("causal", "causal"), ("electra", "electra"),
                                              ("bert", "sentence-pair head")])
def test_objectives_modernbert_cannot_train_are_refused_in_one_line(made, tmp_path, capsys, objective, named):
    err = fails(capsys, "pretrain", "--data", made["data"], "--out", tmp_path / "run", "--config", "modernbert-mini",
                "--objective", objective, "--max-steps", "1")
    assert named in err and "ModernBERT" in err


def test_build_pretraining_refuses_modernbert_configs_clearly():
    from bertkit.config import ModernBertConfig
    from bertkit.training.objectives import build_pretraining

    config = ModernBertConfig.preset("tiny", vocab_size=100, pad_token_id=0)
    for name, named in (("causal", "causal"), ("electra", "electra"), ("bert", "sentence-pair")):
        with pytest.raises(ValueError, match=named):
            build_pretraining(name, config)


def test_pretrain_help_lists_both_families_fields(capsys):
    with pytest.raises(SystemExit):
        main(["pretrain", "--help"])
    text = capsys.readouterr().out
    modern = text[text.index("[model (modernbert"):]
    for flag in ("--global-rope-theta", "--local-attention", "--global-attn-every-n-layers", "--classifier-pooling"):
        assert flag in modern
    assert "--hidden-dropout-prob" in text[text.index("[model]"):text.index("[model (modernbert")]
    for flag in ("--schedule", "--decay-fraction", "--decay-shape", "--batch-warmup-steps"):
        assert flag in text
    assert "modernbert-base" in text and "modernbert-mini" in text


def test_the_modernbert_base_recipe_has_the_papers_settings():
    from bertkit.config import ModernBertConfig
    from bertkit.training.pretrain import resolve_config

    recipe = resolve_config("modernbert-base")
    d, t, m = recipe.data, recipe.train, recipe.model
    assert (d.objective, d.mask_prob, d.isolate_documents, d.max_seq_length) == ("roberta", 0.3, True, 1024)
    assert (t.adam_beta1, t.adam_beta2, t.adam_epsilon, t.weight_decay, t.learning_rate) == (0.9, 0.98, 1e-6, 1e-5,
                                                                                             8e-4)
    assert (t.schedule, t.decay_shape) == ("wsd", "1-sqrt") and t.batch_warmup_steps > 0 and t.grad_accumulation == 6
    assert d.batch_size * 8 * t.grad_accumulation == 4608 and d.batch_size * 8 == 768  # on 8 processes
    config = ModernBertConfig.preset(recipe.preset, **{k: v for k, v in m.items() if k != "model_type"})
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size, config.local_attention,
            config.global_attn_every_n_layers, config.global_rope_theta) == (22, 768, 1152, 128, 3, 10000.0)
    stage2 = resolve_config("modernbert-base", {"max_seq_length": "8192", "global_rope_theta": "160000"})
    assert stage2.model["global_rope_theta"] == 160000.0 and stage2.data.max_seq_length == 8192


def test_a_later_stage_continues_a_modernbert_at_a_longer_length(made, tmp_path, capsys):
    """`pretrain --init-from` a ModernBERT directory at a length past its max_position_embeddings (rotary: a limit,
    no table) with another global rotary base: the limit rises, the base is the command line's, the weights are
    the directory's; a field that changes shapes is refused in one line."""
    from bertkit.models import ModernBertForMaskedLM

    before = ModernBertForMaskedLM.from_pretrained(made["model"]).config
    assert before.max_position_embeddings == 512
    options = [*TINY, "--max-seq-length", "600", "--max-predictions-per-seq", "100", "--batch-size", "2",
               "--max-steps", "1", "--save-every", "1", "--learning-rate", "1e-9", "--warmup-ratio", "0"]
    run("pretrain", "--data", made["data"], "--out", tmp_path / "stage2", "--config", "modernbert-mini",
        "--init-from", made["model"], "--global-rope-theta", "20000", *options)
    after = ModernBertForMaskedLM.from_pretrained(tmp_path / "stage2" / "model")
    assert (after.config.max_position_embeddings, after.config.global_rope_theta) == (600, 20000.0)
    start = ModernBertForMaskedLM.from_pretrained(made["model"]).state_dict()
    for name, value in after.state_dict().items():  # one step at a learning rate of 1e-9: the weights it started from
        torch.testing.assert_close(value, start[name], atol=1e-6, rtol=0)
    err = fails(capsys, "pretrain", "--data", made["data"], "--out", tmp_path / "wider", "--config", "modernbert-mini",
                "--init-from", made["model"], *options, "--intermediate-size", "64")
    assert "change the shapes of its weights" in err and "intermediate_size" in err
