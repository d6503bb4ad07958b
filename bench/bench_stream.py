"""Benchmark: the pretraining stream alone (no model), real tokens per second, per objective.

What a training process asks of its data: bertkit's `PretrainingStream` (and ELMo's `WordWindowStream`) on a
prepared corpus (WikiText-2 validation + test by default, BERT's uncased vocabulary), micro-batches of B rows of
T tokens (BERT-base's 256 x 128 by default). Each figure is measured in one process that consumes batches for
at least `--seconds` and `--min-batches` from its first request on (the first batch, when each lane makes its
first chunk, included; its time is also reported apart as `first_batch_s`):

  * `tokens_per_s` per objective and worker count: 0 workers is the stream in the consuming process (one core's
    worth of work, the figure per worker process), W workers are W DataLoader processes; `tokens_per_cpu_s`
    divides by the CPU seconds of the consuming process and its workers (steadier than wall time under load);
  * `world_ratio`: rank 0's rate at world size 8 over world size 1, same B per rank (1.0 when a rank's work is
    proportional to its own batch; 1/8 when every rank builds the whole global batch).

ELECTRA and the causal LM read the MLM streams (bert's and roberta's rows), so their figures are those rows'.
Prints one JSON line per figure, with the machine and the load average beside it.

    python bench/bench_stream.py [--data DIR] [--objectives nsp full-sentences ...] [--batch-size 256]
                                 [--seq-len 128] [--workers 1 2] [--seconds 5] [--worlds 1 2 8] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("BERTKIT_SHARED_DATA", "/work/shared/data"))
# objective name -> (StreamOptions.instances, extra options); ELMo's word windows are their own stream
OBJECTIVES = {
    "nsp": ("nsp", {}),  # bert (MLM + NSP), roberta-segment-pair, electra on bert rows
    "sop": ("sop", {}),  # albert
    "sentence-pair": ("sentence-pair", {}),  # roberta-sentence-pair
    "full-sentences": ("full-sentences", {}),  # roberta, electra, causal
    "full-sentences-isolated": ("full-sentences", {"isolate_documents": True}),
    "doc-sentences": ("doc-sentences", {}),  # roberta-doc
    "spans": ("spans", {"first_sentinel_id": 99, "sentinels": 99}),  # t5 (sentinels: [unused] ids)
    "xlnet": ("xlnet", {}),
    "elmo": (None, {}),
}


def prepared_corpus(data: str | None) -> Path:
    """A prepared data directory: `data`, or WikiText-2 prepared once into a temporary directory."""
    if data:
        return Path(data)
    out = Path(tempfile.gettempdir()) / "bertkit-bench-stream-wt2"
    if not (out / "manifest.json").is_file():
        raw = SHARED / "wikitext-2"
        subprocess.run([sys.executable, "-m", "bertkit.cli", "prepare", "--corpus", str(raw / "wiki.valid.raw"),
                        str(raw / "wiki.test.raw"), "--format", "wikitext", "--tokenizer",
                        str(SHARED / "vocab" / "bert-base-uncased-vocab.txt"), "--out", str(out), "--quiet"],
                       check=True, stdout=subprocess.DEVNULL)
    return out


def make_stream(data_dir: Path, objective: str, batch: int, seq_len: int, rank: int, world: int, workers: int):
    from bertkit.data.instances import SpecialIds
    from bertkit.data.lmstream import WordWindowStream
    from bertkit.data.loader import PretrainingStream, StreamOptions
    from bertkit.data.shards import ShardedCorpus

    corpus = ShardedCorpus(data_dir, "train")
    tok = corpus.manifest.load_tokenizer()
    instances, extra = OBJECTIVES[objective]
    if instances is None:
        return WordWindowStream(corpus, tok.cls_id, tok.sep_id, seq_len - 1, batch, rank=rank, world_size=world)
    if instances == "xlnet":
        extra = {"reuse_len": seq_len // 2}
    options = StreamOptions(instances=instances, max_seq_length=seq_len,
                            max_predictions_per_seq=round(0.15 * seq_len), **extra)
    special = SpecialIds(cls=tok.cls_id, sep=tok.sep_id, pad=tok.pad_id, mask=tok.mask_id)
    kwargs = {"workers": workers} if workers else {}
    return PretrainingStream(corpus, options, special, tok.vocab_size, batch, rank=rank, world_size=world,
                             prefetch=4 if workers else 0, **kwargs)


def measure(stream, seconds: float, min_batches: int) -> dict:
    """Real tokens per second from the first request on (the first batch, when every lane makes its first chunk,
    included: rows made ahead are not counted as free), over at least `seconds` and `min_batches` batches; the
    first batch's seconds apart."""
    batches = iter(stream)
    cpu, children = time.process_time(), _children_cpu()
    start = time.perf_counter()
    tokens = int(next(batches)["attention_mask"].ne(0).sum())
    first = time.perf_counter() - start
    n = 1
    while time.perf_counter() - start < seconds or n < min_batches:
        tokens += int(next(batches)["attention_mask"].ne(0).sum())
        n += 1
    elapsed = time.perf_counter() - start
    if hasattr(batches, "close"):
        batches.close()  # worker processes end (and are reaped) here, so their CPU time is counted below
    main, workers = time.process_time() - cpu, _children_cpu() - children
    # CPU seconds as well as wall seconds: on a shared machine the wall rate moves with the load, the work per
    # token much less (worker figures include the batches made ahead and the workers' start)
    return {"first_batch_s": round(first, 3), "tokens_per_s": round(tokens / elapsed), "batches": n,
            "cpu_s_main": round(main, 3), "cpu_s_workers": round(workers, 3),
            "tokens_per_cpu_s": round(tokens / max(main + workers, 1e-9))}


def _children_cpu() -> float:
    """CPU seconds of this process's ended (reaped) children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="a prepared data directory (default: WikiText-2, prepared once)")
    parser.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=list(OBJECTIVES))
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts to measure beside 0")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 8])
    parser.add_argument("--min-batches", type=int, default=40,
                        help="batches per figure at least: past the rows a lane makes at a time (2048 tokens)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: B 16, 1 s, nsp and spans only")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch_size, args.seconds, args.objectives, args.workers = 16, 1.0, ["nsp", "spans"], [1]
        args.min_batches = 4
    data_dir = prepared_corpus(args.data)
    common = {"batch_size": args.batch_size, "seq_len": args.seq_len, "cpu": platform.processor() or
              platform.machine(), "torch": torch.__version__}
    try:
        from bench.common import _cpu_model
    except ImportError:
        from common import _cpu_model
    common["cpu"] = _cpu_model()
    for objective in args.objectives:
        for workers in sorted({0, *args.workers}):
            if workers and OBJECTIVES[objective][0] is None:
                continue  # ELMo's word windows have no worker path
            figure = measure(make_stream(data_dir, objective, args.batch_size, args.seq_len, 0, 1, workers),
                             args.seconds, args.min_batches)
            print(json.dumps({"bench": "stream", "objective": objective, "workers": workers, **figure, **common,
                              "load_average": load()}), flush=True)
        rates = {}
        for world in args.worlds:
            figure = measure(make_stream(data_dir, objective, args.batch_size, args.seq_len, 0, world, 0),
                             args.seconds, args.min_batches)
            rates[world] = figure["tokens_per_s"]
            print(json.dumps({"bench": "stream", "objective": objective, "world_size": world, "rank": 0,
                              **figure, **common, "load_average": load()}), flush=True)
        if 1 in rates and max(args.worlds) > 1:
            top = max(args.worlds)
            print(json.dumps({"bench": "stream", "objective": objective, "world_ratio": round(rates[top] / rates[1], 3),
                              "world_sizes": [1, top], **common, "load_average": load()}), flush=True)


if __name__ == "__main__":
    main()
