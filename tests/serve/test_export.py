"""`bertkit export onnx`: every served head's graph has dynamic batch and sequence axes, and onnxruntime's outputs
equal bertkit's within 1e-4 on batches of rows of different lengths (padding included), for every head of every
family that exports (BERT, RoBERTa, ALBERT, ELECTRA, DistilBERT, causal, ModernBERT); the families export refuses
(T5, XLNet, ELMo, `bertkit.tasks.base.REFUSED`) are refused in one line with the table's reason."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
pytest.importorskip("onnxscript")

from serve_models import build_models  # noqa: E402

from bertkit.cli import main  # noqa: E402
from bertkit.export import load_for_export, open_session  # noqa: E402

# Three heads in the quick run; the others (a few seconds each) with -m slow.
KINDS = ("classify", "ner", "squad", *(pytest.param(k, marks=pytest.mark.slow) for k in ("swag", "fill-mask",
                                                                                        "embeddings")))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return build_models(tmp_path_factory.mktemp("export-models"))


@pytest.fixture(scope="module")
def exported(models, tmp_path_factory):
    """kind -> (model directory, ONNX file written by the command line, its printed summary); written once."""
    out, cache = tmp_path_factory.mktemp("onnx"), {}

    def get(kind: str, capsys):
        if kind not in cache:
            directory = models[kind] if kind in models else models["pretraining"]
            path = out / f"{kind}.onnx"
            args = ["export", "onnx", "--model", str(directory), "--out", str(path)]
            if kind in ("fill-mask", "embeddings"):
                args += ["--task", kind]
            assert main(args) == 0
            cache[kind] = directory, path, json.loads(capsys.readouterr().out)
        return cache[kind]

    return get


def batch(config, kind: str, lengths: list[int], seed: int):
    """Random ids at the given real lengths, padded with the pad id; both token types; (B, 3, T) for swag."""
    g = torch.Generator().manual_seed(seed)
    rows = [n for n in lengths for _ in range(3 if kind == "swag" else 1)]
    T = max(rows)
    ids = torch.full((len(rows), T), config.pad_token_id)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    types = torch.zeros(len(rows), T, dtype=torch.long)
    for i, n in enumerate(rows):
        ids[i, :n] = torch.randint(5, config.vocab_size, (n,), generator=g)
        mask[i, :n] = 1
        types[i, n // 2:n] = 1 if getattr(config, "type_vocab_size", 1) > 1 else 0
    if kind == "swag":
        shape = (len(lengths), 3, T)
        return ids.view(shape), mask.view(shape), types.view(shape)
    return ids, mask, types


def outputs(model, kind, ids, mask, types):
    """bertkit's own output (its default fast paths: unpadded) for the graph's output."""
    with torch.no_grad():
        out = model(ids, mask, types)
    if kind == "embeddings":
        return out.last_hidden_state.numpy()
    if kind == "fill-mask":
        return out.prediction_logits.numpy()
    return out.logits.numpy()


@pytest.mark.parametrize("kind", KINDS)
def test_onnxruntime_equals_bertkit_on_rows_of_different_lengths(kind, exported, capsys):
    directory, path, summary = exported(kind, capsys)
    assert summary["kind"] == kind and summary["opset"] == 18 and summary["max_abs_diff"] <= 1e-4
    session = open_session(path, kind)
    for spec in session.get_inputs():  # batch, (choices,) sequence: named dimensions, not numbers
        assert all(isinstance(d, str) for d in spec.shape), spec
    model, _ = load_for_export(directory, kind)
    for seed, lengths in enumerate(([2, 17, 64], [9], [33, 5, 5, 12])):  # lengths the export never saw
        ids, mask, types = batch(model.config, kind, lengths, seed)
        feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": types.numpy()}
        got = session.run(None, {i.name: feed[i.name] for i in session.get_inputs()})[0]
        want = outputs(model, kind, ids, mask, types)
        assert got.shape == want.shape
        if kind in ("ner", "squad", "fill-mask", "embeddings"):
            real = mask.numpy().astype(bool)
            got, want = got[real], want[real]
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_a_graph_of_another_head_is_refused(exported, capsys, tmp_path):
    _, path, _ = exported("classify", capsys)
    with pytest.raises(ValueError, match="holds a classify graph, not ner"):
        open_session(path, "ner")
    with pytest.raises(FileNotFoundError, match="bertkit export onnx"):
        open_session(tmp_path / "missing.onnx", "classify")


# Every other family's served heads, cell by cell (BERT's are above, ModernBERT's below; T5, XLNet and ELMo are
# refused). The heads new to a family without a pooler in the quick run: DistilBERT's pre_classifier (sequence
# classification; multiple choice is the same head) and ELECTRA's sequence summary; the rest with -m slow.
FAMILY_CELLS = [pytest.param(model_type, kind, id=f"{model_type}-{kind}",
                             marks=[] if (model_type, kind) in {("distilbert", "classify"), ("electra", "swag")}
                             else [pytest.mark.slow])
                for model_type in ("roberta", "albert", "electra", "distilbert", "causal")
                for kind in ("classify", "ner", "squad", "swag")]


@pytest.fixture(scope="module")
def family_models(tmp_path_factory):
    root, made = tmp_path_factory.mktemp("export-families"), {}

    def get(model_type: str) -> dict:
        if model_type not in made:
            made[model_type] = build_models(root / model_type, model_type)
        return made[model_type]

    return get


@pytest.mark.parametrize("model_type, kind", FAMILY_CELLS)
def test_every_family_exports_every_served_head(model_type, kind, family_models, tmp_path):
    from bertkit.export import export_onnx

    directory = family_models(model_type)[kind]
    summary = export_onnx(directory, tmp_path / f"{kind}.onnx")
    assert summary["kind"] == kind and summary["max_abs_diff"] <= 1e-4
    session = open_session(summary["out"], kind)
    model, _ = load_for_export(directory, kind)
    assert model.config.model_type == ("bert" if model_type == "causal" else model_type)
    ids, mask, types = batch(model.config, kind, [3, 40, 21], seed=4)
    feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": types.numpy()}
    got = session.run(None, {i.name: feed[i.name] for i in session.get_inputs()})[0]
    want = outputs(model, kind, ids, mask, types)
    if kind in ("ner", "squad"):
        real = mask.numpy().astype(bool)
        got, want = got[real], want[real]
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def modernbert(tmp_path_factory):
    return build_models(tmp_path_factory.mktemp("export-modernbert"), "modernbert")


# ModernBERT (rotary positions, a sliding-window layer, no token types): every head the server serves for it. The
# token tagger in the quick run (per token, where the window matters); the others with -m slow.
MODERNBERT_KINDS = ("ner", *(pytest.param(k, marks=pytest.mark.slow) for k in ("classify", "squad", "swag",
                                                                                "fill-mask", "embeddings")))


@pytest.mark.parametrize("kind", MODERNBERT_KINDS)
def test_modernbert_exports_every_served_head(kind, modernbert, tmp_path):
    """Rows longer than the window (+-4 tokens) and of different lengths: onnxruntime equals bertkit's unpadded
    path within 1e-4 at every real position, and `serve --backend onnx` answers as `predict` does."""
    from bertkit.export import export_onnx

    directory = modernbert.get(kind, modernbert["pretraining"])
    summary = export_onnx(directory, tmp_path / f"{kind}.onnx", kind)
    assert summary["kind"] == kind and summary["max_abs_diff"] <= 1e-4
    session = open_session(summary["out"], kind)
    model, _ = load_for_export(directory, kind)
    assert model.config.model_type == "modernbert"
    for seed, lengths in enumerate(([2, 17, 40], [23, 5, 5, 12])):
        ids, mask, types = batch(model.config, kind, lengths, seed)
        feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": types.numpy()}
        got = session.run(None, {i.name: feed[i.name] for i in session.get_inputs()})[0]
        want = outputs(model, kind, ids, mask, types)
        if kind in ("ner", "squad", "fill-mask", "embeddings"):
            real = mask.numpy().astype(bool)
            got, want = got[real], want[real]
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    if kind in ("classify", "ner", "squad", "swag"):
        from serve_models import as_predict_input, assert_same, inputs_for

        from bertkit.tasks.finetune import predict
        from bertkit.serve import Engine

        engine = Engine(directory, kind, backend="onnx", onnx_path=summary["out"])
        items = inputs_for(kind, 12, seed=3)
        rows = [engine.prepare(x, i) for i, x in enumerate(items)]
        outs = engine.forward([r for p in rows for r in p.rows])
        answers, at = [], 0
        for p in rows:
            answers.append(p.finish(outs[at:at + len(p.rows)]))
            at += len(p.rows)
        want = [predict(directory, kind, [as_predict_input(kind, x)])[0] for x in items]  # pairs and single texts
        for got, ref in zip(answers, want):
            got.pop("truncated", None)
            assert_same(got, ref, tol=1e-4)


def refused_directory(model_type: str, path):
    """A tiny directory of a family the export refuses: T5, an XLNet classifier, an ELMo language model."""
    from bertkit.config import ElmoConfig, T5Config, XLNetConfig
    from bertkit.models import ElmoLanguageModel, T5ForConditionalGeneration, XLNetForSequenceClassification

    if model_type == "t5":
        model = T5ForConditionalGeneration(T5Config.preset("tiny", vocab_size=64, d_model=16, d_ff=32, d_kv=8))
    elif model_type == "xlnet":
        model = XLNetForSequenceClassification(XLNetConfig(vocab_size=64, d_model=16, n_layer=1, n_head=2, d_inner=32),
                                               num_labels=2)
    else:
        model = ElmoLanguageModel(ElmoConfig.preset("tiny", vocab_size=30, char_vocab_size=40, max_characters=10))
    model.save_pretrained(path)
    return path


@pytest.mark.parametrize("model_type, kind", [("t5", "embeddings"), ("xlnet", "classify"), ("elmo", "embeddings")])
def test_refused_families_are_refused_in_one_line_with_the_reason(model_type, kind, tmp_path, capsys):
    from bertkit.export import export_onnx
    from bertkit.tasks.base import REFUSED

    directory = refused_directory(model_type, tmp_path / model_type)
    with pytest.raises(ValueError) as caught:
        export_onnx(directory, tmp_path / "out.onnx", kind)
    assert REFUSED[model_type, "export"] in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "out.onnx").exists()
    assert main(["export", "onnx", "--model", str(directory), "--out", str(tmp_path / "out.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and REFUSED[model_type, "export"] in err, err
