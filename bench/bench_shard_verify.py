"""What verifying prepared shards costs: opening (index files checked), `--verify` (every file checked) and the
lazy check of each shard's token files before its first use, against reading the corpus once.

Writes synthetic shards shaped like those of a corpus of `--text-gb` GB of raw text (about 4 bytes of text per
token: uint16 ids, 20 tokens per sentence, 5 sentences per document, 16M-token shards) into a temporary folder,
then prints one JSON object of timings. The files are in the page cache when measured (just written), which is
how a run that follows `prepare` finds them; a cold read adds the disk's time for the same bytes to every column.

    python bench/bench_shard_verify.py --text-gb 1
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from bertkit.data.manifest import FORMAT_NAME, FORMAT_VERSION, MANIFEST, SHARD_FILES, shard_name
from bertkit.data.shards import ShardedCorpus


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def write_synthetic(root: Path, tokens_total: int, shard_tokens: int = 2 ** 24, seed: int = 0) -> dict:
    """A prepared directory of `tokens_total` random uint16 ids in shards of `shard_tokens`; returns its manifest."""
    rng = np.random.default_rng(seed)
    split = root / "train"
    split.mkdir(parents=True)
    shards = []
    for index, start in enumerate(range(0, tokens_total, shard_tokens)):
        n = min(shard_tokens, tokens_total - start)
        n -= n % 100  # whole documents of 5 sentences of 20 tokens
        sentences = np.arange(0, n + 1, 20, dtype=np.int64)
        documents = np.arange(0, len(sentences), 5, dtype=np.int64)
        payloads = {"tokens.bin": rng.integers(5, 30000, n, dtype=np.uint16).tobytes(),
                    "sentences.npy": _npy(sentences), "documents.npy": _npy(documents),
                    "wordstarts.bin": np.packbits(rng.random(n) < 0.7).tobytes()}
        name = shard_name(index)
        files = {}
        for suffix in SHARD_FILES:
            (split / f"{name}.{suffix}").write_bytes(payloads[suffix])
            files[suffix] = {"sha256": hashlib.sha256(payloads[suffix]).hexdigest(), "bytes": len(payloads[suffix])}
        shards.append({"name": name, "documents": len(documents) - 1, "sentences": len(sentences) - 1, "tokens": n,
                       "dropped_documents": 0, "dropped_sentences": 0, "files": files})
    totals = {k: sum(s[k] for s in shards) for k in ("documents", "sentences", "tokens")}
    manifest = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION,
                "tokenizer": {"dir": "tokenizer", "kind": "wordpiece", "vocab_hash": "synthetic", "vocab_size": 30522},
                "dtype": "uint16", "options": {}, "streams": {}, "skipped": {},
                "splits": {"train": {**totals, "dropped_documents": 0, "dropped_sentences": 0, "shards": shards}}}
    (root / MANIFEST).write_text(json.dumps(manifest))
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text-gb", type=float, default=1.0, help="size of the raw-text corpus modelled (GB)")
    parser.add_argument("--dir", help="where to write the shards (default: a temporary folder, removed after)")
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="bertkit-verify-"))
    try:
        manifest = write_synthetic(root / "data", int(args.text_gb * 1e9 / 4))
        data = root / "data"
        sizes = {suffix: sum(s["files"][suffix]["bytes"] for s in manifest["splits"]["train"]["shards"])
                 for suffix in SHARD_FILES}

        def timed(fn):
            start = time.perf_counter()
            value = fn()
            return time.perf_counter() - start, value

        open_s, corpus = timed(lambda: ShardedCorpus(data, "train"))
        firsts = [int(corpus._doc_offsets[i]) for i in range(len(corpus._shards))]
        lazy_s, _ = timed(lambda: [corpus.document(i) for i in firsts])  # hashes each shard's token files
        again_s, _ = timed(lambda: [corpus.document(i) for i in firsts])  # verified now: plain reads
        verify_s, _ = timed(lambda: ShardedCorpus(data, "train", verify=True))
        read_s, n = timed(lambda: sum(len(ids) for ids in corpus.token_stream()))  # one pass over the corpus
        total = sum(sizes.values())
        print(json.dumps({
            "text_gb_modelled": args.text_gb, "tokens": corpus.num_tokens, "shards": len(corpus._shards),
            "bytes": sizes, "bytes_total": total,
            "open_s (index files hashed, counts checked)": round(open_s, 3),
            "first_use_s (token files hashed, all shards)": round(lazy_s - again_s, 3),
            "verify_s (--verify: every file hashed at open)": round(verify_s, 3),
            "read_corpus_once_s (token_stream, no hashing)": round(read_s, 3),
            # --verify hashes the index files twice (at open, then with the rest): bytes hashed / time.
            "sha256_GB_per_s": round((total + sizes["sentences.npy"] + sizes["documents.npy"]) / 1e9 / verify_s, 2),
        }, indent=2))
        assert n == corpus.num_tokens
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
