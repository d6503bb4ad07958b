"""How close are `bertkit serve --quantize int8`'s sentence vectors to fp32's, and how much faster is its forward
pass? The all-MiniLM-L6-v2 sentence-transformers directory served both ways (the serving engine itself: its
tokeniser, unpadded forward pass, pooling and normalisation, int8 calibrated on the package's own sentences), on
held-out texts: every STS-B dev sentence and the serving benchmark's SST-2 and WikiText-2 texts.

    HF_HUB_OFFLINE=1 python bench/experiments/int8_cosine.py [--data ../shared/data] [--batch 4] \
        [--keep layers.0.ffn.down,layers.1.ffn.down,layers.2.ffn.down] [--weight-bits 8|7] [--keep-dtype bf16|fp32]

--keep, --weight-bits and --keep-dtype replace the server's choices (INT8_KEEP; 8-bit weights where the CPU's
int8 kernels add in int32, bf16 for the kept layers where it has bf16 instructions). Texts go through in batches
of --batch (a batch shares its activation scale, as the server's batches do). Prints one JSON object: per text set
the minimum, 1st percentile and mean cosine and the count below 0.99; the forward pass's CPU milliseconds per
text of both (one thread, the serving benchmark's texts) and their ratio; the CPU's int8 and bf16 flags.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))

from bench_serve import DATA, cpu_flags, device_name, load_texts, minilm_dir  # noqa: E402

import bertkit.models.pooling as pooling  # noqa: E402
import bertkit.serve.engine as engine  # noqa: E402


def sts_sentences(data: Path) -> list[str]:
    path = data / "glue" / "STS-B" / "dev.tsv"
    if not path.is_file():
        raise SystemExit(f"{path}: missing (../shared/data)")
    rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()[1:]]
    return [text for row in rows for text in (row[7], row[8])]


def vectors(server: engine.Engine, texts: list[str], batch: int) -> np.ndarray:
    out = []
    for i in range(0, len(texts), batch):
        prepared = [server.prepare({"text": t}) for t in texts[i:i + batch]]
        outputs = server.forward([p.rows[0] for p in prepared])
        out += [np.asarray(p.finish([o])["embedding"]) for p, o in zip(prepared, outputs)]
    return np.stack(out)


def cpu_ms_per_text(server: engine.Engine, texts: list[str], batch: int, rounds: int = 3) -> float:
    rows = [server.prepare({"text": t}).rows[0] for t in texts]
    batches = [rows[i:i + batch] for i in range(0, len(rows), batch)]
    server.forward(batches[0])
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        for b in batches:
            server.forward(b)
        best = min(best, time.process_time() - start)
    return 1000 * best / len(texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--keep", help="comma-separated module-name suffixes left out of int8 (default: the server's)")
    parser.add_argument("--weight-bits", type=int, choices=[7, 8])
    parser.add_argument("--keep-dtype", choices=["bf16", "fp32"])
    parser.add_argument("--timing-texts", type=int, default=160, help="texts of the speed measurement (default 160)")
    args = parser.parse_args()
    if args.keep is not None:
        engine.INT8_KEEP = tuple(k for k in args.keep.split(",") if k)
    if args.weight_bits is not None:
        pooling._INT32_ACCUMULATION = args.weight_bits == 8
    if args.keep_dtype is not None:
        pooling.bf16_matmuls = lambda: args.keep_dtype == "bf16"
    torch.set_num_threads(1)
    fp32 = engine.Engine(minilm_dir(), "embeddings")
    int8 = engine.Engine(minilm_dir(), "embeddings", quantize="int8")
    record = {"experiment": "int8-cosine", "device": device_name("cpu"), "cpu_flags": cpu_flags(),
              "keep": list(engine.INT8_KEEP), "weight_bits": 8 if pooling.int32_accumulation() else 7,
              "keep_dtype": "bf16" if pooling.bf16_matmuls() else "fp32", "batch": args.batch}
    for name, texts in (("sts-b dev", sts_sentences(args.data)), ("serving benchmark", load_texts(768, 0, args.data))):
        a, b = vectors(fp32, texts, args.batch), vectors(int8, texts, args.batch)
        cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        record[name] = {"texts": len(texts), "min": round(float(cosine.min()), 4),
                        "p1": round(float(np.percentile(cosine, 1)), 4), "mean": round(float(cosine.mean()), 4),
                        "below_0.99": int((cosine < 0.99).sum())}
    texts = load_texts(args.timing_texts, 0, args.data)
    ms = {"fp32": cpu_ms_per_text(fp32, texts, args.batch), "int8": cpu_ms_per_text(int8, texts, args.batch)}
    record["forward_cpu_ms_per_text"] = {k: round(v, 2) for k, v in ms.items()}
    record["int8_forward_speedup"] = round(ms["fp32"] / ms["int8"], 2)
    print(json.dumps(record))


if __name__ == "__main__":
    main()
