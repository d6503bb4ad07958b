"""Benchmark: `bertkit prepare` from a Parquet corpus, against the same corpus as text and against `datasets.map`.

A corpus is generated (documents of sentences drawn from a fixed word list by a seeded generator) and written twice,
streamed so that generating a large one holds little memory: `corpus.txt` (Google's format: a sentence per line,
a blank line between documents) and `corpus.parquet` (a row per document, its sentences joined by newlines, row
groups of 4096 rows). Three sides then run, each in a fresh process so that its peak RSS is its own:

  parquet   bertkit's `prepare()` on corpus.parquet (pyarrow record batches -> WordPiece -> shards + checksums)
  text      bertkit's `prepare()` on corpus.txt (the same documents; the shards are byte-identical)
  datasets  the peer a user would run on the same Parquet file: `datasets.load_dataset("parquet", ...)` and
            `.map(tokenizer(batch["text"]), batched=True, batch_size=1000)` with transformers' fast
            BertTokenizer on the same vocabulary, its Arrow cache in a temporary directory

Token rates use bertkit's token count (WordPiece pieces, no special tokens) for every side, so their ratio is the
time ratio; the peer's own count (with [CLS]/[SEP] per row) is reported beside it. Prints one JSON line with the
load average before and after (the machine may be shared: say so beside any figure).

    python bench/bench_prepare_parquet.py                    # ~8 MB of text: about a minute on a quiet 2-core VM
    python bench/bench_prepare_parquet.py --size-mb 4096     # the multi-GB run (disk: about 3x the size)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there been one all we their has would when if so no will more about can said out "
         "river mountain language history science village music theory station century republic museum library "
         "chemistry football election painter railway harbour festival manuscript telescope cathedral").split()


def generate(root: Path, size_mb: float, seed: int = 0) -> dict:
    """corpus.txt and corpus.parquet with the same documents, about `size_mb` MB of text, written in chunks."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    words = np.array(WORDS)
    target = int(size_mb * 2 ** 20)
    written = documents = 0
    schema = pa.schema([("text", pa.string())])
    with open(root / "corpus.txt", "w", encoding="utf-8") as text, \
            pq.ParquetWriter(root / "corpus.parquet", schema) as parquet:
        while written < target:
            rows = []
            for _ in range(4096):
                sentences = []
                for _ in range(int(rng.integers(2, 9))):
                    picked = words[rng.integers(0, len(words), int(rng.integers(6, 25)))]
                    sentences.append(" ".join(picked).capitalize() + ".")
                rows.append("\n".join(sentences))
            chunk = "".join(("\n" if documents or i else "") + r + "\n" for i, r in enumerate(rows))
            text.write(chunk)
            written += len(chunk.encode("utf-8"))
            documents += len(rows)
            parquet.write_table(pa.table({"text": rows}, schema=schema), row_group_size=4096)
    return {"text_bytes": os.path.getsize(root / "corpus.txt"),
            "parquet_bytes": os.path.getsize(root / "corpus.parquet"), "documents": documents}


def train_vocab(root: Path) -> Path:
    """A small WordPiece vocabulary trained in-process on the word list (the same file for every side)."""
    sys.path.insert(0, str(ROOT / "src"))
    from bertkit.tokenizers import WordPieceTokenizer

    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))]
    tokenizer = WordPieceTokenizer.train(texts=texts, vocab_size=400, min_frequency=1, show_progress=False)
    tokenizer.save(root / "tok")
    return root / "tok" / "vocab.txt"


# ---- one side, in its own process ----------------------------------------------------------------------------
def side(name: str, root: Path, vocab: Path) -> dict:
    if name in ("parquet", "text"):
        sys.path.insert(0, str(ROOT / "src"))
        from bertkit.data.prepare import prepare
        from bertkit.tokenizers import WordPieceTokenizer

        tokenizer = WordPieceTokenizer.from_vocab(vocab, lowercase=True)
        start = time.perf_counter()
        manifest = prepare(root / f"corpus.{'parquet' if name == 'parquet' else 'txt'}", tokenizer,
                           root / f"out-{name}", progress=False)
        elapsed = time.perf_counter() - start
        out = {"s": elapsed, "tokens": int(manifest.split("train")["tokens"])}
    else:
        import datasets
        from transformers import BertTokenizerFast

        datasets.disable_progress_bars()
        tokenizer = BertTokenizerFast(vocab_file=str(vocab), do_lower_case=True)
        start = time.perf_counter()
        data = datasets.load_dataset("parquet", data_files=str(root / "corpus.parquet"), split="train",
                                     cache_dir=str(root / "hf-cache"))
        mapped = data.map(lambda batch: tokenizer(batch["text"], return_special_tokens_mask=True), batched=True,
                          batch_size=1000, remove_columns=["text"],
                          cache_file_name=str(root / "hf-cache" / "map.arrow"))
        elapsed = time.perf_counter() - start
        lengths = mapped.with_format("arrow")["input_ids"]
        out = {"s": elapsed, "peer_tokens": int(sum(len(x) for x in lengths.to_pylist()))}
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=8.0, help="text size of the generated corpus (default 8)")
    parser.add_argument("--dir", type=Path, help="where to write the corpus and outputs (default: a temporary one)")
    parser.add_argument("--side", help=argparse.SUPPRESS)  # internal: run one side in this process
    args = parser.parse_args(argv)
    if args.side:
        print(json.dumps(side(args.side, args.dir, args.dir / "tok" / "vocab.txt")))
        return 0
    for module in ("pyarrow", "datasets", "transformers"):
        try:
            __import__(module)
        except ImportError:
            print(f"bench_prepare_parquet: skipped, {module} is not installed", file=sys.stderr)
            return 0
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        load_before = os.getloadavg()
        corpus = generate(root, args.size_mb)
        train_vocab(root)
        results = {}
        for name in ("parquet", "text", "datasets"):
            run = subprocess.run([sys.executable, __file__, "--side", name, "--dir", str(root)],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                raise SystemExit(f"bench_prepare_parquet: the {name} side failed:\n{run.stderr[-3000:]}")
            results[name] = json.loads(run.stdout.strip().splitlines()[-1])
        a = sorted((root / "out-parquet" / "train").glob("shard_*"))
        b = sorted((root / "out-text" / "train").glob("shard_*"))
        identical = [p.name for p in a] == [p.name for p in b] and all(
            x.read_bytes() == y.read_bytes() for x, y in zip(a, b) if x.suffix != ".json")
        tokens = results["parquet"]["tokens"]
        line = {"bench": "prepare_parquet", **corpus, "tokens": tokens, "shards_identical": identical,
                "peer_tokens": results["datasets"]["peer_tokens"],
                **{f"{k}_s": round(v["s"], 3) for k, v in results.items()},
                **{f"{k}_tokens_per_s": round(tokens / v["s"]) for k, v in results.items()},
                **{f"{k}_peak_rss_mb": v["peak_rss_mb"] for k, v in results.items()},
                "load_before": [round(x, 2) for x in load_before],
                "load_after": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
