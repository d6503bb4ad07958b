"""Generation in the server: a causal model (BertForCausalLM) and a T5 without a task are served as "generate",
and under concurrent requests every answer is exactly what `bertkit generate --json` prints for its prompt (greedy,
each request's own max_new_tokens), whatever prompts share a batch."""

from __future__ import annotations

import asyncio
import random

import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")

from serve_models import causal_model, sentence, t5_model  # noqa: E402

from bertkit import BertConfig  # noqa: E402
from bertkit.inference import generate  # noqa: E402
from bertkit.serve import Engine, ServeConfig, create_app  # noqa: E402
from bertkit.serve.engine import detect_kind  # noqa: E402


async def ask_all(app, requests):
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=transport, base_url="http://serve") as c:
            info = (await c.get("/v1/model")).json()
            responses = await asyncio.gather(*[c.post("/v1/predict", json=r) for r in requests])
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200]
    return info, [r.json() for r in responses]


@pytest.mark.parametrize("family", ["causal", "t5"])
def test_generations_equal_bertkit_generate_under_concurrency(family, tmp_path):
    directory = causal_model(tmp_path) if family == "causal" else t5_model(tmp_path)
    assert detect_kind(directory) == "generate"
    rng = random.Random(7)
    # prompts of many lengths (several of one length, which share a forward pass), two max_new_tokens, and one
    # prompt longer than the causal model's 40 positions (truncated, flagged)
    prompts = [sentence(rng, 1, 12) for _ in range(14)] + ["john lives in paris"] * 3 + [sentence(rng, 45, 50)]
    requests = [{"inputs": [{"text": p}], **({"max_new_tokens": 5} if i % 3 == 0 else {})}
                for i, p in enumerate(prompts)]
    requests.append({"inputs": [{"text": prompts[1]}, {"text": prompts[2]}]})  # two prompts in one request
    app = create_app(Engine(directory), ServeConfig(max_wait_ms=20))
    info, answers = asyncio.run(ask_all(app, requests))
    assert info["kind"] == "generate" and info["max_new_tokens"] == 20
    for request, answer in zip(requests, answers):
        n = request.get("max_new_tokens", 20)
        want = generate(directory, [x["text"] for x in request["inputs"]], max_new_tokens=n)
        for got, expected in zip(answer, want):
            truncated = got.pop("truncated", False)
            assert truncated == (family == "causal" and len(expected["prompt"].split()) > 40)
            assert got == expected
            assert len(got["ids"]) <= n
    assert len({tuple(a[0]["ids"]) for a in answers}) > 3  # the weights write different things for different prompts


def test_generate_requests_are_checked(tmp_path):
    app = create_app(Engine(causal_model(tmp_path)), ServeConfig(max_wait_ms=1))
    transport = httpx.ASGITransport(app=app)

    async def main():
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=transport, base_url="http://serve") as c:
                bad = [await c.post("/v1/predict", json={"inputs": ["a"], "max_new_tokens": k})
                       for k in (0, "3", 10**6)]
                missing = await c.post("/v1/predict", json={"inputs": [{"text": "a"}, {}]})
                schema = (await c.get("/openapi.json")).json()
                return bad, missing, schema

    bad, missing, schema = asyncio.run(main())
    assert [r.status_code for r in bad] == [422, 422, 422] and all("max_new_tokens" in r.json()["error"] for r in bad)
    answers = missing.json()
    assert answers[0]["prompt"] == "a" and answers[1] == {"error": "inputs[1]: field 'text' is missing"}
    assert "max_new_tokens" in schema["components"]["schemas"]["Request"]["properties"]


def test_a_model_that_is_not_causal_is_refused(tmp_path):
    from bertkit.models import BertForPreTraining
    from bertkit.tokenizers import load_tokenizer

    directory = causal_model(tmp_path)
    tokenizer = load_tokenizer(directory)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=40)
    BertForPreTraining(config).save_pretrained(tmp_path / "mlm", tokenizer=tokenizer)
    with pytest.raises(ValueError, match="causal"):
        Engine(tmp_path / "mlm", "generate")
    assert detect_kind(directory) == "generate" and detect_kind(tmp_path / "mlm") == "fill-mask"


def test_generation_is_not_exported_and_not_served_from_onnx(tmp_path):
    from bertkit.export import export_onnx

    directory = causal_model(tmp_path)
    with pytest.raises(ValueError, match="generation is not exported"):
        export_onnx(directory, tmp_path / "causal.onnx")
    with pytest.raises(ValueError, match="torch backend"):
        Engine(directory, backend="onnx", onnx_path=tmp_path / "causal.onnx")
    assert not (tmp_path / "causal.onnx").exists()
