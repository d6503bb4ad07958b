"""`bertkit serve`: a batching inference server for a model directory, with a web page.

    engine.py    the served task split into input -> rows -> forward -> answer (the task families' own steps)
    batching.py  dynamic batching by token budget: an asyncio queue and one worker
    app.py       the routes' handlers (`Server`), limits, OpenAPI schema, the Starlette application and `serve`
    metrics.py   Prometheus text
    static/      the web page at /

Needs the `serve` extra (`pip install "bertkit[serve]"`: starlette, uvicorn; onnxruntime for --backend onnx).
"""

from bertkit.serve.app import ServeConfig, create_app, serve
from bertkit.serve.batching import Batcher, QueueFull
from bertkit.serve.engine import SERVED_KINDS, Engine, InputError, detect_kind

__all__ = ["Batcher", "Engine", "InputError", "QueueFull", "SERVED_KINDS", "ServeConfig", "create_app",
           "detect_kind", "serve"]
