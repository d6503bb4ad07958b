"""The embedding ecosystem's request and response shapes, so its clients talk to `bertkit serve` unchanged.

    POST /v1/embeddings   OpenAI: {"input": text | [text, ...], "model"?, "encoding_format"?: "float" | "base64",
                          "dimensions"?, "user"?, "input_type"?: "query" | "document", "truncate"?: true} ->
                          {"object": "list", "data": [{"object": "embedding", "index",
                          "embedding": [floats] | base64 of little-endian float32}], "model", "usage":
                          {"prompt_tokens", "total_tokens"}}; vectors as the model directory pools them
                          (sentence-transformers' `encode`); `dimensions` keeps the first ones (renormalised when
                          the model normalises); `input_type` puts the model's prompt of that name first;
                          `truncate` false with `bertkit serve --window`: a long input as overlapping windows
    POST /embed           text-embeddings-inference: {"inputs": text | [text, ...], "normalize"?: true,
                          "truncate"?: false, "prompt_name"?} -> [[floats], ...]; an input longer than the model's
                          length without truncate: 413
    POST /rerank          {"query", "texts": [...]} (text-embeddings-inference) -> [{"index", "score", "text"?}]
                          sorted by score; or {"query", "documents": [...], "top_n"?} (Cohere, Jina) ->
                          {"model", "results": [{"index", "relevance_score", "document"?}], "usage"}; scores are
                          `bertkit predict rerank`'s (sigmoid of the cross-encoder's logit; raw_scores: the logit)
    POST /tokenize        {"inputs": text | [text, ...], "add_special_tokens"?: true} -> per text
                          [{"id", "text", "special", "start", "stop"}, ...]

Bad requests get the error object of /v1/predict, {"error": message}, with its status codes (400 not JSON, 413
too large, 422 not the schema). Parsers here are pure: bytes in, (what to run, options) out, `RequestError` out.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

ENCODING_FORMATS = ("float", "base64")


class RequestError(Exception):
    """A request answered with an error status and {"error": message}."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def json_body(body: bytes, shape: str = "") -> dict[str, Any]:
    """The body as a JSON object; RequestError 400 (not UTF-8, not JSON) or 422 (not an object; `shape`, e.g.
    ' {"inputs": [...]}', is named in that message)."""
    try:
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise RequestError(400, f"the body is not UTF-8: {err.reason} at byte {err.start}") from None
    except json.JSONDecodeError as err:
        raise RequestError(400, f"malformed JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    if not isinstance(data, dict):
        raise RequestError(422, f"expected a JSON object{shape}, got a {type(data).__name__}")
    return data


def _fields(data: dict, allowed: set[str], required: tuple[str, ...] = ()) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise RequestError(422, f"unknown field {unknown[0]!r}; a request has {', '.join(sorted(allowed))}")
    for name in required:
        if data.get(name) is None:
            raise RequestError(422, f"field {name!r} is missing")


def _texts(value: Any, name: str, max_inputs: int) -> list[str]:
    """A text or a non-empty list of texts; RequestError 422 (anything else), 413 (more than max_inputs)."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise RequestError(422, f"'{name}' must be a string or a non-empty list of strings")
    if len(value) > max_inputs:
        raise RequestError(413, f"{len(value)} inputs in one request; at most {max_inputs}")
    for i, text in enumerate(value):
        if not isinstance(text, str):
            kind = "token ids (send the text)" if isinstance(text, (int, list)) else type(text).__name__
            raise RequestError(422, f"'{name}'[{i}] must be a string, got {kind}")
    return value


def _flag(data: dict, name: str, default: bool) -> bool:
    value = data.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(422, f"'{name}' must be true or false, got {value!r}")
    return value


def positive(data: dict, name: str) -> int | None:
    """The positive integer field `name` of a request (None when absent); RequestError 422 otherwise."""
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestError(422, f"'{name}' must be a positive integer, got {value!r}")
    return value


INPUT_TYPES = ("query", "document")


def parse_openai_embeddings(data: dict, max_inputs: int, dimension: int,
                            prompts: dict[str, str] | None = None) -> tuple[list[str], dict[str, Any]]:
    """(texts with their prompt, {"encoding_format", "dimensions", "model", "truncate"}) of an OpenAI embeddings
    request. `input_type` ("query" or "document") puts the model's prompt of that name before every input (none
    when the model has no such prompt); `truncate` false asks for windows instead of a cut (default true)."""
    _fields(data, {"input", "model", "encoding_format", "dimensions", "user", "input_type", "truncate"}, ("input",))
    texts = _texts(data["input"], "input", max_inputs)
    kind = data.get("input_type")
    if kind is not None:
        if kind not in INPUT_TYPES:
            raise RequestError(422, f"'input_type' must be query or document, got {kind!r}")
        prompt = (prompts or {}).get(kind, "")
        texts = [prompt + t for t in texts]
    encoding = data.get("encoding_format") or "float"
    if encoding not in ENCODING_FORMATS:
        raise RequestError(422, f"'encoding_format' must be float or base64, got {encoding!r}")
    dimensions = positive(data, "dimensions")
    if dimensions is not None and dimensions > dimension:
        raise RequestError(422, f"'dimensions' {dimensions} is more than the model's {dimension}")
    if data.get("model") is not None and not isinstance(data["model"], str):
        raise RequestError(422, f"'model' must be a string, got {data['model']!r}")
    return texts, {"encoding_format": encoding, "dimensions": dimensions, "model": data.get("model"),
                   "truncate": _flag(data, "truncate", True)}


def openai_embeddings_response(vectors: list[np.ndarray], token_counts: list[int], model: str, encoding: str,
                               dimensions: int | None, normalized: bool) -> dict[str, Any]:
    """OpenAI's response object for the vectors (float32), in input order."""
    data = []
    for i, v in enumerate(vectors):
        v = np.asarray(v, dtype=np.float32)
        if dimensions is not None:
            v = v[:dimensions]
            if normalized:  # a shortened unit vector is made a unit vector again, as OpenAI's are
                v = v / max(float(np.linalg.norm(v)), 1e-12)
        embedding: Any = (base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") if encoding == "base64"
                          else v.tolist())
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    tokens = int(sum(token_counts))
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def parse_embed(data: dict, max_inputs: int, prompts: dict[str, str]) -> tuple[list[str], dict[str, Any]]:
    """(texts with their prompt, {"normalize", "truncate"}) of a text-embeddings-inference /embed request."""
    _fields(data, {"inputs", "normalize", "truncate", "truncation_direction", "prompt_name"}, ("inputs",))
    texts = _texts(data["inputs"], "inputs", max_inputs)
    direction = data.get("truncation_direction")
    if direction is not None and str(direction).lower() != "right":
        raise RequestError(422, f"'truncation_direction' {direction!r} is not supported; inputs are cut on the right")
    name = data.get("prompt_name")
    if name is not None:
        if name not in prompts:
            raise RequestError(422, f"unknown prompt_name {name!r}; the model has "
                                    f"{', '.join(sorted(prompts)) or 'no prompts'}")
        texts = [prompts[name] + t for t in texts]
    return texts, {"normalize": _flag(data, "normalize", True), "truncate": _flag(data, "truncate", False)}


def parse_rerank(data: dict, max_inputs: int) -> tuple[str, list[str], dict[str, Any]]:
    """(query, documents, options) of a rerank request in text-embeddings-inference's shape ("texts") or
    Cohere's and Jina's ("documents", "top_n"); options: style ("tei" / "cohere"), top_n, raw_scores,
    return_text, truncate, model."""
    _fields(data, {"query", "texts", "documents", "top_n", "raw_scores", "return_text", "return_documents",
                   "truncate", "truncation_direction", "model"}, ("query",))
    if not isinstance(data["query"], str):
        raise RequestError(422, f"'query' must be a string, got {type(data['query']).__name__}")
    if ("texts" in data) == ("documents" in data):
        raise RequestError(422, "give the documents to rank as 'texts' or as 'documents' (one of them)")
    style = "tei" if "texts" in data else "cohere"
    raw = data["texts"] if style == "tei" else data["documents"]
    if isinstance(raw, list) and style == "cohere":  # Cohere also takes {"text": ...} objects
        raw = [d.get("text") if isinstance(d, dict) else d for d in raw]
    documents = _texts(raw, "texts" if style == "tei" else "documents", max_inputs)
    if isinstance(data.get("texts" if style == "tei" else "documents"), str):
        raise RequestError(422, "the documents must be a list of strings")
    options = {"style": style, "top_n": positive(data, "top_n"), "raw_scores": _flag(data, "raw_scores", False),
               "return_text": _flag(data, "return_text" if style == "tei" else "return_documents", False),
               "truncate": _flag(data, "truncate", True), "model": data.get("model")}
    return data["query"], documents, options


def rerank_response(query_documents: list[str], answers: list[dict[str, Any]], options: dict[str, Any],
                    model: str, tokens: int) -> Any:
    """The ranking in the request's style: highest score first (ties: input order), top_n of them."""
    key = "logit" if options["raw_scores"] else "score"
    order = sorted(range(len(answers)), key=lambda i: -answers[i][key])[:options["top_n"] or len(answers)]
    if options["style"] == "tei":
        return [{"index": i, "score": answers[i][key], **({"text": query_documents[i]} if options["return_text"]
                                                          else {})} for i in order]
    results = [{"index": i, "relevance_score": answers[i][key],
                **({"document": {"text": query_documents[i]}} if options["return_text"] else {})} for i in order]
    return {"model": model, "results": results, "usage": {"total_tokens": tokens}}


def parse_tokenize(data: dict, max_inputs: int) -> tuple[list[str], bool]:
    """(texts, add_special_tokens) of a /tokenize request."""
    _fields(data, {"inputs", "add_special_tokens", "prompt_name"}, ("inputs",))
    if data.get("prompt_name") is not None:
        raise RequestError(422, "'prompt_name' is not supported by /tokenize; send the prompt in the text")
    return _texts(data["inputs"], "inputs", max_inputs), _flag(data, "add_special_tokens", True)


# ---- OpenAPI ------------------------------------------------------------------------------------------------------
_TEXTS = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]}


def _post(summary: str, required: str, properties: dict[str, Any], answer: str, errors: dict) -> dict[str, Any]:
    """One POST route's OpenAPI item: a JSON object body of `properties` (`required` among them), no other field."""
    return {"post": {"summary": summary, "requestBody": {"required": True, "content": {"application/json": {
        "schema": {"type": "object", "required": [required], "additionalProperties": False,
                   "properties": properties}}}},
        "responses": {"200": {"description": answer}, **errors}}}


def openapi_paths(kind: str, max_inputs: int, error: dict) -> dict[str, Any]:
    """The OpenAPI path items of the routes this kind serves (/tokenize always)."""
    errors = {"400": {"description": "the body is not JSON", **error},
              "413": {"description": f"more than {max_inputs} inputs, or too large", **error},
              "422": {"description": "the JSON does not fit the schema", **error}}
    texts = {**_TEXTS, "maxItems": max_inputs}
    paths: dict[str, Any] = {"/tokenize": _post(
        "The tokens of texts (text-embeddings-inference's /tokenize)", "inputs",
        {"inputs": texts, "add_special_tokens": {"type": "boolean", "default": True}},
        "per text, its tokens {id, text, special, start, stop}", errors)}
    if kind == "embeddings":
        paths["/v1/embeddings"] = _post(
            "OpenAI-compatible embeddings, pooled as the model directory says", "input",
            {"input": texts, "model": {"type": "string"},
             "encoding_format": {"type": "string", "enum": list(ENCODING_FORMATS)},
             "dimensions": {"type": "integer", "minimum": 1}, "user": {"type": "string"},
             "input_type": {"type": "string", "enum": list(INPUT_TYPES)}, "truncate": {"type": "boolean",
                                                                                    "default": True}},
            "{object: list, data: [{object: embedding, index, embedding}], model, usage: {prompt_tokens, "
            "total_tokens}}", errors)
        paths["/embed"] = _post(
            "text-embeddings-inference's /embed", "inputs",
            {"inputs": texts, "normalize": {"type": "boolean", "default": True},
             "truncate": {"type": "boolean", "default": False},
             "truncation_direction": {"type": "string", "enum": ["right", "Right"]}, "prompt_name": {"type": "string"}},
            "one vector per input", errors)
    if kind == "rerank":
        paths["/rerank"] = paths["/v1/rerank"] = _post(
            "Rank documents for a query with the cross-encoder ('texts': text-embeddings-inference's answer; "
            "'documents': Cohere's and Jina's)", "query",
            {"query": {"type": "string"}, "texts": texts, "documents": texts,
             "top_n": {"type": "integer", "minimum": 1}, "raw_scores": {"type": "boolean"},
             "return_text": {"type": "boolean"}, "return_documents": {"type": "boolean"},
             "truncate": {"type": "boolean", "default": True}, "model": {"type": "string"}},
            "documents by decreasing score", errors)
    return paths
