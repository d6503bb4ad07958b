"""The HTTP face of the server: a Starlette (ASGI) application over an `Engine` and its `Batcher`. The routes'
handlers are methods of `Server` (the served state) and answer a `Reply`; only `create_app` knows Starlette.

Routes:
    POST /v1/predict    {"inputs": [input, ...], "top_k"?: int, "pooling"?: str, "max_new_tokens"?: int} or
                        {"inputs": input} or the input object itself -> 200 and a JSON list: per input, in order,
                        what `bertkit predict --json` prints for it (`bertkit fill-mask --json` for fill-mask,
                        `bertkit generate --json` for generate), or {"error": message} for an input
                        that cannot be answered (a missing field, a text without the mask token)
    POST /v1/embeddings, /embed (embedding models), /rerank, /v1/rerank (cross-encoders), /tokenize (every model):
                        the embedding ecosystem's shapes (OpenAI, text-embeddings-inference, Cohere/Jina), see
                        `bertkit.serve.compat`
    GET  /v1/model      the served task: kind, input fields, labels, lengths, backend
    GET  /              the web page (plain HTML and JavaScript, package data)
    GET  /healthz       {"status": "ok", ...} while the worker runs
    GET  /metrics       Prometheus text (`bertkit.serve.metrics`)
    GET  /openapi.json  the OpenAPI 3.1 schema (written here by hand, for the served kind's input fields)
    GET  /docs          that schema too; to a browser (Accept: text/html), a page that shows it

Status codes of POST /v1/predict: 400 the body is not JSON (or not UTF-8); 413 the body is larger than
`max_request_bytes` or has more than `max_inputs` inputs; 422 the JSON does not fit the schema (not an object, an
unknown field at the top or in an input, a bad top_k); 503 with Retry-After when `max_queue` requests are waiting
or the server is stopping; 500 when the forward pass failed. Every error body is {"error": message}; with an
API key (`api_key`, `bertkit serve --api-key` or BERTKIT_API_KEY), every POST route and /v1/model answer 401
unless the request carries `Authorization: Bearer KEY`.

Tokenisation runs off the event loop, in a pool of `tokenizer_threads` threads, a request's texts in one batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from importlib import resources
from typing import Any

from bertkit.config import field_with_help as _f
from bertkit.errors import needs_extra
from bertkit.serve import compat
from bertkit.serve.batching import Batcher, QueueFull
from bertkit.serve.compat import RequestError
from bertkit.serve.engine import POOLINGS, Engine, InputError, Prepared, finite
from bertkit.serve.metrics import Metrics


@dataclass(frozen=True)
class ServeConfig:
    """The server's limits and batching; `bertkit serve` has one option per field."""

    max_batch_tokens: int = _f(2048, "real tokens in the forward passes running at once, at most: each of the "
                                     "--workers passes takes an equal share (a longer single input runs alone)")
    max_wait_ms: float = _f(5.0, "how long the oldest queued request waits for a batch to fill, milliseconds")
    max_queue: int = _f(1024, "requests that may wait for a batch; more are answered 503 with Retry-After")
    max_request_bytes: int = _f(1 << 20, "largest request body in bytes; larger ones are answered 413")
    max_inputs: int = _f(256, "inputs per request at most; more are answered 413")
    shutdown_timeout: float = _f(30.0, "seconds that a shutdown (SIGTERM) waits for the requests in flight")
    tokenizer_threads: int = _f(2, "threads that tokenise requests (off the event loop, a request's texts at once)")
    workers: int = _f(0, "forward passes at once, each in its own thread with its share of --threads (0: two for "
                         "the torch backend on a CPU with two or more threads, else one)")
    window: int = _f(0, "embeddings: an input longer than the model's length sent with \"truncate\": false is "
                        "encoded as overlapping windows of this many tokens, pooled into one vector (0: refused, 413)")
    stride: int = _f(0, "--window: text tokens between window starts (0: half the window)")

    def __post_init__(self) -> None:
        for f in fields(self):
            low = 0 if f.name in ("max_wait_ms", "shutdown_timeout", "window", "stride", "workers") else 1
            if getattr(self, f.name) < low:
                raise ValueError(f"{f.name} must be at least {low}, got {getattr(self, f.name)}")


def config_fields() -> list[tuple[str, type, Any, str]]:
    """(name, type, default, help) of every ServeConfig field, for the command line."""
    kinds = {"max_wait_ms": float, "shutdown_timeout": float}
    return [(f.name, kinds.get(f.name, int), f.default, f.metadata.get("help", "")) for f in fields(ServeConfig)]


MAX_NEW_TOKENS_LIMIT = 512  # what a request may ask a generation to add at most
UNAUTHORISED = "missing or wrong API key (Authorization: Bearer KEY)"  # the 401's message


def _json_bytes(value: Any) -> bytes:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except ValueError:  # an infinite float (SQuAD 2.0 null odds without a valid span): strings for JSON
        return json.dumps(finite(value), ensure_ascii=False).encode("utf-8")


def parse_request(body: bytes, engine: Engine, config: ServeConfig) -> tuple[list[Any], dict[str, Any]]:
    """The inputs and options of a POST /v1/predict body; RequestError 400 / 413 / 422 for a bad one."""
    data = compat.json_body(body, ' {"inputs": [...]}')
    required, optional = engine.input_fields
    allowed = set(required) | set(optional)
    options: dict[str, Any] = {}
    if "inputs" in data:
        top = {"inputs", "top_k"} | ({"pooling"} if engine.kind == "embeddings" else set()) | (
            {"max_new_tokens"} if engine.kind == "generate" else set())
        unknown = sorted(set(data) - top)
        if unknown:
            raise RequestError(422, f"unknown field {unknown[0]!r}; a request has {', '.join(sorted(top))}")
        items = data["inputs"]
        if isinstance(items, (dict, str)):
            items = [items]
        if not isinstance(items, list):
            raise RequestError(422, f"'inputs' must be a list of input objects, got a {type(items).__name__}")
        if compat.positive(data, "top_k") is not None:
            options["top_k"] = data["top_k"]
        if data.get("max_new_tokens") is not None:
            k = data["max_new_tokens"]
            if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_NEW_TOKENS_LIMIT:
                raise RequestError(422, f"'max_new_tokens' must be an integer from 1 to {MAX_NEW_TOKENS_LIMIT}, "
                                        f"got {k!r}")
            options["max_new_tokens"] = k
        if data.get("pooling") is not None:
            if data["pooling"] not in POOLINGS:
                raise RequestError(422, f"'pooling' must be one of {', '.join(POOLINGS)}, got {data['pooling']!r}")
            options["pooling"] = data["pooling"]
    else:
        items = [data]  # the body is one input object
    if len(items) > config.max_inputs:
        raise RequestError(413, f"{len(items)} inputs in one request; at most {config.max_inputs}")
    for i, item in enumerate(items):
        if isinstance(item, dict):
            unknown = sorted(set(item) - allowed)
            if unknown:
                where = f"inputs[{i}]" if "inputs" in data else "the input"
                raise RequestError(422, f"{where}: unknown field {unknown[0]!r}; a {engine.kind} input has "
                                        f"{', '.join(required + optional)}")
    return items, options


DRAIN_BYTES = 8 << 20  # a body past the limit is read and dropped up to this much more, so its client hears the 413


async def read_body(request, limit: int) -> bytes:
    """The request body, or RequestError 413 when it has more than `limit` bytes (by Content-Length or streamed).

    Nothing past the limit is kept; it is read and dropped (up to DRAIN_BYTES more), because a client still
    sending its body to a server that answered and closed the connection sees a broken connection, not the 413.
    A body larger still is answered at once, and the connection closes."""
    declared = request.headers.get("content-length")
    declared = int(declared) if declared is not None and declared.isdigit() else None
    if declared is not None and declared > limit + DRAIN_BYTES:
        raise RequestError(413, f"the body has {declared} bytes; at most {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit + DRAIN_BYTES:
            break
        if size <= limit:
            chunks.append(chunk)
    if size > limit:
        raise RequestError(413, f"the body has {declared} bytes; at most {limit}" if declared is not None
                           else f"the body has more than {limit} bytes")
    return b"".join(chunks)


def openapi_schema(engine: Engine, config: ServeConfig) -> dict[str, Any]:
    """The OpenAPI 3.1 description of the routes, with the served kind's input object."""
    required, optional = engine.input_fields
    props: dict[str, Any] = {}
    for name in required + optional:
        props[name] = ({"type": "array", "items": {"type": "string"}, "minItems": 1} if name == "choices"
                       else {"type": "string"})
    input_schema = {"type": "object", "properties": props, "required": list(required), "additionalProperties": False}
    if "text" in required:
        input_schema = {"oneOf": [input_schema, {"type": "string", "description": "the text alone"}]}
    request_props: dict[str, Any] = {
        "inputs": {"oneOf": [{"type": "array", "items": {"$ref": "#/components/schemas/Input"},
                              "maxItems": config.max_inputs}, {"$ref": "#/components/schemas/Input"}]},
        "top_k": {"type": "integer", "minimum": 1,
                  "description": "labels (classify), n-best answers (squad), candidates (fill-mask)"}}
    if engine.kind == "embeddings":
        request_props["pooling"] = {"type": "string", "enum": list(POOLINGS)}
    if engine.kind == "generate":
        request_props["max_new_tokens"] = {"type": "integer", "minimum": 1, "maximum": MAX_NEW_TOKENS_LIMIT,
                                           "description": "tokens a generation adds at most (default 20)"}
    error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": f"bertkit serve: {engine.kind} ({engine.model_dir.name})", "version": "1",
                 "description": "Answers are what `bertkit predict --json` prints for each input, in order; an "
                                "input that cannot be answered gets {\"error\": message} in its place. An input "
                                "longer than the model's sequence length is truncated as `predict` truncates it "
                                "and its answer carries \"truncated\": true."},
        "paths": {
            "/v1/predict": {"post": {
                "summary": "Predict for one or more inputs (batched with concurrent requests)",
                "requestBody": {"required": True, "content": {"application/json": {"schema": {"oneOf": [
                    {"$ref": "#/components/schemas/Request"}, {"$ref": "#/components/schemas/Input"}]}}}},
                "responses": {
                    "200": {"description": "one answer per input, in order",
                            "content": {"application/json": {"schema": {"type": "array", "items": {"oneOf": [
                                {"$ref": "#/components/schemas/Answer"},
                                {"$ref": "#/components/schemas/Error"}]}}}}},
                    "400": {"description": "the body is not JSON", **error},
                    "413": {"description": f"more than {config.max_request_bytes} bytes or {config.max_inputs} "
                                           f"inputs", **error},
                    "422": {"description": "the JSON does not fit the schema (an unknown field, say)", **error},
                    "503": {"description": "the queue is full or the server is stopping; see Retry-After",
                            "headers": {"Retry-After": {"schema": {"type": "integer"}}}, **error},
                    "500": {"description": "the forward pass failed", **error}}}},
            **compat.openapi_paths(engine.kind, config.max_inputs, error),
            "/v1/model": {"get": {"summary": "The served task", "responses": {"200": {"description": "kind, input "
                                  "fields, labels, lengths, backend"}}}},
            "/healthz": {"get": {"summary": "Liveness", "responses": {"200": {"description": "the worker runs"}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {
                "description": "text exposition format 0.0.4", "content": {"text/plain": {}}}}}},
            "/": {"get": {"summary": "The web page", "responses": {"200": {"description": "HTML"}}}},
            "/openapi.json": {"get": {"summary": "This schema", "responses": {"200": {"description": "JSON"}}}},
            "/docs": {"get": {"summary": "This schema; a page showing it to a browser",
                              "responses": {"200": {"description": "JSON, or HTML for Accept: text/html"}}}},
        },
        "components": {"schemas": {
            "Input": input_schema,
            "Request": {"type": "object", "properties": request_props, "required": ["inputs"],
                        "additionalProperties": False},
            "Answer": {"type": "object", "description": "what `bertkit predict --json` prints for the input"},
            "Error": {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]},
        }},
    }


DOCS_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>bertkit serve: API</title>
<style>body{font:15px/1.45 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}
pre{background:#f5f5f4;padding:1rem;overflow:auto;border-radius:6px}</style></head>
<body><h1>bertkit serve: API</h1><p>The OpenAPI 3.1 schema, also at <a href="/openapi.json">/openapi.json</a>;
the web page is at <a href="/">/</a>.</p><div id="paths"></div><pre id="schema">loading...</pre>
<script>
fetch("/openapi.json").then(r => r.json()).then(s => {
  const list = document.createElement("ul");
  for (const [path, ops] of Object.entries(s.paths))
    for (const [verb, op] of Object.entries(ops)) {
      const li = document.createElement("li");
      li.textContent = verb.toUpperCase() + " " + path + ": " + (op.summary || "");
      list.appendChild(li);
    }
  document.getElementById("paths").appendChild(list);
  document.getElementById("schema").textContent = JSON.stringify(s, null, 2);
});
</script></body></html>
"""


@dataclass
class Reply:
    """What a handler answers, whatever the ASGI stack: the body's bytes, the status, the media type, headers."""

    body: bytes
    status: int = 200
    media_type: str = "application/json"
    headers: dict[str, str] | None = None


def json_reply(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
    return Reply(_json_bytes(value), status, "application/json", headers)


def error_reply(status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
    return json_reply({"error": message}, status, headers)


HTML = "text/html; charset=utf-8"


def _window(engine: Engine, config: ServeConfig) -> tuple[int, int] | None:
    """--window and --stride as (tokens, stride) for an embedding model (None: long inputs refused); ValueError
    when the window leaves no room for text, is longer than the model's length, or strides past its text."""
    if not config.window or engine.kind != "embeddings":
        return None
    room = config.window - engine.tokenizer.num_special_tokens()
    if room < 1 or config.window > engine.max_length or config.stride > room:
        raise ValueError(f"--window {config.window} must leave room for text and be at most the model's "
                         f"{engine.max_length} tokens, and --stride {config.stride} at most its {room} text tokens")
    return config.window, config.stride or max(room // 2, 1)


def _first_error(answers: list[dict[str, Any]], status: int = 422) -> None:
    """RequestError for the first answer that is an error object: 413 for an input over the model's length."""
    for answer in answers:
        if "error" in answer:
            raise RequestError(413 if "more than" in answer["error"] and "tokens" in answer["error"]
                               else status, answer["error"])


class Server:
    """The served state (engine, batcher, metrics, the tokeniser pool, the fixed answers) and the routes'
    handlers as its methods: each takes the request (Starlette's, or anything with its `headers`, `stream()`
    and `url`) and returns a Reply. `create_app` puts them on Starlette's routes."""

    def __init__(self, engine: Engine, config: ServeConfig, api_key: str | None = None) -> None:
        self.engine, self.config = engine, config
        self.metrics = Metrics()
        workers = config.workers or engine.default_workers()
        # Each worker's pass runs on its share of the threads, so its share of the tokens keeps a pass as long as
        # one pass on every thread: the latency of a request stays that of one pass of the whole budget.
        self.batcher = Batcher(engine.forward, max_batch_tokens=max(1, config.max_batch_tokens // workers),
                               max_wait_ms=config.max_wait_ms, max_queue=config.max_queue, workers=workers,
                               initializer=engine.worker_initializer(workers), on_batch=self.metrics.batch)
        self.metrics.gauges = self.gauges
        self.page = resources.files("bertkit.serve").joinpath("static/index.html").read_bytes()
        self.schema = openapi_schema(engine, config)
        self.description = engine.describe()
        self.window = _window(engine, config)
        self.expected_auth = None if not api_key else f"Bearer {api_key}".encode("utf-8")
        self.tokenizers: ThreadPoolExecutor | None = None  # the lifespan's pool (a restarted app gets a fresh one)
        self.posts = {"/v1/predict": self.predict, "/v1/embeddings": self.openai_embeddings, "/embed": self.embed,
                      "/rerank": self.rerank, "/v1/rerank": self.rerank, "/tokenize": self.tokenize}
        self.gets = {"/v1/model": self.model, "/healthz": self.healthz, "/metrics": self.metrics_text,
                     "/openapi.json": self.openapi, "/docs": self.docs, "/": self.index}

    # ---- life cycle ------------------------------------------------------------------------------------------
    async def start(self, warm_up: bool = True) -> None:
        """Warm the engine up (the first forward pass pays one-time set-up costs, not the first caller), start the
        batching worker and the tokeniser pool."""
        if warm_up:
            await asyncio.get_running_loop().run_in_executor(None, self.engine.warm_up)
        self.tokenizers = ThreadPoolExecutor(self.config.tokenizer_threads, thread_name_prefix="bertkit-tokenize")
        self.batcher.start()

    async def stop(self) -> None:
        """Stop the worker (every queued row still runs), then the tokeniser pool."""
        try:
            await self.batcher.stop()
        finally:
            if self.tokenizers is not None:
                self.tokenizers.shutdown(wait=False)
                self.tokenizers = None

    def gauges(self) -> dict[str, float]:
        batcher = self.batcher
        return {"queue_requests": batcher.queued_requests, "queue_tokens": batcher.queued_tokens,
                "in_flight_requests": batcher.in_flight, "tokens_per_second": batcher.tokens_per_second}

    # ---- what every route shares -----------------------------------------------------------------------------
    def authorised(self, request) -> bool:
        if self.expected_auth is None:
            return True
        return hmac.compare_digest(request.headers.get("authorization", "").encode("utf-8"), self.expected_auth)

    async def answer_post(self, path: str, handler, request) -> Reply:
        """A POST route's reply: its RequestError becomes its error object, any other failure a 500; counted."""
        start = time.perf_counter()
        try:
            if not self.authorised(request):
                raise RequestError(401, UNAUTHORISED, {"WWW-Authenticate": "Bearer"})
            reply = await handler(request)
        except RequestError as err:
            reply = error_reply(err.status, err.message, err.headers)
        except Exception as err:  # never a crash: the request fails, the server stays
            reply = error_reply(500, f"{type(err).__name__}: {err}")
        self.metrics.request(path, reply.status, time.perf_counter() - start)
        return reply

    async def answer_get(self, path: str, handler, request) -> Reply:
        reply = await handler(request)
        self.metrics.request(path, reply.status)
        return reply

    async def off_loop(self, function, *args):
        """Run a tokenising function in the tokeniser pool, so the event loop keeps serving."""
        if self.tokenizers is None:  # a handler called without the lifespan (a test's direct call)
            self.tokenizers = ThreadPoolExecutor(self.config.tokenizer_threads, thread_name_prefix="bertkit-tokenize")
        return await asyncio.get_running_loop().run_in_executor(self.tokenizers, function, *args)

    async def body(self, request) -> dict[str, Any]:
        return compat.json_body(await read_body(request, self.config.max_request_bytes))

    async def run(self, prepared: list[Prepared | str]) -> list[dict[str, Any]]:
        """The prepared inputs' answers (their rows batched with other requests'), or {"error"} in place."""
        rows = [row for p in prepared if isinstance(p, Prepared) for row in p.rows]
        try:
            outputs = await self.batcher.submit(rows) if rows else []
        except QueueFull as err:
            raise RequestError(503, str(err), {"Retry-After": str(err.retry_after)}) from None
        answers, at = [], 0
        for p in prepared:
            if isinstance(p, str):
                answers.append({"error": p})
                continue
            mine, at = outputs[at:at + len(p.rows)], at + len(p.rows)
            try:
                answers.append(p.finish(mine))
            except InputError as err:
                answers.append({"error": str(err)})
            except Exception as err:  # the family could not post-process this input: its own error object
                answers.append({"error": f"{type(err).__name__}: {err}"})
        for a in answers:
            self.metrics.inputs["error" if "error" in a else "ok"] += 1
        return answers

    def prepare_items(self, items: list[Any], options: dict[str, Any]) -> list[Prepared | str]:
        prepared: list[Prepared | str] = []
        for i, item in enumerate(items):
            try:
                prepared.append(self.engine.prepare(item, i, **options))
            except InputError as err:
                prepared.append(str(err))
        return prepared

    def needs(self, kind: str, path: str) -> None:
        """RequestError 404 when the served kind is not the one `path` answers for."""
        if self.engine.kind != kind:
            what = {"embeddings": "an embedding model", "rerank": "a cross-encoder (bertkit finetune rerank)"}[kind]
            raise RequestError(404, f"{path} needs {what}; this server serves {self.engine.kind} (POST /v1/predict)")

    # ---- POST routes -----------------------------------------------------------------------------------------
    async def predict(self, request) -> Reply:
        items, options = parse_request(await read_body(request, self.config.max_request_bytes), self.engine,
                                       self.config)
        return json_reply(await self.run(await self.off_loop(self.prepare_items, items, options)))

    async def openai_embeddings(self, request) -> Reply:
        self.needs("embeddings", "/v1/embeddings")
        engine = self.engine
        texts, options = compat.parse_openai_embeddings(await self.body(request), self.config.max_inputs,
                                                        self.description["dimension"], engine.sentence.prompts)
        prepared = await self.off_loop(engine.prepare_texts, texts, None, None, options["truncate"], self.window)
        answers = await self.run(prepared)
        _first_error(answers)
        counts = [sum(len(r) for r in p.rows) for p in prepared if isinstance(p, Prepared)]
        return json_reply(compat.openai_embeddings_response(
            [a["embedding"] for a in answers], counts, options["model"] or engine.model_dir.name,
            options["encoding_format"], options["dimensions"], engine.sentence.normalize))

    async def embed(self, request) -> Reply:
        self.needs("embeddings", "/embed")
        texts, options = compat.parse_embed(await self.body(request), self.config.max_inputs,
                                            self.engine.sentence.prompts)
        prepared = await self.off_loop(self.engine.prepare_texts, texts, None, options["normalize"],
                                       options["truncate"], self.window)
        answers = await self.run(prepared)
        _first_error(answers)
        return json_reply([a["embedding"] for a in answers])

    async def rerank(self, request) -> Reply:
        self.needs("rerank", request.url.path)
        query, documents, options = compat.parse_rerank(await self.body(request), self.config.max_inputs)
        prepared = await self.off_loop(self.engine.prepare_rerank, query, documents, options["truncate"])
        answers = await self.run(prepared)
        _first_error(answers)
        tokens = sum(len(r) for p in prepared if isinstance(p, Prepared) for r in p.rows)
        return json_reply(compat.rerank_response(documents, answers, options,
                                                 options["model"] or self.engine.model_dir.name, tokens))

    async def tokenize(self, request) -> Reply:
        texts, special = compat.parse_tokenize(await self.body(request), self.config.max_inputs)
        return json_reply(await self.off_loop(self.engine.tokenize, texts, special))

    # ---- GET routes ------------------------------------------------------------------------------------------
    async def model(self, request) -> Reply:
        if not self.authorised(request):
            return error_reply(401, UNAUTHORISED, {"WWW-Authenticate": "Bearer"})
        return json_reply(self.description)

    async def healthz(self, request) -> Reply:
        running = self.batcher.running
        return json_reply({"status": "ok" if running else "stopped", "kind": self.engine.kind,
                           "queue_requests": self.batcher.queued_requests,
                           "in_flight_requests": self.batcher.in_flight}, 200 if running else 503)

    async def metrics_text(self, request) -> Reply:
        return Reply(self.metrics.render().encode("utf-8"),
                     media_type="text/plain; version=0.0.4; charset=utf-8")

    async def index(self, request) -> Reply:
        return Reply(self.page, media_type=HTML)

    async def docs(self, request) -> Reply:
        # A browser (which asks for HTML) gets the page; a program (curl, httpx: */*) the schema itself.
        if "text/html" in request.headers.get("accept", ""):
            return Reply(DOCS_PAGE.encode("utf-8"), media_type=HTML)
        return json_reply(self.schema)

    async def openapi(self, request) -> Reply:
        return json_reply(self.schema)


def create_app(engine: Engine, config: ServeConfig | None = None, *, warm_up: bool = True,
               api_key: str | None = None):
    """The Starlette application serving `engine` with `config`'s limits (a `Server`'s handlers on its routes);
    its lifespan starts and stops the batching worker (stop: every queued row still runs). api_key: required as a
    bearer token on POST routes and /v1/model."""
    try:  # the `serve` extra, imported here only
        from starlette.applications import Starlette
        from starlette.responses import Response
        from starlette.routing import Route
    except ModuleNotFoundError as err:
        raise needs_extra(err, "bertkit serve needs starlette and uvicorn") from None

    server = Server(engine, config or ServeConfig(), api_key)

    def route(path: str, handler, answer, method: str) -> Route:
        async def endpoint(request) -> Response:
            reply = await answer(path, handler, request)
            return Response(reply.body, reply.status, reply.headers, reply.media_type)
        return Route(path, endpoint, methods=[method])

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await server.start(warm_up)
        try:
            yield
        finally:
            await server.stop()

    routes = ([route(path, handler, server.answer_post, "POST") for path, handler in server.posts.items()]
              + [route(path, handler, server.answer_get, "GET") for path, handler in server.gets.items()])
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.server = server
    app.state.engine, app.state.batcher, app.state.metrics, app.state.config = (
        engine, server.batcher, server.metrics, server.config)
    return app


def serve(model_dir, *, host: str = "127.0.0.1", port: int = 8080, kind: str | None = None,
          backend: str = "torch", onnx_path=None, config: ServeConfig | None = None, max_seq_length: int | None = None,
          top_k: int | None = None, pooling: str | None = None, device: str = "cpu", threads: int | None = None,
          log_level: str = "info", dtype: str = "auto", quantize: str | None = None,
          api_key: str | None = None, words: str | None = None) -> None:
    """Load the model directory and serve it with uvicorn until SIGINT / SIGTERM (which finish the requests in
    flight first, for up to `config.shutdown_timeout` seconds)."""
    try:
        import uvicorn
    except ModuleNotFoundError as err:
        raise needs_extra(err, "bertkit serve needs starlette and uvicorn") from None

    config = config or ServeConfig()
    engine = Engine(model_dir, kind, backend=backend, onnx_path=onnx_path, max_seq_length=max_seq_length,
                    top_k=top_k, pooling=pooling, device=device, threads=threads, dtype=dtype, quantize=quantize,
                    words=words)
    app = create_app(engine, config, api_key=api_key)
    print(f"serving {engine.kind} from {model_dir} ({engine.backend_name}) on http://{host}:{port}/", flush=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=config.shutdown_timeout)
