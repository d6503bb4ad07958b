"""`bertkit serve` speaks the embedding ecosystem's APIs: OpenAI's /v1/embeddings (the official Python client on a
real uvicorn), text-embeddings-inference's /embed, /tokenize and /rerank, Cohere's /rerank; the vectors are
sentence-transformers' own for the same directory, the rerank order is `bertkit predict rerank`'s, and bad
requests get /v1/predict's error objects."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")

from conftest import uvicorn_in_thread  # noqa: E402
from serve_models import fixed_vocabulary, sentence  # noqa: E402

from bertkit import BertConfig  # noqa: E402
from bertkit.tasks.finetune import predict  # noqa: E402
from bertkit.models import BertForSequenceClassification, BertModel  # noqa: E402
from bertkit.models.pooling import SentenceEncoder  # noqa: E402
from bertkit.sentence import DenseSpec, SentenceConfig  # noqa: E402
from bertkit.serve import Engine, ServeConfig, create_app  # noqa: E402

TEXTS = ["john lives in paris", "the movie was very good", "a", "nobody knows where anna lives"]


def _config(tokenizer) -> BertConfig:
    return BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64, initializer_range=0.2)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    """An embedding model (mean pooling, Normalize, max 24 tokens), one with cls pooling and a Dense layer, a
    reranker (one-output classifier fine-tuned as rerank) and a classifier."""
    root, tokenizer = tmp_path_factory.mktemp("embedding-models"), fixed_vocabulary()
    torch.manual_seed(0)
    out = {}
    SentenceEncoder(BertModel(_config(tokenizer)), SentenceConfig(("mean",), normalize=True, max_seq_length=24,
                                                                  prompts={"query": "where does "})
                    ).save_pretrained(root / "embed", tokenizer)
    dense = SentenceEncoder(BertModel(_config(tokenizer)), SentenceConfig(
        ("cls",), dense=(DenseSpec("2_Dense", 32, 8, True, "tanh"),)))
    dense.save_pretrained(root / "dense", tokenizer)
    model = BertForSequenceClassification(_config(tokenizer), num_labels=1)
    model.save_pretrained(root / "rerank", tokenizer)
    (root / "rerank" / "finetune.json").write_text(json.dumps({"kind": "rerank", "max_seq_length": 32,
                                                               "label_scale": 1.0}))
    BertForSequenceClassification(_config(tokenizer), num_labels=2).save_pretrained(root / "classify", tokenizer)
    (root / "classify" / "finetune.json").write_text(json.dumps({"kind": "classify", "max_seq_length": 32}))
    out.update(embed=root / "embed", dense=root / "dense", rerank=root / "rerank", classify=root / "classify")
    return out


@contextlib.asynccontextmanager
async def client(app, headers=None):
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://serve.test", timeout=60,
                                     headers=headers) as c:
            yield c


def post_all(app, calls: list[tuple[str, object]], headers=None) -> list[httpx.Response]:
    """POST every (path, body) in turn (a body that is bytes goes as it is); the responses."""
    async def main():
        async with client(app, headers) as c:
            return [await c.post(path, content=body) if isinstance(body, bytes) else await c.post(path, json=body)
                    for path, body in calls]
    return asyncio.run(main())


def sentence_transformers_encode(directory: Path, texts, normalize: bool | None = None) -> np.ndarray:
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(directory), device="cpu")
    return model.encode(list(texts), normalize_embeddings=bool(normalize))


def test_v1_embeddings_float_and_base64_equal_sentence_transformers(dirs):
    app = create_app(Engine(dirs["embed"]), ServeConfig(max_wait_ms=1))
    long = " ".join(["john"] * 40)  # cut to the directory's 24 tokens, as sentence-transformers cuts it
    texts = [*TEXTS, long]
    floats, b64 = post_all(app, [("/v1/embeddings", {"input": texts, "model": "mine"}),
                                 ("/v1/embeddings", {"input": texts, "encoding_format": "base64"})])
    assert floats.status_code == b64.status_code == 200
    body = floats.json()
    expected = sentence_transformers_encode(dirs["embed"], texts)
    assert body["object"] == "list" and body["model"] == "mine"
    assert [d["index"] for d in body["data"]] == list(range(len(texts)))
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in b64.json()["data"]])
    np.testing.assert_array_equal(decoded, got)
    tokenizer = fixed_vocabulary()
    tokens = sum(min(len(tokenizer.encode(t)), 24) for t in texts)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_dense_layer_and_cls_pooling_served_as_sentence_transformers(dirs):
    app = create_app(Engine(dirs["dense"]), ServeConfig(max_wait_ms=1))
    (r,) = post_all(app, [("/v1/embeddings", {"input": TEXTS, "dimensions": 4})])
    full = sentence_transformers_encode(dirs["dense"], TEXTS)
    # `dimensions` keeps the first ones (the model does not normalise: not renormalised)
    np.testing.assert_allclose([d["embedding"] for d in r.json()["data"]], full[:, :4], rtol=0, atol=1e-5)
    (bad,) = post_all(app, [("/v1/predict", {"inputs": TEXTS[:1], "pooling": "mean"})])
    assert "Dense layers take its own pooling (cls)" in bad.json()[0]["error"]


def test_openai_client_against_a_real_server(dirs):
    openai = pytest.importorskip("openai")
    app = create_app(Engine(dirs["embed"]), ServeConfig(max_wait_ms=1), api_key="sekret")
    with uvicorn_in_thread(app) as port:
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sekret", timeout=30, max_retries=0)
        response = api.embeddings.create(model="embed", input=TEXTS)  # the client asks for base64 by default
        single = api.embeddings.create(model="embed", input=TEXTS[0], encoding_format="float")
        wrong = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="nope", max_retries=0, timeout=30)
        with pytest.raises(openai.AuthenticationError):
            wrong.embeddings.create(model="embed", input=TEXTS)
    expected = sentence_transformers_encode(dirs["embed"], TEXTS)
    np.testing.assert_allclose([d.embedding for d in response.data], expected, rtol=0, atol=1e-5)
    np.testing.assert_allclose(single.data[0].embedding, expected[0], rtol=0, atol=1e-5)
    assert response.usage.prompt_tokens == response.usage.total_tokens > 0


def test_tei_embed_normalize_truncate_and_prompt(dirs):
    app = create_app(Engine(dirs["embed"]), ServeConfig(max_wait_ms=1))
    long = " ".join(["anna"] * 40)
    unit, raw, too_long, cut, prompted = post_all(app, [
        ("/embed", {"inputs": TEXTS}), ("/embed", {"inputs": TEXTS[0], "normalize": False}),
        ("/embed", {"inputs": [TEXTS[0], long]}), ("/embed", {"inputs": long, "truncate": True}),
        ("/embed", {"inputs": "anna lives", "prompt_name": "query"})])
    expected = sentence_transformers_encode(dirs["embed"], TEXTS)
    np.testing.assert_allclose(unit.json(), expected, rtol=0, atol=1e-5)
    assert np.linalg.norm(raw.json()[0]) > 1.5  # the mean of the token vectors, not a unit vector
    np.testing.assert_allclose(np.array(raw.json()[0]) / np.linalg.norm(raw.json()[0]), expected[0], atol=1e-5)
    assert too_long.status_code == 413 and "more than 24 tokens" in too_long.json()["error"]
    np.testing.assert_allclose(cut.json()[0], sentence_transformers_encode(dirs["embed"], [long])[0], atol=1e-5)
    np.testing.assert_allclose(prompted.json()[0], sentence_transformers_encode(
        dirs["embed"], ["where does anna lives"])[0], atol=1e-5)


def test_tokenize(dirs):
    app = create_app(Engine(dirs["embed"]), ServeConfig(max_wait_ms=1))
    with_special, without = post_all(app, [("/tokenize", {"inputs": ["john lives", "paris"]}),
                                           ("/tokenize", {"inputs": "john lives", "add_special_tokens": False})])
    first = with_special.json()[0]
    assert [t["text"] for t in first] == ["[CLS]", "john", "lives", "[SEP]"]
    assert [t["special"] for t in first] == [True, False, False, True]
    assert [(t["start"], t["stop"]) for t in first[1:3]] == [(0, 4), (5, 10)]
    assert first[1]["id"] == fixed_vocabulary().token_to_id("john")
    assert [t["text"] for t in without.json()[0]] == ["john", "lives"]


def test_rerank_orders_documents_as_predict_scores_them(dirs):
    app = create_app(Engine(dirs["rerank"]), ServeConfig(max_wait_ms=1))
    import random

    rng = random.Random(5)
    query, documents = "where does john live", [sentence(rng, 2, 12) for _ in range(9)]
    scores = [a["score"] for a in predict(dirs["rerank"], "rerank", [(query, d) for d in documents])]
    order = sorted(range(len(documents)), key=lambda i: -scores[i])
    tei, cohere, raw = post_all(app, [
        ("/rerank", {"query": query, "texts": documents, "return_text": True}),
        ("/v1/rerank", {"query": query, "documents": documents, "top_n": 3, "return_documents": True}),
        ("/rerank", {"query": query, "texts": documents, "raw_scores": True})])
    assert [r["index"] for r in tei.json()] == order
    np.testing.assert_allclose([r["score"] for r in tei.json()], [scores[i] for i in order], atol=1e-6)
    assert tei.json()[0]["text"] == documents[order[0]]
    body = cohere.json()
    assert [r["index"] for r in body["results"]] == order[:3]
    assert body["results"][0]["document"] == {"text": documents[order[0]]} and body["usage"]["total_tokens"] > 0
    logits = [a["logit"] for a in predict(dirs["rerank"], "rerank", [(query, d) for d in documents])]
    np.testing.assert_allclose([r["score"] for r in raw.json()], [logits[i] for i in order], atol=1e-5)


def test_bad_requests_get_the_error_objects_of_v1_predict(dirs):
    app = create_app(Engine(dirs["embed"]), ServeConfig(max_wait_ms=1, max_inputs=3))
    calls = [(path, b'{"inputs": [') for path in ("/v1/predict", "/v1/embeddings", "/embed", "/tokenize")]
    calls += [("/v1/embeddings", {"input": TEXTS}), ("/v1/embeddings", {"input": ["a"], "colour": "red"}),
              ("/v1/embeddings", {"input": [1, 2, 3]}), ("/v1/embeddings", {"input": "a", "encoding_format": "hex"}),
              ("/embed", {"inputs": []}), ("/rerank", {"query": "a", "texts": ["b"]}), ("/v1/predict", [1])]
    responses = post_all(app, calls)
    statuses = [r.status_code for r in responses]
    assert statuses == [400, 400, 400, 400, 413, 422, 422, 422, 422, 404, 422]
    for r in responses:
        assert set(r.json()) == {"error"} and isinstance(r.json()["error"], str)
    assert len({r.content for r in responses[:4]}) == 1  # malformed JSON: the same object on every route
    assert "'input'[0] must be a string, got token ids" in responses[6].json()["error"]
    assert "/rerank needs a cross-encoder" in responses[9].json()["error"]


def test_api_key_and_openapi(dirs):
    app = create_app(Engine(dirs["embed"]), ServeConfig(max_wait_ms=1), api_key="k")

    async def main():
        async with client(app) as c:
            return (await c.post("/v1/embeddings", json={"input": "a"}),
                    await c.post("/v1/embeddings", json={"input": "a"}, headers={"Authorization": "Bearer k"}),
                    await c.get("/v1/model"), await c.get("/healthz"), await c.get("/openapi.json"))

    denied, allowed, model, health, schema = asyncio.run(main())
    assert denied.status_code == 401 and set(denied.json()) == {"error"}
    assert allowed.status_code == 200 and model.status_code == 401 and health.status_code == 200
    paths = schema.json()["paths"]
    assert {"/v1/embeddings", "/embed", "/tokenize", "/v1/predict"} <= set(paths) and "/rerank" not in paths


def test_model_description_says_pooling_and_dimension(dirs):
    info = Engine(dirs["embed"]).describe()
    assert {k: info[k] for k in ("pooling", "normalize", "dimension", "max_seq_length", "dtype")} == {
        "pooling": "mean", "normalize": True, "dimension": 32, "max_seq_length": 24, "dtype": "fp32"}
    info = Engine(dirs["dense"]).describe()
    assert (info["pooling"], info["normalize"], info["dimension"]) == ("cls", False, 8)


def test_int8_on_cpu_stays_close_to_fp32(dirs):
    """Dynamic int8 quantisation of the Linear layers: cosine to the fp32 vectors of at least 0.99 on this tiny
    random model (measured: 0.9984-0.9998 over the four texts)."""
    fp32, int8 = Engine(dirs["embed"]), Engine(dirs["embed"], quantize="int8")
    assert int8.describe()["dtype"] == "int8"
    a = np.array([fp32.prepare(t).finish(fp32.forward(fp32.prepare(t).rows))["embedding"] for t in TEXTS])
    b = np.array([int8.prepare(t).finish(int8.forward(int8.prepare(t).rows))["embedding"] for t in TEXTS])
    cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    assert cos.min() >= 0.99 and not np.array_equal(a, b)
    # The first three layers' FFN output projections (INT8_KEEP; this model has two layers) stay out of int8, in
    # bf16 where the CPU has bf16 matmuls, else fp32; every other Linear layer runs in int8.
    from bertkit.models.pooling import bf16_matmuls

    float_kind = "Bf16Linear" if bf16_matmuls() else "Linear"
    linears = {name: type(m).__name__ for name, m in int8.backend.model.named_modules()
               if name.rsplit(".", 1)[-1] in ("qkv", "out", "up", "down")}
    kept = [name for name, kind in linears.items() if kind == float_kind]
    assert kept == ["layers.0.ffn.down", "layers.1.ffn.down"], linears
    assert set(linears.values()) == {float_kind, "Int8Linear"}, linears
    with pytest.raises(ValueError, match="--quantize int8 is for the torch backend on a CPU"):
        Engine(dirs["embed"], quantize="int8", device="cuda")


def test_v1_embeddings_input_type_applies_the_prompt_and_dimensions_renormalise(dirs):
    from bertkit.features import encode_sentences

    app = create_app(Engine(dirs["embed"]), ServeConfig(max_wait_ms=1))
    query, document, cut, bad = post_all(app, [
        ("/v1/embeddings", {"input": TEXTS, "input_type": "query"}),
        ("/v1/embeddings", {"input": TEXTS, "input_type": "document"}),  # the model has no document prompt
        ("/v1/embeddings", {"input": TEXTS, "input_type": "query", "dimensions": 8}),
        ("/v1/embeddings", {"input": TEXTS, "input_type": "passage"})])
    vectors = lambda r: np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)  # noqa: E731
    np.testing.assert_allclose(vectors(query), encode_sentences(dirs["embed"], TEXTS, prompt="where does "),
                               atol=1e-6)
    np.testing.assert_allclose(vectors(document), encode_sentences(dirs["embed"], TEXTS), atol=1e-6)
    np.testing.assert_allclose(vectors(cut), encode_sentences(dirs["embed"], TEXTS, prompt="where does ",
                                                              dimensions=8), atol=1e-6)
    assert bad.status_code == 422 and "'input_type' must be query or document" in bad.json()["error"]


def test_truncate_false_with_windows_equals_features_window(dirs):
    from bertkit.features import encode_sentences

    long = " ".join(["john lives in paris and anna lives in rome"] * 6)  # ~54 tokens: past the 24
    texts = [TEXTS[0], long]
    windowed = create_app(Engine(dirs["embed"]), ServeConfig(max_wait_ms=1, window=16, stride=5))
    plain = create_app(Engine(dirs["embed"]), ServeConfig(max_wait_ms=1))
    (w,) = post_all(windowed, [("/v1/embeddings", {"input": texts, "truncate": False})])
    (cut,) = post_all(windowed, [("/v1/embeddings", {"input": texts})])
    tei, refused = post_all(plain, [("/v1/embeddings", {"input": texts, "truncate": False}),
                                    ("/embed", {"inputs": texts, "truncate": False})])
    (tei_windows,) = post_all(windowed, [("/embed", {"inputs": texts, "truncate": False})])
    expected = encode_sentences(dirs["embed"], texts, window=16, stride=5)
    got = np.array([d["embedding"] for d in w.json()["data"]], dtype=np.float32)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    np.testing.assert_allclose(np.array(tei_windows.json(), dtype=np.float32), expected, atol=1e-6)
    # the short text is today's vector; the long one, cut at 24 tokens, is not its windows' vector
    np.testing.assert_allclose(got[0], encode_sentences(dirs["embed"], texts[:1])[0], atol=1e-6)
    truncated = np.array([d["embedding"] for d in cut.json()["data"]], dtype=np.float32)
    np.testing.assert_allclose(truncated, encode_sentences(dirs["embed"], texts), atol=1e-6)
    assert np.abs(truncated[1] - got[1]).max() > 1e-3
    assert tei.status_code == 413 and refused.status_code == 413
