"""`bertkit serve`: every answer equals `bertkit predict` (fill-mask, features) on the same input under many
concurrent clients, nothing lost or duplicated; the limits (400, 413, 422, 503 with Retry-After, 500) never stop
the server; /healthz, /metrics, /openapi.json, /docs, /v1/model; a real uvicorn on 127.0.0.1; SIGTERM finishes
the requests in flight."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")

from conftest import uvicorn_in_thread  # noqa: E402
from serve_models import as_predict_input, assert_same, build_models, inputs_for  # noqa: E402

from bertkit.features import extract_features  # noqa: E402
from bertkit.tasks.finetune import predict  # noqa: E402
from bertkit.inference import fill_mask  # noqa: E402
from bertkit.serve import Engine, ServeConfig, create_app  # noqa: E402
from bertkit.serve.app import _json_bytes  # noqa: E402
from bertkit.tokenizers import load_tokenizer  # noqa: E402

TASKS = ("classify", "ner", "squad", "swag")
KINDS = (*TASKS, "fill-mask", "embeddings")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    return build_models(tmp_path_factory.mktemp("serve-models"))


def model_dir(models, kind: str) -> Path:
    return models[kind] if kind in TASKS else models["pretraining"]


def make_app(models, kind: str, **config):
    engine = Engine(model_dir(models, kind), None if kind in TASKS else kind)
    return create_app(engine, ServeConfig(**config))


@contextlib.asynccontextmanager
async def client(app):
    """An in-process client of the app, with its lifespan (the batching worker) running."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://serve.test", timeout=60) as c:
            yield c


def references(models, kind: str, items: list[dict]) -> list[dict]:
    """What the library gives for each input, without the server: predict, fill_mask or extract_features."""
    path = model_dir(models, kind)
    if kind in TASKS:  # predict takes inputs all with a pair or none: one call per group
        out: list = [None] * len(items)
        for paired in (False, True):
            chosen = [i for i, x in enumerate(items) if (x.get("pair") is not None) == paired]
            if chosen:
                for i, answer in zip(chosen, predict(path, kind, [as_predict_input(kind, items[i]) for i in chosen])):
                    out[i] = answer
        return out
    if kind == "fill-mask":
        from bertkit.models import BertForPreTraining

        model, tokenizer = BertForPreTraining.from_pretrained(path).eval(), load_tokenizer(path)
        return [{"text": x["text"], "predictions": fill_mask(model, x["text"], tokenizer=tokenizer)} for x in items]
    features, tokens = extract_features(path, [x["text"] for x in items], layers=[-1], max_seq_length=64)
    return [{"tokens": t, "embedding": f.mean(0).tolist()} for f, t in zip(features, tokens)]


def truncated(models, kind: str, item: dict) -> bool:
    """Whether the input is longer than the model takes (computed here from the tokenizer alone)."""
    tok = load_tokenizer(model_dir(models, kind))
    if kind == "classify":
        return len(tok.encode(item["text"], pair=item.get("pair"))) > 24
    if kind == "ner":
        return sum(len(tok.encode_raw([w])[0].ids) for w in item["text"].split()) + 2 > 24
    if kind == "squad":
        return len(tok.encode_raw([item["question"]])[0].ids) > 8
    if kind == "swag":
        return any(len(tok.encode(item["context"], pair=c)) > 24 for c in item["choices"])
    return len(tok.encode(item["text"])) > 64


# ------------------------------------------------------------------------------------------------------------------
# Answers under concurrency
# ------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_concurrent_answers_equal_predict(models, kind):
    """60 clients at once, 1-4 inputs each of varied lengths (as a list, one object, or the bare input): every
    answer equals the library's on that input; the rows of different requests shared forward passes."""
    rng = random.Random(1)
    items = inputs_for(kind, 120, seed=2)
    requests, at = [], 0
    while at < len(items):
        n = rng.randint(1, 4)
        requests.append(items[at:at + n])
        at += n
    app = make_app(models, kind, max_wait_ms=10, max_batch_tokens=2048)

    def body(chunk: list[dict], i: int):
        if len(chunk) == 1 and i % 3 == 1:
            return chunk[0]  # the input itself
        if len(chunk) == 1 and i % 3 == 2:
            return {"inputs": chunk[0]}
        return {"inputs": chunk}

    async def main():
        async with client(app) as c:
            responses = await asyncio.gather(*[c.post("/v1/predict", json=body(chunk, i))
                                               for i, chunk in enumerate(requests)])
            return responses, (await c.get("/metrics")).text

    responses, metrics = asyncio.run(main())
    assert [r.status_code for r in responses] == [200] * len(requests)
    answers = [a for r in responses for a in r.json()]
    assert len(answers) == len(items)  # nothing lost or duplicated
    want = references(models, kind, items)
    flagged = 0
    for i, (item, got, ref) in enumerate(zip(items, answers, want)):
        assert got.pop("truncated", False) == truncated(models, kind, item), i
        flagged += truncated(models, kind, item)
        assert_same(got, ref, f"input {i}")
    assert flagged > 0 or kind in ("fill-mask", "embeddings")  # long inputs are among them
    batches = sum(int(float(line.split()[-1])) for line in metrics.splitlines()
                  if line.startswith("bertkit_batches_total{"))
    assert 0 < batches < len(requests)  # requests shared forward passes


def test_onnx_backend_answers_equal_predict(models, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from bertkit.export import export_onnx

    path = export_onnx(models["classify"], tmp_path / "classify.onnx")["out"]
    app = create_app(Engine(models["classify"], backend="onnx", onnx_path=path), ServeConfig(max_wait_ms=10))
    items = inputs_for("classify", 40, seed=5)

    async def main():
        async with client(app) as c:
            info = (await c.get("/v1/model")).json()
            responses = await asyncio.gather(*[c.post("/v1/predict", json={"inputs": [x]}) for x in items])
            return info, [r.json()[0] for r in responses]

    info, answers = asyncio.run(main())
    assert info["backend"] == "onnx"
    for got, ref in zip(answers, references(models, "classify", items)):
        got.pop("truncated", None)
        assert_same(got, ref, tol=1e-4)


def test_embeddings_pooling_choices(models):
    app = make_app(models, "embeddings")
    text = "john lives in paris"

    async def main():
        async with client(app) as c:
            return [(await c.post("/v1/predict", json={"inputs": [text], "pooling": p})).json()[0]
                    for p in ("cls", "none")]

    cls, none = asyncio.run(main())
    (features,), (tokens,) = extract_features(model_dir(models, "embeddings"), [text], layers=[-1])
    assert cls["tokens"] == none["tokens"] == tokens
    np.testing.assert_allclose(cls["embedding"], features[0], atol=1e-5)
    np.testing.assert_allclose(none["token_embeddings"], features, atol=1e-5)


def test_a_text_to_text_model_generates_its_answers(tmp_path):
    """A T5 fine-tuned as text to text (here: random weights and its finetune.json) is served as its task's kind,
    its answers generated greedily in batches, equal to predict's."""
    import torch

    from bertkit.config import T5Config
    from bertkit.models import T5ForConditionalGeneration
    from bertkit.tokenizers import UnigramTokenizer

    texts = ["classify text: the movie was good", "the movie was bad", "john lives in paris", "pos neg"] * 20
    tokenizer = UnigramTokenizer.train(texts, vocab_size=100, show_progress=False, extra_ids=5)
    torch.manual_seed(1)  # weights whose greedy generations are not all empty
    config = T5Config.preset("tiny", vocab_size=tokenizer.vocab_size, initializer_factor=5.0, d_model=32, d_ff=64,
                             d_kv=16)
    T5ForConditionalGeneration(config).save_pretrained(tmp_path / "t5", tokenizer=tokenizer)
    (tmp_path / "t5" / "finetune.json").write_text(json.dumps(
        {"kind": "classify", "task": None, "text_to_text": True, "max_seq_length": 32, "max_target_length": 4,
         "labels": ["neg", "pos"], "regression": False, "text_column": "text", "pair_column": None}))
    items = [{"text": t} for t in ["the movie was good", "john lives in paris and the movie was bad", "pos",
                                   "neg neg", "paris", "the movie"] * 2]
    app = create_app(Engine(tmp_path / "t5"), ServeConfig(max_wait_ms=20))

    async def main():
        async with client(app) as c:
            info = (await c.get("/v1/model")).json()
            responses = await asyncio.gather(*[c.post("/v1/predict", json={"inputs": [x]}) for x in items])
            return info, [r.json()[0] for r in responses]

    info, answers = asyncio.run(main())
    assert info["kind"] == "classify" and info["text_to_text"] is True
    want = predict(tmp_path / "t5", None, [x["text"] for x in items])
    assert answers == want and any(a["text"] for a in answers)


# ------------------------------------------------------------------------------------------------------------------
# Limits and bad input
# ------------------------------------------------------------------------------------------------------------------
async def chunks(*parts: bytes):
    """A body sent in chunks, without Content-Length."""
    for part in parts:
        yield part


def test_bad_requests_get_their_status_and_the_server_stays(models):
    app = make_app(models, "classify", max_request_bytes=2000, max_inputs=5)

    async def main():
        async with client(app) as c:
            post = lambda **kw: c.post("/v1/predict", **kw)  # noqa: E731
            out = {
                "malformed": await post(content=b'{"inputs": [{"text": "a"}'),
                "not utf-8": await post(content=b'{"inputs": ["\xff\xfe"]}'),
                "a list": await post(json=[{"text": "a"}]),
                "unknown top field": await post(json={"inputs": [{"text": "a"}], "topk": 3}),
                "unknown input field": await post(json={"inputs": [{"text": "a"}, {"txt": "b"}]}),
                "unknown bare field": await post(json={"text": "a", "label": "pos"}),
                "inputs not a list": await post(json={"inputs": 3}),
                "bad top_k": await post(json={"inputs": ["a"], "top_k": 0}),
                "too many inputs": await post(json={"inputs": ["a"] * 6}),
                "too large": await post(content=b'{"inputs": ["' + b"a " * 1500 + b'"]}'),
                "too large, streamed": await post(content=chunks(b'{"inputs": ["', b"a " * 1500, b'"]}')),
                "wrong method": await c.get("/v1/predict"),
            }
            mixed = await post(json={"inputs": [{"text": "good"}, {"text": 5}, {"pair": "no text"}, "plain text",
                                                {"text": "a pair", "pair": "of texts"}]})
            health = await c.get("/healthz")
            return out, mixed, health

    out, mixed, health = asyncio.run(main())
    expected = {"malformed": 400, "not utf-8": 400, "a list": 422, "unknown top field": 422,
                "unknown input field": 422, "unknown bare field": 422, "inputs not a list": 422, "bad top_k": 422,
                "too many inputs": 413, "too large": 413, "too large, streamed": 413, "wrong method": 405}
    assert {k: r.status_code for k, r in out.items()} == expected
    for name in expected:
        if name != "wrong method":
            assert isinstance(out[name].json()["error"], str) and out[name].json()["error"]
    assert "'topk'" in out["unknown top field"].json()["error"]
    message = out["unknown input field"].json()["error"]
    assert "inputs[1]" in message and "'txt'" in message
    assert "line 1" in out["malformed"].json()["error"]
    assert mixed.status_code == 200
    answers = mixed.json()
    assert [("error" in a) for a in answers] == [False, True, True, False, False]
    assert "must be a string" in answers[1]["error"] and "'text' is missing" in answers[2]["error"]
    want = predict(model_dir(models, "classify"), "classify", ["good"])[0]
    assert_same(answers[0], want)
    assert_same(answers[4], predict(model_dir(models, "classify"), "classify", [("a pair", "of texts")])[0])
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_a_mixed_storm_of_good_malformed_oversized_and_truncated_requests(models):
    """The acceptance's mix: good requests still equal predict, every bad one gets its status, /healthz answers."""
    rng = random.Random(7)
    good = inputs_for("classify", 80, seed=8)
    long = [{"text": " ".join(["paris"] * 200)} for _ in range(5)]
    app = make_app(models, "classify", max_request_bytes=4096)
    bodies = [("good", {"inputs": [x]}) for x in good] + [("long", {"inputs": [x]}) for x in long]
    bodies += [("malformed", b'{"inputs": [{"text": "oops"]}')] * 10 + [("oversized", b'{"inputs": ["' +
                                                                        b"x" * 5000 + b'"]}')] * 10
    rng.shuffle(bodies)

    async def main():
        async with client(app) as c:
            async def send(body):
                if isinstance(body, bytes):
                    return await c.post("/v1/predict", content=body, headers={"content-type": "application/json"})
                return await c.post("/v1/predict", json=body)

            responses = await asyncio.gather(*[send(b) for _, b in bodies])
            return responses, await c.get("/healthz")

    responses, health = asyncio.run(main())
    by_kind: dict[str, list] = {}
    for (kind, body), r in zip(bodies, responses):
        by_kind.setdefault(kind, []).append((body, r))
    assert all(r.status_code == 400 for _, r in by_kind["malformed"])
    assert all(r.status_code == 413 for _, r in by_kind["oversized"])
    assert all(r.status_code == 200 and r.json()[0]["truncated"] is True for _, r in by_kind["long"])
    items = [b["inputs"][0] for b, _ in by_kind["good"]]
    for (body, r), ref in zip(by_kind["good"], references(models, "classify", items)):
        got = r.json()[0]
        got.pop("truncated", None)
        assert_same(got, ref)
    assert health.status_code == 200


def test_a_full_queue_answers_503_with_retry_after(models):
    app = make_app(models, "classify", max_queue=1, max_wait_ms=0)
    engine = app.state.engine
    plain = engine.backend

    def slow(rows):
        time.sleep(0.4)
        return plain(rows)

    async def main():
        async with client(app) as c:
            engine.backend = slow
            first = asyncio.ensure_future(c.post("/v1/predict", json={"inputs": ["one"]}))
            await asyncio.sleep(0.15)  # in its forward pass
            second = asyncio.ensure_future(c.post("/v1/predict", json={"inputs": ["two"]}))
            await asyncio.sleep(0.05)  # waiting: the queue is full
            third = await c.post("/v1/predict", json={"inputs": ["three"]})
            done = await asyncio.gather(first, second)
            engine.backend = plain
            return third, done, await c.get("/healthz"), (await c.get("/metrics")).text

    third, done, health, metrics = asyncio.run(main())
    assert third.status_code == 503 and int(third.headers["retry-after"]) >= 1
    assert "queue is full" in third.json()["error"]
    assert [r.status_code for r in done] == [200, 200] and health.status_code == 200
    assert 'bertkit_requests_total{path="/v1/predict",code="503"} 1' in metrics


def test_a_failing_forward_pass_is_a_500_and_the_next_request_is_answered(models):
    app = make_app(models, "classify")
    engine = app.state.engine
    plain = engine.backend
    calls = []

    def fails_once(rows):
        calls.append(len(rows))
        if len(calls) == 1:
            raise RuntimeError("out of memory, say")
        return plain(rows)

    async def main():
        async with client(app) as c:
            engine.backend = fails_once
            return [await c.post("/v1/predict", json={"inputs": ["x"]}) for _ in range(2)]

    failed, ok = asyncio.run(main())
    assert failed.status_code == 500 and "out of memory" in failed.json()["error"]
    assert ok.status_code == 200 and "label" in ok.json()[0]


def test_infinite_numbers_are_written_as_valid_json():
    body = _json_bytes([{"answer": "", "null_odds": float("inf"), "nbest": [{"x": float("-inf")}]}])
    assert json.loads(body) == [{"answer": "", "null_odds": "inf", "nbest": [{"x": "-inf"}]}]


# ------------------------------------------------------------------------------------------------------------------
# The other routes
# ------------------------------------------------------------------------------------------------------------------
def test_healthz_metrics_schema_docs_model_and_page(models):
    app = make_app(models, "ner")

    async def main():
        async with client(app) as c:
            await c.post("/v1/predict", json={"inputs": ["john lives in paris", "mary"]})
            await c.post("/v1/predict", content=b"{")
            out = {path: await c.get(path) for path in ("/healthz", "/metrics", "/openapi.json", "/docs",
                                                       "/v1/model", "/")}
            out["/docs in a browser"] = await c.get("/docs", headers={"accept": "text/html,*/*;q=0.8"})
            return out

    r = asyncio.run(main())
    assert r["/healthz"].json()["status"] == "ok"
    text = r["/metrics"].text
    assert r["/metrics"].headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)  # every sample line is "name{labels} number"
    assert samples['bertkit_requests_total{path="/v1/predict",code="200"}'] == 1
    assert samples['bertkit_requests_total{path="/v1/predict",code="400"}'] == 1
    assert samples['bertkit_inputs_total{result="ok"}'] == 2
    assert samples["bertkit_batch_rows_count"] >= 1 and samples['bertkit_batch_rows_bucket{le="+Inf"}'] >= 1
    assert samples["bertkit_tokens_total"] > 0 and samples["bertkit_queue_seconds_count"] >= 1
    assert "bertkit_tokens_per_second" in samples and "bertkit_forward_seconds_sum" in samples
    schema = r["/openapi.json"].json()
    assert schema["openapi"].startswith("3.1") and "/v1/predict" in schema["paths"]
    item = schema["components"]["schemas"]["Input"]["oneOf"][0]
    assert item["required"] == ["text"] and item["additionalProperties"] is False
    assert set(schema["paths"]["/v1/predict"]["post"]["responses"]) == {"200", "400", "413", "422", "503", "500"}
    assert r["/docs"].json() == schema and "/openapi.json" in r["/docs in a browser"].text
    info = r["/v1/model"].json()
    assert info["kind"] == "ner" and info["labels"] == ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    assert r["/"].headers["content-type"].startswith("text/html") and "/v1/predict" in r["/"].text


def test_the_handlers_answer_without_starlette(models):
    """The handlers are Server methods answering a Reply: called directly, with a request that has only what they
    read (headers, stream(), url), they give the bytes and status of the HTTP route (and its 401 without the key)."""
    from bertkit.serve.app import Server

    class Bare:
        def __init__(self, body: bytes, headers: dict[str, str]) -> None:
            self.body, self.headers, self.url = body, headers, None

        async def stream(self):
            yield self.body

    body = json.dumps({"inputs": [{"text": "ada lovelace wrote the first program"}, {"text": 3}]}).encode()
    key = {"authorization": "Bearer k"}
    app = create_app(Engine(models["ner"]), ServeConfig(max_wait_ms=1), api_key="k")
    server = Server(Engine(models["ner"]), ServeConfig(max_wait_ms=1), api_key="k")

    async def main():
        async with client(app) as c:
            routed = await c.post("/v1/predict", content=body, headers=key)
        await server.start(warm_up=False)
        try:
            bare = [await server.answer_post("/v1/predict", server.predict, Bare(body, headers))
                    for headers in (key, {})]
        finally:
            await server.stop()
        return routed, bare

    routed, (bare, refused) = asyncio.run(main())
    assert routed.status_code == bare.status == 200 and json.loads(bare.body) == routed.json()
    assert "entities" in routed.json()[0] and list(routed.json()[1]) == ["error"]  # the second input is no text
    assert (refused.status, json.loads(refused.body)) == (401, {"error": "missing or wrong API key "
                                                                        "(Authorization: Bearer KEY)"})


def test_kind_detection_and_options(models):
    assert Engine(models["squad"]).kind == "squad"
    assert Engine(models["pretraining"]).kind == "fill-mask"
    with pytest.raises(ValueError, match="unknown task"):
        Engine(models["classify"], "translate")
    with pytest.raises(ValueError, match="not a BertForQuestionAnswering"):
        Engine(models["classify"], "squad")
    with pytest.raises(ValueError, match="max_queue must be at least 1"):
        ServeConfig(max_queue=0)


@pytest.fixture
def torch_threads():
    """Restores the process's torch thread count after a test that sets it (an Engine with `threads`)."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_forward_workers_split_the_threads_and_the_token_budget(models, torch_threads):
    """Two forward workers for the torch backend on a CPU with two threads or more (each worker thread set to its
    share), one otherwise and for ONNX; each worker's pass takes its share of --max-batch-tokens."""
    from bertkit.serve.app import Server

    engine = Engine(models["classify"], threads=4)
    assert engine.threads == 4 and engine.default_workers() == 2
    seen = []

    def in_a_thread(fn):
        thread = threading.Thread(target=lambda: (fn(), seen.append(torch.get_num_threads())))
        thread.start()
        thread.join()
        return seen.pop()

    assert in_a_thread(engine.worker_initializer(2)) == 2
    assert in_a_thread(engine.worker_initializer(3)) == 1  # 4 // 3
    assert in_a_thread(engine.worker_initializer(8)) == 1  # at least one
    assert Server(engine, ServeConfig(max_batch_tokens=1000)).batcher.workers == 2
    assert Server(engine, ServeConfig(max_batch_tokens=1000)).batcher.max_batch_tokens == 500
    told = Server(engine, ServeConfig(workers=3, max_batch_tokens=1000)).batcher
    assert (told.workers, told.max_batch_tokens) == (3, 333)
    assert Engine(models["classify"], threads=1).default_workers() == 1
    with pytest.raises(ValueError, match="workers must be at least 0"):
        ServeConfig(workers=-1)


@pytest.mark.parametrize("kind", ["classify", "squad", "embeddings"])
def test_two_workers_answer_as_predict(models, kind, torch_threads):
    """Passes running at once in two threads over one model give every answer the library gives."""
    items = inputs_for(kind, 40, seed=5)
    engine = Engine(model_dir(models, kind), None if kind in TASKS else kind, threads=2)
    app = create_app(engine, ServeConfig(max_wait_ms=2, max_batch_tokens=64, workers=2))

    async def main():
        async with client(app) as c:
            return await asyncio.gather(*[c.post("/v1/predict", json={"inputs": [x]}) for x in items])

    responses = asyncio.run(main())
    assert [r.status_code for r in responses] == [200] * len(items)
    for i, (r, ref) in enumerate(zip(responses, references(models, kind, items))):
        got = r.json()[0]
        got.pop("truncated", None)
        assert_same(got, ref, f"input {i}")


# ------------------------------------------------------------------------------------------------------------------
# A real server on 127.0.0.1
# ------------------------------------------------------------------------------------------------------------------
def test_a_real_uvicorn_server(models):
    app = make_app(models, "squad", max_wait_ms=5)
    items = inputs_for("squad", 40, seed=11)

    async def main():
        limits = httpx.Limits(max_connections=20)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=60) as c:
            responses = await asyncio.gather(*[c.post("/v1/predict", json={"inputs": [x]}) for x in items])
            return responses, await c.get("/healthz")

    with uvicorn_in_thread(app) as port:
        responses, health = asyncio.run(main())
    assert health.status_code == 200
    for r, ref in zip(responses, references(models, "squad", items)):
        got = r.json()[0]
        got.pop("truncated", None)
        assert_same(got, ref)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_finishes_the_requests_in_flight(models):
    """`bertkit serve` with a 1 s batching wait: SIGTERM arrives while six requests wait in the queue; all six
    are answered (equal to predict), then the process ends."""
    pytest.importorskip("uvicorn")
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "bertkit.cli", "serve", "--model", str(models["classify"]),
                             "--port", str(port), "--max-wait-ms", "1000", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            assert proc.poll() is None, proc.stdout.read().decode()
            time.sleep(0.1)
        texts = [f"the movie was {'very ' * i}good" for i in range(6)]
        results: list = [None] * len(texts)

        def send(i: int) -> None:
            results[i] = httpx.post(f"http://127.0.0.1:{port}/v1/predict", json={"inputs": [texts[i]]}, timeout=30)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(texts))]
        for t in threads:
            t.start()
        while time.time() < deadline:  # until all six wait in the queue for their batch
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).json()["queue_requests"] == len(texts):
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=30)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # uvicorn raises the signal again once its graceful shutdown is over, so the status says what ended it
    assert code in (0, -signal.SIGTERM), proc.stdout.read().decode()
    assert [r.status_code for r in results] == [200] * len(texts)
    for r, ref in zip(results, predict(models["classify"], "classify", texts)):
        assert_same(r.json()[0], ref)
