"""Feature-based task models (bertkit.features): the scalar mix, layer choice, task models on frozen encoders
(BERT and ELMo) whose encoder weights stay bit-identical while the mix, BiLSTM and head train, the feature cache,
the encoder trained with a BiLSTM on top (no --frozen), ELMo features and the similarity verb, and the errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bertkit import BertConfig, BertForPreTraining, WordPieceTokenizer
from bertkit.cli import main
from bertkit.config import ElmoConfig
from bertkit.features import (FeatureCache, FeatureTaskModel, ScalarMix, build_task_model, encoder_fingerprint,
                              extract_features, parse_layers, word_similarity)
from bertkit.tasks.finetune import FinetuneConfig, finetune
from bertkit.models import ElmoLanguageModel
from bertkit.tokenizers import WordTokenizer
from bertkit.training.trainer import seed_everything

pytestmark = pytest.mark.usefixtures("one_thread")

SENTENCES = [("John lives in Paris .".split(), "B-PER O O B-LOC O".split()),
             ("Mary visited London and Berlin .".split(), "B-PER O B-LOC O B-LOC O".split()),
             ("the bank of the river Thames".split(), "O O O O O B-LOC".split()),
             ("Peter Smith works at Acme Corp .".split(), "B-PER I-PER O O B-ORG I-ORG O".split())] * 3
TEXTS = [" ".join(w) for w, _ in SENTENCES] + ["he sat on the river bank", "she opened a bank account"]


def conll(path, sentences):
    path.write_text("\n\n".join("\n".join(f"{w} X X {t}" for w, t in zip(words, tags))
                                for words, tags in sentences) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("frozen")
    wordpiece = WordPieceTokenizer.train(texts=TEXTS * 3, vocab_size=90, min_frequency=1, lowercase=False,
                                         show_progress=False)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=wordpiece.vocab_size, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32)
    BertForPreTraining(config).save_pretrained(root / "bert", tokenizer=wordpiece)
    words = WordTokenizer.train(TEXTS[:6], vocab_size=30, max_characters=10, show_progress=False)
    torch.manual_seed(0)
    elmo = ElmoConfig.preset("tiny", vocab_size=words.vocab_size, char_vocab_size=words.char_vocab_size,
                             max_characters=10)
    ElmoLanguageModel(elmo).save_pretrained(root / "elmo", tokenizer=words)
    conll(root / "train.txt", SENTENCES)
    conll(root / "dev.txt", SENTENCES[:4])
    (root / "cls.tsv").write_text("text\tlabel\n" + "".join(f"{t}\t{i % 2}\n" for i, t in enumerate(TEXTS)),
                                  encoding="utf-8")
    return root


def settings(**fields) -> FinetuneConfig:
    base = dict(kind="ner", frozen=True, task_model="bilstm", lstm_hidden=8, epochs=2, batch_size=4,
                learning_rate=1e-2, progress=False, log_every=1)
    return FinetuneConfig(**{**base, **fields})


def test_scalar_mix_is_the_softmax_weighted_sum_times_gamma():
    mix = ScalarMix(3)
    with torch.no_grad():
        mix.scalars.copy_(torch.tensor([0.5, -1.0, 2.0]))
        mix.gamma.fill_(1.5)
    layers = [torch.randn(2, 4, 5) for _ in range(3)]
    w = torch.softmax(torch.tensor([0.5, -1.0, 2.0]), 0)
    torch.testing.assert_close(mix(layers), 1.5 * sum(wi * h for wi, h in zip(w, layers)))
    normed = ScalarMix(1, layer_norm=True)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    out = normed([layers[0] * 7 + 3], mask)
    real = out[mask.bool()]
    real = real.detach()
    assert abs(float(real.mean())) < 1e-5 and abs(float(real.var(unbiased=False)) - 1) < 1e-4
    with pytest.raises(ValueError, match="weighs 3 layers"):
        mix(layers[:2])


def test_layer_choices_and_their_errors():
    assert parse_layers("all", 4) == [0, 1, 2, 3] and parse_layers(None, 3) == [0, 1, 2]
    assert parse_layers("-1,-2", 4) == [3, 2] and parse_layers([0], 2) == [0]
    with pytest.raises(ValueError, match=r"--layers: layer 5 does not exist: the model has 3 layers"):
        parse_layers("5", 4)
    with pytest.raises(ValueError, match="--layers 'x'"):
        parse_layers("x", 4)


def test_frozen_ner_keeps_the_encoder_bit_identical_and_trains_the_rest(dirs, tmp_path):
    config = settings(layers="-1,-2", combine="scalar-mix")
    results = finetune("ner", dirs / "bert", dirs / "train.txt", dirs / "dev.txt", tmp_path / "run", config)
    assert results["features"]["frozen"] and results["features"]["layers"] == [3, 2]
    original = {k.removeprefix("bert."): v for k, v in load_file(str(dirs / "bert" / "model.safetensors")).items()}
    saved = load_file(str(tmp_path / "run" / "model" / "model.safetensors"))
    assert saved.keys() <= original.keys() and len(saved) > 10
    assert all(torch.equal(saved[k], original[k]) for k in saved)  # the encoder never moved
    # The task part starts as a fresh build from the run's seed would (checked twice), and every tensor moved.
    from bertkit.models import ModelDir

    tokenizer = ModelDir.open(dirs / "bert").tokenizer()
    labels = ["O", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
    starts = []
    for _ in range(2):
        seed_everything(0)
        starts.append(build_task_model(dirs / "bert", tokenizer, "token", config, len(labels), labels)[0])
    initial = starts[0].trainable_state()
    assert all(torch.equal(initial[k], starts[1].trainable_state()[k]) for k in initial)
    trained = load_file(str(tmp_path / "run" / "model" / "task_model.safetensors"))
    assert trained.keys() == initial.keys() and any(k.startswith("mix.") for k in trained)
    assert all(not torch.equal(trained[k], initial[k]) for k in trained)
    again = FeatureTaskModel.from_pretrained(tmp_path / "run" / "model")
    assert all(torch.equal(again.trainable_state()[k], trained[k]) for k in trained)


def test_cached_layers_give_the_encoders_results_and_a_cache_file_is_reused(dirs, tmp_path):
    from bertkit.models import ModelDir

    tokenizer = ModelDir.open(dirs / "bert").tokenizer()
    inputs = [{"input_ids": e.input_ids, "token_type_ids": e.token_type_ids}
              for e in tokenizer.encode_batch(TEXTS)]
    path = tmp_path / "cache.safetensors"
    seed_everything(0)
    cached, facts = build_task_model(dirs / "bert", tokenizer, "sequence", settings(feature_cache=str(path)),
                                     train_inputs=inputs)
    assert facts["feature_cache_rows_computed"] == len(set(TEXTS)) and path.is_file()
    seed_everything(0)
    plain, _ = build_task_model(dirs / "bert", tokenizer, "sequence", settings(feature_cache="off"))
    assert plain.cache is None
    ids = torch.tensor([inputs[-1]["input_ids"]])
    cached.eval(), plain.eval()
    torch.testing.assert_close(cached(ids).logits, plain(ids).logits, rtol=1e-2, atol=1e-3)  # float16 storage
    seed_everything(0)
    _, facts = build_task_model(dirs / "bert", tokenizer, "sequence", settings(feature_cache=str(path)),
                                train_inputs=inputs)
    assert facts["feature_cache_rows_computed"] == 0 and "feature_cache_load_s" in facts
    other = FeatureCache("not-this-encoder")
    with pytest.raises(ValueError, match="a feature cache of another encoder"):
        other.load(path)
    assert encoder_fingerprint(dirs / "bert") != encoder_fingerprint(dirs / "elmo")


def test_a_bilstm_without_frozen_trains_the_encoder_too(dirs, tmp_path):
    config = settings(frozen=False, layers="-1", combine="concat", epochs=1)
    finetune("ner", dirs / "bert", dirs / "train.txt", dirs / "dev.txt", tmp_path / "run", config)
    original = {k.removeprefix("bert."): v for k, v in load_file(str(dirs / "bert" / "model.safetensors")).items()}
    saved = load_file(str(tmp_path / "run" / "model" / "model.safetensors"))
    moved = [k for k in saved if k in original and not torch.equal(saved[k], original[k])]
    assert any("encoder.layer.2" in k for k in moved)  # the layer read by the BiLSTM was trained


def test_frozen_squad_answers_with_start_and_end_scores(dirs, tmp_path):
    context = "John lives in Paris . Mary visited London ."
    qas = [{"id": str(i), "question": q, "answers": [{"text": a, "answer_start": context.index(a)}]}
           for i, (q, a) in enumerate([("where does John live ?", "Paris"), ("what did Mary visit ?", "London")])]
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": qas}]}]}), encoding="utf-8")
    results = finetune("squad", dirs / "bert", path, path, tmp_path / "run",
                       settings(kind="squad", max_seq_length=32, doc_stride=8, max_query_length=8, epochs=1))
    assert results["features"]["frozen"] and {"exact_match", "f1"} <= set(results["best"])
    assert (tmp_path / "run" / "predictions.json").is_file()


def test_frozen_elmo_classifies_and_ner_runs_from_the_command_line(dirs, tmp_path):
    code = main(["finetune", "classify", "--model", str(dirs / "elmo"), "--train", str(dirs / "cls.tsv"), "--dev",
                 str(dirs / "cls.tsv"), "--out", str(tmp_path / "cls"), "--frozen", "--task-model", "bilstm",
                 "--lstm-hidden", "8", "--epochs", "1", "--batch-size", "4", "--quiet"])
    assert code == 0
    results = json.loads((tmp_path / "cls" / "results.json").read_text())
    assert results["features"]["encoder_layers"] == 3 and results["features"]["layers"] == [0, 1, 2]
    original = load_file(str(dirs / "elmo" / "model.safetensors"))
    saved = load_file(str(tmp_path / "cls" / "model" / "model.safetensors"))
    assert all(torch.equal(saved[k], original[k]) for k in saved) and "softmax.weight" not in saved
    code = main(["finetune", "ner", "--model", str(dirs / "elmo"), "--train", str(dirs / "train.txt"), "--dev",
                 str(dirs / "dev.txt"), "--out", str(tmp_path / "ner"), "--frozen", "--layers=-1", "--combine",
                 "concat", "--epochs", "1", "--batch-size", "4", "--quiet"])
    assert code == 0


def test_an_encoder_without_hidden_states_is_refused_by_name():
    from bertkit.features import encoder_hidden_states

    class NoLayers(torch.nn.Module):
        def forward(self, input_ids, attention_mask, token_type_ids):  # no output_hidden_states switch
            return input_ids

    ids = torch.ones(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="the NoLayers encoder gives no hidden_states to read"):
        encoder_hidden_states(NoLayers(), ids, ids)


def test_bad_inputs_are_one_line_errors(dirs, tmp_path, capsys):
    base = ["finetune", "ner", "--train", str(dirs / "train.txt"), "--dev", str(dirs / "dev.txt"), "--quiet"]
    cases = [
        (["--model", str(dirs / "elmo"), "--out", str(tmp_path / "a")], "add --frozen"),
        (["--model", str(dirs / "elmo"), "--out", str(tmp_path / "b"), "--frozen", "--layers", "5"],
         "--layers: layer 5 does not exist: the model has 2 layers"),
        (["--model", str(dirs / "bert"), "--out", str(tmp_path / "c"), "--combine", "mean"], "combine must be"),
        (["--model", str(dirs / "bert"), "--out", str(tmp_path / "d"), "--feature-cache", "x.safetensors"],
         "add --frozen"),
    ]
    for extra, message in cases:
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err


def test_elmo_features_and_the_same_word_in_two_contexts(dirs, tmp_path, capsys):
    result = word_similarity(dirs / "elmo", "bank", TEXTS[-2:])
    assert result["tokens"] == ["bank", "bank"]
    layer0, *upper = result["layers"]
    assert layer0["identical"] and layer0["cosine"][0][1] == pytest.approx(1.0)
    assert len(upper) == 2 and not any(layer["identical"] for layer in upper)
    features, tokens = extract_features(dirs / "elmo", TEXTS[-2:], layers=[0, 1, 2], combine="none")
    assert tokens[0][0] == "<s>" and features[0].shape == (len(tokens[0]), 3, 2 * 32)
    i, j = tokens[0].index("bank"), tokens[1].index("bank")
    assert np.array_equal(features[0][i, 0], features[1][j, 0]) and not np.allclose(features[0][i, 1],
                                                                                    features[1][j, 1])
    assert main(["similarity", "--model", str(dirs / "elmo"), "--word", "bank", *TEXTS[-2:]]) == 0
    lines = tmp_path / "lines.txt"
    lines.write_text("the bank of the river\nan extraordinarily ☃ bank\n", encoding="utf-8")
    capsys_free = main(["features", "--model", str(dirs / "elmo"), "--input", str(lines), "--layers", "0,2",
                        "--out", str(tmp_path / "f.npz")])
    assert capsys_free == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # "extraordinarily" (15 letters) is cut to max_characters - 2 = 8; the snowman is no known character
    known = set(WordTokenizer.from_pretrained(dirs / "elmo").chars)
    words = "the bank of the river an extraordinarily ☃ bank".split()
    unknown = sum(c not in known for w in words for c in w[:8])
    assert "☃" not in known and unknown >= 1
    assert report["truncated_words"] == 1 and report["unknown_chars"] == unknown
    assert report["feature_shape"] == ["T", 128]
    with pytest.raises(ValueError, match="does not occur in text 2"):
        word_similarity(dirs / "elmo", "bank", [TEXTS[-1], "no such word"])
