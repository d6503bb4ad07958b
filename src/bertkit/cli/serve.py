"""`bertkit serve` (HTTP, batched) and `bertkit export onnx`."""

from __future__ import annotations

import argparse
import json
import os

from bertkit.cli.options import add_config_options, add_words_option, given_fields
from bertkit.export import OPSET, export_onnx
from bertkit.serve import ServeConfig, serve
from bertkit.serve.app import config_fields
from bertkit.serve.engine import POOLINGS, SERVED_KINDS


def cmd_serve(args: argparse.Namespace) -> None:
    config = ServeConfig(**given_fields(args, config_fields()))
    serve(args.model, host=args.host, port=args.port, kind=args.task, backend=args.backend, onnx_path=args.onnx,
          config=config, max_seq_length=args.max_seq_length, top_k=args.top_k, pooling=args.pooling,
          device=args.device, threads=args.threads, log_level=args.log_level, dtype=args.dtype,
          quantize=args.quantize, api_key=args.api_key, words=args.words)


def cmd_export_onnx(args: argparse.Namespace) -> None:
    print(json.dumps(export_onnx(args.model, args.out, kind=args.task, opset=args.opset, check=not args.no_check)))


def add_serve(verbs, help_text: str) -> None:
    """Serve a model directory's task (its head's: classify, ner, squad, swag; fill-mask for a pretraining
    checkpoint; generate for a causal model or a T5 without a task; else embeddings) on an ASGI server (Starlette +
    uvicorn): POST /v1/predict takes {"inputs": [...]} whose items are the JSON Lines objects `bertkit predict
    --input` reads and answers what `bertkit predict --json` prints for each; concurrent requests share forward
    passes of at most --max-batch-tokens real tokens. A web page at /, the OpenAPI schema at /docs, /healthz,
    /metrics (Prometheus). SIGTERM finishes the requests in flight, then stops."""
    srv = verbs.add_parser("serve", help=help_text, description=add_serve.__doc__)
    srv.add_argument("--model", required=True, help="model directory")
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    srv.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    srv.add_argument("--task", choices=SERVED_KINDS, help="what to serve (default: from the directory's head)")
    srv.add_argument("--backend", choices=["torch", "onnx"], default="torch",
                     help="torch (bertkit's unpadded path, default) or onnx (a graph from `bertkit export onnx`)")
    srv.add_argument("--onnx", help="the ONNX file for --backend onnx (default MODEL/model.onnx)")
    srv.add_argument("--max-seq-length", type=int, help="tokens per input (default: as fine-tuned; longer inputs "
                                                        "are truncated and flagged \"truncated\": true)")
    srv.add_argument("--top-k", type=int, help="labels (classify), n-best answers (squad) or candidates (fill-mask) "
                                               "per input, unless a request says (default: all labels, 5, 5)")
    srv.add_argument("--pooling", choices=POOLINGS,
                     help="embeddings: the default pooling (default: the directory's sentence-transformers pooling, "
                          "else mean); none: every token's vector")
    srv.add_argument("--device", default="cpu", help="torch device (default cpu)")
    srv.add_argument("--threads", type=int, help="threads in all: torch's split between the forward workers (--workers), "
                                               "onnxruntime's per pass (default: torch's / onnxruntime's)")
    srv.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                     help="uvicorn's log level (default info)")
    # embedding and reranking models: precision and access
    emb = srv.add_argument_group("precision and access")
    emb.add_argument("--dtype", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
                     help="weights' type: auto = bf16 (else fp16) on a GPU, fp32 on a CPU")
    emb.add_argument("--quantize", choices=["int8"],
                     help="CPU: dynamic int8 quantisation of every Linear layer (faster; see docs for its cosine)")
    emb.add_argument("--api-key", default=os.environ.get("BERTKIT_API_KEY"),
                     help="require `Authorization: Bearer KEY` on the API routes (default: $BERTKIT_API_KEY, none)")
    add_config_options(srv.add_argument_group("batching and limits (ServeConfig)"), config_fields())
    add_words_option(srv)
    srv.set_defaults(func=cmd_serve)


def add_export(verbs, help_text: str) -> None:
    """Write the ONNX graph (opset 18 by default) of the model directory's head (as `bertkit serve` would serve it,
    or --task) with dynamic batch and sequence axes, then check onnxruntime against bertkit (within 1e-4) on rows of
    different lengths. `bertkit serve --backend onnx` runs it."""
    export = verbs.add_parser("export", help=help_text,
                              description="Write a model directory's served head in another format.")
    formats = export.add_subparsers(dest="format", metavar="FORMAT", required=True)
    onnx = formats.add_parser("onnx", help="ONNX graph with dynamic batch and sequence axes",
                              description=add_export.__doc__)
    onnx.add_argument("--model", required=True, help="model directory")
    onnx.add_argument("--out", required=True, help="the .onnx file to write")
    onnx.add_argument("--task", choices=SERVED_KINDS, help="which head (default: the directory's)")
    onnx.add_argument("--opset", type=int, default=OPSET, help=f"ONNX opset (default {OPSET})")
    onnx.add_argument("--no-check", action="store_true", help="skip the onnxruntime check")
    onnx.set_defaults(func=cmd_export_onnx)


PARSERS = {"serve": add_serve, "export": add_export}
