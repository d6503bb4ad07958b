"""`bertkit export onnx`: every served head's graph has dynamic batch and sequence axes, and onnxruntime's outputs
equal bertkit's within 1e-4 on batches of rows of different lengths (padding included), for every BERT family."""

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


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["roberta", "albert", "electra", "distilbert"])
def test_every_family_exports(model_type, tmp_path):
    from bertkit.export import export_onnx

    models = build_models(tmp_path, model_type)
    assert {"ner", "squad"} <= set(models)
    for kind in [k for k in ("classify", "ner", "squad") if k in models]:
        summary = export_onnx(models[kind], tmp_path / f"{kind}.onnx")
        assert summary["max_abs_diff"] <= 1e-4
        session = open_session(summary["out"], kind)
        model, _ = load_for_export(models[kind], kind)
        ids, mask, types = batch(model.config, kind, [3, 40, 21], seed=4)
        feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": types.numpy()}
        got = session.run(None, {i.name: feed[i.name] for i in session.get_inputs()})[0]
        want = outputs(model, kind, ids, mask, types)
        if kind != "classify":
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

        from bertkit.finetune import predict
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


def test_t5_is_refused_with_the_reason(tmp_path):
    from bertkit.config import T5Config
    from bertkit.export import export_onnx
    from bertkit.models import T5ForConditionalGeneration

    T5ForConditionalGeneration(T5Config.preset("tiny", vocab_size=64, d_model=16, d_ff=32, d_kv=8)).save_pretrained(
        tmp_path / "t5")
    with pytest.raises(ValueError, match="encoder-decoder generates token by token"):
        export_onnx(tmp_path / "t5", tmp_path / "t5.onnx", "embeddings")
    assert not (tmp_path / "t5.onnx").exists()
