"""Digests of the pretraining streams' batches: a guard that a faster stream makes the very same batches.

For every objective (the `bench_stream` ones, ELMo's word windows included), two corpora (WikiText-2 validation +
test as `bench_stream` prepares it, with the defaults and the vocabulary's replacement ids; and 40 small documents
cut from it, a few empty, with short lanes and chunks, whole-word masking and the default replacement ids, so that
epochs turn over within the batches), dynamic and static masking (dupe_factor 2), world sizes 1, 2 and 4 (every
rank), the SHA-256 of the first `--batches` batches (every tensor's dtype, shape and bytes, and the position after
the batch), of a stream resumed from the position after batch 10, of 2 worker processes (world sizes 1 and 2,
rank 1), and of the fixed evaluation batches (`fixed_batches`).

    python bench/stream_digest.py --out digests.json            # write them
    python bench/stream_digest.py --check digests.json          # compare; exit 1 naming every difference
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_stream import OBJECTIVES, prepared_corpus  # noqa: E402


def digest_batch(batch: dict, h) -> None:
    for key in sorted(batch):
        value = batch[key]
        h.update(key.encode())
        if isinstance(value, torch.Tensor):
            v = value.contiguous()
            h.update(f"{v.dtype}{tuple(v.shape)}".encode())
            h.update(v.numpy().tobytes() if v.dtype != torch.bfloat16 else v.view(torch.int16).numpy().tobytes())
        else:
            h.update(json.dumps(value, sort_keys=True, default=repr).encode())


class SmallDocs:
    """40 small documents cut from a corpus (5 to 16 sentences each; documents 7 and 23 empty, a few empty
    sentences), as a DocumentSource."""

    def __init__(self, corpus) -> None:
        rng = np.random.default_rng(0)
        sentences = [(ids, starts) for d in range(8) for ids, starts in zip(*corpus.document(d))]
        self.docs, k = [], 0
        for i in range(40):
            n = 0 if i in (7, 23) else int(rng.integers(5, 17))
            doc = sentences[k:k + n]
            k += n
            if i % 9 == 4 and doc:
                doc = doc[:2] + [(np.zeros(0, np.int64), np.zeros(0, bool))] + doc[2:]
            self.docs.append(([s[0] for s in doc], [s[1] for s in doc]))

    def __len__(self) -> int:
        return len(self.docs)

    def document(self, i: int):
        return self.docs[int(i)]


def streams(data_dir: Path):
    """(name, factory(rank, world, workers)) for every stream the digests cover."""
    from bertkit.data.instances import SpecialIds
    from bertkit.data.lmstream import WordWindowStream
    from bertkit.data.loader import PretrainingStream, StreamOptions
    from bertkit.data.shards import ShardedCorpus
    from bertkit.training.pretrain import random_token_ids

    corpus = ShardedCorpus(data_dir, "train")
    tok = corpus.manifest.load_tokenizer()
    special = SpecialIds(cls=tok.cls_id, sep=tok.sep_id, pad=tok.pad_id, mask=tok.mask_id)
    small = SmallDocs(corpus)
    replacement = random_token_ids(tok)
    for corpus_name, docs, T, B, extra_all, random_ids in (
            ("wt2", corpus, 128, 8, {}, replacement),
            ("small", small, 64, 4, {"lane_tokens": 256, "chunk_docs": 8, "whole_word_masking": True}, None)):
        for objective, (instances, extra) in OBJECTIVES.items():
            if instances is None:
                def elmo(rank, world, workers, docs=docs, T=T, B=B):
                    return WordWindowStream(docs, tok.cls_id, tok.sep_id, T - 1, B, seed=3, rank=rank,
                                            world_size=world)
                yield f"{corpus_name}/{objective}", elmo, False
                continue
            if instances == "xlnet":
                extra = {"reuse_len": T // 2}
            for dupe in (None, 2):
                kw = {**extra_all, **extra}
                if instances == "xlnet":
                    kw.pop("whole_word_masking", None)
                options = StreamOptions(instances=instances, max_seq_length=T,
                                        max_predictions_per_seq=round(0.15 * T), dupe_factor=dupe, **kw)

                def make(rank, world, workers, docs=docs, options=options, B=B, random_ids=random_ids):
                    return PretrainingStream(docs, options, special, tok.vocab_size, B, seed=5, rank=rank,
                                             world_size=world, random_ids=random_ids, prefetch=2 if workers else 0,
                                             workers=workers)
                yield f"{corpus_name}/{objective}/{'static' if dupe else 'dynamic'}", make, True


def run(stream, n: int, tail: int = 10) -> tuple[str, list, str]:
    """(digest of n batches, their positions, digest of the batches after the first `tail`)."""
    h, h_tail = hashlib.sha256(), hashlib.sha256()
    states = []
    it = iter(stream)
    for i in range(n):
        batch = next(it)
        digest_batch(batch, h)
        if i >= tail:
            digest_batch(batch, h_tail)
        states.append(batch["_state"])
    if hasattr(it, "close"):
        it.close()
    return h.hexdigest(), states, h_tail.hexdigest()


def compute(data_dir: Path, n: int, workers: bool = True, only: str | None = None) -> dict[str, str]:
    from bertkit.data.loader import fixed_batches

    out: dict[str, str] = {}
    for name, make, pretraining in streams(data_dir):
        if only and only not in name:
            continue
        start = time.perf_counter()
        for world in (1, 2, 4):
            for rank in range(world):
                full, states, tail = run(make(rank, world, 0), n)
                out[f"{name}/w{world}r{rank}"] = full
                resumed = make(rank, world, 0)
                resumed.load_state_dict(states[9])
                out[f"{name}/w{world}r{rank}/resume10"] = run(resumed, n - 10)[0]
                if out[f"{name}/w{world}r{rank}/resume10"] != tail:
                    print(f"INCONSISTENT: {name}/w{world}r{rank}: the resumed stream differs", flush=True)
        if pretraining:
            if workers:
                for world, rank in ((1, 0), (2, 1)):
                    out[f"{name}/w{world}r{rank}/workers2"] = run(make(rank, world, 2), n)[0]
                    if out[f"{name}/w{world}r{rank}/workers2"] != out[f"{name}/w{world}r{rank}"]:
                        print(f"INCONSISTENT: {name}/w{world}r{rank}: 2 workers differ from 0", flush=True)
            h = hashlib.sha256()
            for batch in fixed_batches(make(0, 1, 0), 40, 16):
                digest_batch(batch, h)
            out[f"{name}/fixed"] = h.hexdigest()
        print(f"{name}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="a prepared data directory (default: bench_stream's WikiText-2)")
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--out")
    parser.add_argument("--check")
    parser.add_argument("--only", help="streams whose name contains this")
    parser.add_argument("--no-workers", action="store_true")
    args = parser.parse_args()
    digests = compute(prepared_corpus(args.data), args.batches, not args.no_workers, args.only)
    if args.out:
        Path(args.out).write_text(json.dumps(digests, indent=1, sort_keys=True))
    if args.check:
        expected = json.loads(Path(args.check).read_text())
        bad = [k for k in digests if expected.get(k) != digests[k]]
        for k in bad:
            print(f"DIFFERS: {k}")
        print(f"{len(digests) - len(bad)} of {len(digests)} digests equal", flush=True)
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
