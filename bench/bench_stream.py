"""Benchmark: the pretraining stream alone (no model), real tokens per second, per objective.

What a training process asks of its data: bertkit's `PretrainingStream` (and ELMo's `WordWindowStream`) on a
prepared corpus (WikiText-2 validation + test by default, BERT's uncased vocabulary), micro-batches of B rows of
T tokens (BERT-base's 256 x 128 by default). Each measurement is a fresh stream (seed = the repeat's number)
consumed for `--batches` batches from its first request on (the first batch, when each lane makes its first
chunk, included: rows made ahead are not free); CPU seconds (`time.process_time` of the consuming process, plus
its worker processes' once they are reaped) beside wall seconds. Measurements are repeated `--repeats` times,
interleaved (every figure of a repeat before the next repeat), and each figure is the median of its repeats, so a
burst of load on a shared machine moves one repeat of each figure rather than decide one figure:

  * `tokens_per_s` (wall) and `tokens_per_cpu_s` per objective and worker count: 0 workers is the stream in the
    consuming process (one core's worth of work: the figure per process), W workers are W DataLoader processes;
  * `world_ratio`: rank 0's cost per real token of its own rows (CPU seconds, in-process) at world size 1 over its
    cost at world size 8, same B per rank, each repeat a pair measured back to back (in alternating order, same
    seed), the median of the pairs' ratios: 1.0 when a rank's work is proportional to its own batch, 1/8 when
    every rank builds the whole global batch; `world_ratio_wall` the same from wall seconds.

ELECTRA, the causal LM and ModernBERT's MLM read the packed rows (full-sentences; `isolate_documents` keeps
attention within each document), BERT and RoBERTa's segment pairs the NSP rows, so their figures are those rows'.
Prints one JSON line per figure, with the machine and the load average beside it.

    python bench/bench_stream.py [--data DIR] [--objectives nsp spans ...] [--batch-size 256] [--seq-len 128]
                                 [--workers 1] [--worlds 1 8] [--repeats 5] [--batches 40] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also when imported (stream_digest.py)
from common import _cpu_model  # noqa: E402

SHARED = Path(os.environ.get("BERTKIT_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
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


def make_stream(data_dir: Path, objective: str, batch: int, seq_len: int, rank: int, world: int, workers: int,
                seed: int = 0):
    from bertkit.data.instances import SpecialIds
    from bertkit.data.lmstream import WordWindowStream
    from bertkit.data.loader import PretrainingStream, StreamOptions
    from bertkit.data.shards import ShardedCorpus

    corpus = ShardedCorpus(data_dir, "train")
    tok = corpus.manifest.load_tokenizer()
    instances, extra = OBJECTIVES[objective]
    if instances is None:
        return WordWindowStream(corpus, tok.cls_id, tok.sep_id, seq_len - 1, batch, seed=seed, rank=rank,
                                world_size=world)
    if instances == "xlnet":
        extra = {"reuse_len": seq_len // 2}
    options = StreamOptions(instances=instances, max_seq_length=seq_len,
                            max_predictions_per_seq=round(0.15 * seq_len), **extra)
    special = SpecialIds(cls=tok.cls_id, sep=tok.sep_id, pad=tok.pad_id, mask=tok.mask_id)
    kwargs = {"workers": workers} if workers else {}
    # In-process without a prefetch thread: the consuming process's CPU seconds are the stream's work alone
    return PretrainingStream(corpus, options, special, tok.vocab_size, batch, seed=seed, rank=rank,
                             world_size=world, prefetch=4 if workers else 0, **kwargs)


def measure(stream, batches: int) -> dict:
    """Real tokens, wall seconds and CPU seconds (this process and its reaped children) of the first `batches`
    batches, from the first request on."""
    it = iter(stream)
    cpu, children = time.process_time(), _children_cpu()
    start = time.perf_counter()
    tokens = 0
    for _ in range(batches):
        tokens += int(next(it)["attention_mask"].ne(0).sum())
    wall = time.perf_counter() - start
    if hasattr(it, "close"):
        it.close()  # worker processes end (and are reaped) here, so their CPU time is counted below
    used = time.process_time() - cpu + _children_cpu() - children
    return {"tokens": tokens, "wall_s": wall, "cpu_s": used}


def summary(runs: list[dict]) -> dict:
    """Medians (and extremes) of the rates of repeated measurements."""
    wall = [r["tokens"] / r["wall_s"] for r in runs]
    cpu = [r["tokens"] / max(r["cpu_s"], 1e-9) for r in runs]
    return {"tokens_per_s": round(statistics.median(wall)), "tokens_per_cpu_s": round(statistics.median(cpu)),
            "tokens_per_s_range": [round(min(wall)), round(max(wall))],
            "tokens_per_cpu_s_range": [round(min(cpu)), round(max(cpu))], "repeats": len(runs),
            "batches": runs[0]["batches"]}


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
    parser.add_argument("--workers", type=int, nargs="*", default=[1], help="worker counts to measure beside 0")
    parser.add_argument("--worlds", type=int, nargs=2, default=[1, 8], metavar=("ONE", "MANY"),
                        help="the two world sizes whose rank-0 cost per token `world_ratio` compares")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats per figure (the median is kept)")
    parser.add_argument("--batches", type=int, default=40,
                        help="batches per measurement: past the rows a lane makes at a time (2048 tokens)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: B 16, nsp and spans, 2 repeats")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch_size, args.objectives, args.workers, args.repeats, args.batches = 16, ["nsp", "spans"], [1], 2, 8
    if args.repeats < 1 or args.batches < 1:
        parser.error("--repeats and --batches must be at least 1")
    torch.set_num_threads(1)  # one core's worth of work per process
    data_dir = prepared_corpus(args.data)
    common = {"batch_size": args.batch_size, "seq_len": args.seq_len, "cpu": _cpu_model(), "torch": torch.__version__}
    one, many = args.worlds
    for objective in args.objectives:
        counts = [0] + sorted({w for w in args.workers if w > 0} if OBJECTIVES[objective][0] else set())
        rates: dict[int, list[dict]] = {w: [] for w in counts}
        pairs: list[tuple[dict, dict]] = []
        loads = [load()]
        for repeat in range(args.repeats):
            for workers in counts:
                run = measure(make_stream(data_dir, objective, args.batch_size, args.seq_len, 0, 1, workers, repeat),
                              args.batches)
                rates[workers].append({**run, "batches": args.batches})
            # rank 0 at the two world sizes, back to back, in alternating order (a drift of the load favours neither)
            order = (one, many) if repeat % 2 == 0 else (many, one)
            pair = {w: measure(make_stream(data_dir, objective, args.batch_size, args.seq_len, 0, w, 0, repeat),
                               args.batches) for w in order}
            pairs.append((pair[one], pair[many]))
            loads.append(load())
        for workers in counts:
            print(json.dumps({"bench": "stream", "objective": objective, "workers": workers,
                              **summary(rates[workers]), **common, "load_average": loads[-1],
                              "load_average_start": loads[0]}), flush=True)
        cost = lambda r: r["cpu_s"] / r["tokens"]  # noqa: E731  (CPU seconds per real token of rank 0's rows)
        wall = lambda r: r["wall_s"] / r["tokens"]  # noqa: E731
        ratios = [cost(a) / cost(b) for a, b in pairs]
        print(json.dumps({"bench": "stream", "objective": objective, "world_ratio": round(statistics.median(ratios), 3),
                          "world_ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
                          "world_ratio_wall": round(statistics.median([wall(a) / wall(b) for a, b in pairs]), 3),
                          "world_sizes": [one, many], "repeats": len(pairs), "batches": args.batches,
                          "ns_per_token": {str(one): round(1e9 * statistics.median(cost(a) for a, _ in pairs), 1),
                                           str(many): round(1e9 * statistics.median(cost(b) for _, b in pairs), 1)},
                          **common, "load_average": loads[-1], "load_average_start": loads[0]}), flush=True)


if __name__ == "__main__":
    main()
